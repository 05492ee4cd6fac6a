package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/dltest"
	"github.com/plugbus/plugbus/internal/dlview"
	"github.com/plugbus/plugbus/internal/testenv"
	"github.com/plugbus/plugbus/transports/memory"
	"github.com/plugbus/plugbus/transports/transporttest"
)

// cli runs plugbus with args, returning what it wrote.
func cli(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errw bytes.Buffer
	err := run(t.Context(), args, stdio{out: &out, err: &errw})
	if errw.Len() > 0 {
		t.Logf("stderr of %v: %s", args, errw.String())
	}
	return out.String(), err
}

func TestDLQCommandsOnRabbitMQ(t *testing.T) {
	url := testenv.RabbitMQ(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	ep, exchange := transporttest.Name("cli-dlq"), transporttest.Name("cli-dlq-x")
	tr := dltest.RabbitMQ(ctx, t, url, exchange, ep, "shop.order")
	ids := dltest.Make(ctx, t, tr, ep,
		dltest.Message{Name: "shop.order", Body: `{"order":1}`, Reason: "boom: card declined"},
		dltest.Message{Name: "shop.order", Body: `{"order":2}`, Reason: "timeout"},
		dltest.Message{Name: "shop.refund", Body: `{"order":3}`, Reason: "BOOM again"})
	conn := []string{"-rabbitmq", url, "-exchange", exchange, "-endpoint", ep}
	cmd := func(name string, more ...string) []string {
		return append(append([]string{"dlq", name}, conn...), more...)
	}

	out, err := cli(t, cmd("list", "-o", "json")...)
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	var listed []dlview.DeadLetter
	if err := json.Unmarshal([]byte(out), &listed); err != nil {
		t.Fatalf("list -o json: %v\n%s", err, out)
	}
	var body bytes.Buffer
	if len(listed) == 3 {
		_ = json.Compact(&body, listed[1].Body)
	}
	if len(listed) != 3 || listed[0].MessageID != ids[0] || listed[2].Failure.Reason != "BOOM again" || body.String() != `{"order":2}` {
		t.Fatalf("list -o json: %+v", listed)
	}
	out, err = cli(t, cmd("list", "-error", "boom")...)
	if err != nil || !strings.Contains(out, "ID") || !strings.Contains(out, "card declined") || strings.Contains(out, "timeout") ||
		!strings.Contains(out, "2 dead letters of "+ep) {
		t.Fatalf("list -error boom (%v):\n%s", err, out)
	}
	out, err = cli(t, cmd("show", listed[0].ID)...)
	if err != nil || !strings.Contains(out, "\"order\": 1") || !strings.Contains(out, "boom: card declined") {
		t.Fatalf("show (%v):\n%s", err, out)
	}
	if _, err := cli(t, cmd("replay")...); err == nil || !strings.Contains(err.Error(), "nothing selected") {
		t.Fatalf("replay without a selection: %v, want a refusal", err)
	}
	out, err = cli(t, cmd("replay", "-dry-run", "-error", "boom")...)
	if err != nil || !strings.Contains(out, "would replay 2 dead letters") {
		t.Fatalf("replay -dry-run (%v):\n%s", err, out)
	}
	if n, err := tr.CountDeadLetters(ctx, ep); err != nil || n != 3 {
		t.Fatalf("after a dry run, %d dead letters (%v), want 3", n, err)
	}
	out, err = cli(t, cmd("replay", "-error", "boom", "-by", "tester")...)
	if err != nil || !strings.Contains(out, "replayed 2 of 2 dead letters of "+ep) {
		t.Fatalf("replay (%v):\n%s", err, out)
	}
	got := map[string]bool{}
	for range 2 {
		d, err := tr.Receive(ctx)
		if err != nil {
			t.Fatal(err)
		}
		rec, ok, err := bus.ReplayRecordOf(d.Headers)
		if !ok || err != nil || rec.By != "tester" {
			t.Errorf("replayed %s: record %+v %v %v", d.Attributes.MessageID, rec, ok, err)
		}
		got[d.Attributes.MessageID] = true
		if err := tr.Delete(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	if !got[ids[0]] || !got[ids[2]] {
		t.Errorf("replayed %v, want %s and %s", got, ids[0], ids[2])
	}
	out, err = cli(t, cmd("purge", "-all")...)
	if err != nil || !strings.Contains(out, "deleted 1 of 1") {
		t.Fatalf("purge -all (%v):\n%s", err, out)
	}
	if n, err := tr.CountDeadLetters(ctx, ep); err != nil || n != 0 {
		t.Fatalf("after purge, %d dead letters (%v)", n, err)
	}
}

func TestDLQRefusesBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"dlq"},
		{"dlq", "list"},                   // no endpoint
		{"dlq", "list", "-endpoint", "e"}, // no broker
		{"dlq", "list", "-endpoint", "e", "-since", "yesterday", "-rabbitmq", "amqp://127.0.0.1:1/"},
		{"dlq", "list", "-endpoint", "e", "-o", "yaml"},
		{"dlq", "frobnicate"},
	} {
		if _, err := cli(t, args...); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

// A bulk replay of 10,000 dead letters on a terminal shows a progress bar
// and ends with a summary.
func TestBulkReplayShowsProgressAndSummary(t *testing.T) {
	const total = 10_000
	ctx := t.Context()
	tr := memory.New()
	defer func() { _ = tr.Close(ctx) }()
	if err := tr.Setup(ctx, bus.Topology{Endpoint: "bulk", MaxAttempts: 1, Concurrency: 1}); err != nil {
		t.Fatal(err)
	}
	msgs := make([]dltest.Message, total)
	for i := range msgs {
		msgs[i] = dltest.Message{Name: "bulk.job", Body: fmt.Sprintf(`{"n":%d}`, i), Reason: "down"}
	}
	dltest.Make(ctx, t, tr, "bulk", msgs...)
	var out, errw bytes.Buffer
	err := bulk(ctx, stdio{out: &out, err: &errw, terminal: true}, tr, "replay", bus.DeadLetterFilter{Endpoint: "bulk"}, bus.Replay{By: "test"}, false, "table")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(errw.String(), "10000/10000") || !strings.Contains(errw.String(), "100%") {
		t.Errorf("no progress bar reaching 10000/10000 on the terminal:\n%.500s", errw.String())
	}
	if !strings.Contains(out.String(), "replayed 10000 of 10000 dead letters of bulk") {
		t.Errorf("summary: %q", out.String())
	}
	if n := tr.Broker().Depth("bulk"); n != total {
		t.Errorf("queue depth %d after the replay, want %d", n, total)
	}
	if n, _ := tr.CountDeadLetters(ctx, "bulk"); n != 0 {
		t.Errorf("%d dead letters left", n)
	}
	// Not on a terminal: no bar, the summary alone.
	out.Reset()
	errw.Reset()
	if err := bulk(ctx, stdio{out: &out, err: &errw}, tr, "purge", bus.DeadLetterFilter{Endpoint: "bulk"}, bus.Replay{}, false, "table"); err != nil {
		t.Fatal(err)
	}
	if errw.Len() != 0 || !strings.Contains(out.String(), "nothing to delete") {
		t.Errorf("purge of nothing, not on a terminal: stderr %q, stdout %q", errw.String(), out.String())
	}
}
