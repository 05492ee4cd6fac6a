package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/console"
	"github.com/plugbus/plugbus/internal/dltest"
	"github.com/plugbus/plugbus/internal/dlview"
	"github.com/plugbus/plugbus/internal/testenv"
	"github.com/plugbus/plugbus/transports/memory"
	"github.com/plugbus/plugbus/transports/sqs"
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
	// -connect-timeout 0 waits for the broker, which answers: it is no
	// deadline already past.
	if _, err := cli(t, cmd("list", "-connect-timeout", "0")...); err != nil {
		t.Fatalf("list -connect-timeout 0: %v", err)
	}
	if _, err := cli(t, cmd("list", "-connect-timeout", "-1s")...); err == nil || !strings.Contains(err.Error(), "-connect-timeout -1s") {
		t.Fatalf("list -connect-timeout -1s: %v, want it refused", err)
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

// replay and purge with -o json print one JSON object once they have
// acted: the IDs acted on, the counts, the IDs left and the error. They
// printed their text summary, which a script reading JSON cannot parse.
func TestDLQReplayAndPurgePrintJSON(t *testing.T) {
	url := testenv.RabbitMQ(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	ep, exchange := transporttest.Name("cli-json"), transporttest.Name("cli-json-x")
	tr := dltest.RabbitMQ(ctx, t, url, exchange, ep, "shop.order")
	msgIDs := dltest.Make(ctx, t, tr, ep,
		dltest.Message{Name: "shop.order", Body: `{"order":1}`, Reason: "boom: card declined"},
		dltest.Message{Name: "shop.order", Body: `{"order":2}`, Reason: "timeout"},
		dltest.Message{Name: "shop.order", Body: `{"order":3}`, Reason: "BOOM again"})
	dls, err := tr.ListDeadLetters(ctx, bus.DeadLetterFilter{Endpoint: ep})
	if err != nil || len(dls) != 3 {
		t.Fatalf("%d dead letters (%v), want 3", len(dls), err)
	}
	cmd := func(name string, more ...string) []string {
		return append([]string{"dlq", name, "-rabbitmq", url, "-exchange", exchange, "-endpoint", ep, "-o", "json"}, more...)
	}
	// result runs args and reads what they print, which must be one JSON
	// object and nothing else.
	result := func(args []string) (bulkResult, error) {
		t.Helper()
		out, err := cli(t, args...)
		var res bulkResult
		dec := json.NewDecoder(strings.NewReader(out))
		dec.DisallowUnknownFields()
		if derr := dec.Decode(&res); derr != nil || dec.More() {
			t.Fatalf("%v (%v): stdout is not one JSON result: %v\n%s", args[1:3], err, derr, out)
		}
		return res, err
	}

	res, err := result(cmd("replay", "-error", "boom", "-by", "tester"))
	// ids are in the order the replays were confirmed, which runs several
	// at once: any order of the two.
	slices.Sort(res.IDs)
	want := bulkResult{Command: "replay", Endpoint: ep, Selected: 2, Done: 2, IDs: slices.Sorted(slices.Values([]string{dls[0].ID, dls[2].ID})), Left: []string{}}
	if err != nil || !reflect.DeepEqual(res, want) {
		t.Fatalf("replay -o json: %v\n%+v\nwant %+v", err, res, want)
	}
	replayed := map[string]bool{}
	for range 2 {
		d, err := tr.Receive(ctx)
		if err != nil {
			t.Fatal(err)
		}
		replayed[d.Attributes.MessageID] = true
		if err := tr.Delete(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	if !replayed[msgIDs[0]] || !replayed[msgIDs[2]] {
		t.Errorf("replayed %v, want %s and %s", replayed, msgIDs[0], msgIDs[2])
	}

	// An ID that selects nothing: nothing done, the result says why.
	res, err = result(cmd("purge", dls[1].ID, "no-such-id"))
	if err == nil || res.Command != "purge" || res.Selected != 1 || res.Done != 0 || len(res.IDs) != 0 ||
		!slices.Equal(res.Left, []string{dls[1].ID}) || !slices.Equal(res.Missing, []string{"no-such-id"}) || res.Error == "" || !strings.HasSuffix(err.Error(), res.Error) {
		t.Errorf("purge of an unknown ID -o json: %v\n%+v", err, res)
	}
	if n, err := tr.CountDeadLetters(ctx, ep); err != nil || n != 1 {
		t.Fatalf("%d dead letters (%v), want 1: nothing purged", n, err)
	}

	res, err = result(cmd("purge", "-all"))
	want = bulkResult{Command: "purge", Endpoint: ep, Selected: 1, Done: 1, IDs: []string{dls[1].ID}, Left: []string{}}
	if err != nil || !reflect.DeepEqual(res, want) {
		t.Errorf("purge -all -o json: %v\n%+v\nwant %+v", err, res, want)
	}
	res, err = result(cmd("purge", "-all"))
	want = bulkResult{Command: "purge", Endpoint: ep, IDs: []string{}, Left: []string{}}
	if err != nil || !reflect.DeepEqual(res, want) {
		t.Errorf("purge -all -o json of nothing: %v\n%+v\nwant %+v", err, res, want)
	}
	if n, err := tr.CountDeadLetters(ctx, ep); err != nil || n != 0 {
		t.Errorf("after purge, %d dead letters (%v)", n, err)
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

// An -sqs-prefix that is no queue name's beginning is refused before any
// request, naming the flag: the transport hashed every name it made, and
// the command looked for queues that could not exist.
func TestDLQRefusesAnInvalidSQSPrefix(t *testing.T) {
	t.Setenv("AWS_REGION", "us-east-1")
	b := broker{sqs: true, prefix: "prod.env", sqsEndpoint: "http://127.0.0.1:1", connectTimeout: time.Second}
	tr, err := b.open(t.Context(), io.Discard)
	if err == nil {
		_ = tr.Close(context.Background())
	}
	if !errors.Is(err, sqs.ErrInvalidOption) || !strings.Contains(err.Error(), "-sqs-prefix") {
		t.Errorf("-sqs-prefix prod.env: %v; want sqs.ErrInvalidOption naming the flag", err)
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
	if n, err := tr.CountDeadLetters(ctx, "bulk"); err != nil || n != 0 {
		t.Errorf("%d dead letters left (err %v)", n, err)
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

// Flags after the IDs are flags, as in `plugbus dlq purge -endpoint e ID
// -dry-run`: read as IDs, the -dry-run was ignored and the dead letter
// purged. "--" ends the flags.
func TestDLQFlagsAfterIDs(t *testing.T) {
	d, err := parseDLQ("purge", []string{"-endpoint", "orders", "id-1", "-dry-run", "id-2", "-o", "json"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !d.dryRun || d.output != "json" || !slices.Equal(d.f.IDs, []string{"id-1", "id-2"}) {
		t.Errorf("dry run %v, output %q, IDs %q; want true, json, [id-1 id-2]", d.dryRun, d.output, d.f.IDs)
	}
	d, err = parseDLQ("show", []string{"-endpoint", "orders", "--", "-odd-id", "-o"}, io.Discard)
	if err != nil || d.output != "table" || !slices.Equal(d.f.IDs, []string{"-odd-id", "-o"}) {
		t.Errorf("after --: %v, output %q, IDs %q; want the IDs -odd-id and -o", err, d.output, d.f.IDs)
	}
}

// A replay or purge of IDs of which some are not dead letters of the
// endpoint does nothing and says which; show prints those it found and
// fails. All used to exit 0 ("nothing to replay"), a typo unnoticed.
func TestDLQUnknownIDs(t *testing.T) {
	ctx := t.Context()
	tr := memory.New()
	defer func() { _ = tr.Close(ctx) }()
	if err := tr.Setup(ctx, bus.Topology{Endpoint: "ids", MaxAttempts: 1, Concurrency: 1}); err != nil {
		t.Fatal(err)
	}
	dltest.Make(ctx, t, tr, "ids", dltest.Message{Name: "ids.job", Body: `{}`, Reason: "down"})
	dls, err := tr.ListDeadLetters(ctx, bus.DeadLetterFilter{Endpoint: "ids"})
	if err != nil || len(dls) != 1 {
		t.Fatalf("%d dead letters (%v)", len(dls), err)
	}
	known := dls[0].ID
	for _, cmd := range []string{"replay", "purge"} {
		for _, ids := range [][]string{{"no-such-id"}, {known, "no-such-id"}} {
			var out bytes.Buffer
			f := bus.DeadLetterFilter{Endpoint: "ids", IDs: ids}
			err := bulk(ctx, stdio{out: &out, err: io.Discard}, tr, cmd, f, bus.Replay{By: "test"}, false, "table")
			if err == nil || !strings.Contains(err.Error(), "no-such-id") {
				t.Errorf("%s %v: %v, want an error naming no-such-id (stdout %q)", cmd, ids, err, out.String())
			}
			if n, _ := tr.CountDeadLetters(ctx, "ids"); n != 1 {
				t.Fatalf("%s %v: %d dead letters left, want 1: nothing done", cmd, ids, n)
			}
		}
	}
	var out bytes.Buffer
	err = show(ctx, stdio{out: &out, err: io.Discard}, tr, bus.DeadLetterFilter{Endpoint: "ids", IDs: []string{known, "no-such-id"}}, "table")
	if err == nil || !strings.Contains(err.Error(), "no-such-id") || !strings.Contains(out.String(), known) {
		t.Errorf("show of a known and an unknown ID: %v, want an error naming no-such-id after showing %s:\n%s", err, known, out.String())
	}
}

// A negative -limit selected every dead letter (the filter reads only a
// limit above zero) and so passed for a selection: `purge -limit -1`
// purged the queue without -all.
func TestDLQRefusesNegativeLimit(t *testing.T) {
	for _, cmd := range []string{"list", "purge", "replay"} {
		_, err := parseDLQ(cmd, []string{"-endpoint", "e", "-limit", "-1"}, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "-limit") {
			t.Errorf("%s -limit -1: %v, want a refusal", cmd, err)
		}
	}
}

// A broker that does not answer ends the command with an error once
// -connect-timeout has passed; it used to retry for ever.
func TestDLQUnreachableBroker(t *testing.T) {
	for _, args := range [][]string{
		{"dlq", "list", "-endpoint", "e", "-rabbitmq", "amqp://guest:guest@127.0.0.1:1/", "-connect-timeout", "500ms"},
		{"console", "-rabbitmq", "amqp://guest:guest@127.0.0.1:1/", "-connect-timeout", "500ms"},
	} {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		start := time.Now()
		var out, errw bytes.Buffer
		err := run(ctx, args, stdio{out: &out, err: &errw})
		expired := ctx.Err()
		cancel()
		if err == nil || expired != nil || !strings.Contains(err.Error(), "127.0.0.1:1") {
			t.Errorf("%v: %v after %v, want an error naming the broker within a few seconds", args, err, time.Since(start))
		}
	}
}

// -h prints the flags and succeeds; a stray argument to console is refused.
func TestHelpAndStrayArguments(t *testing.T) {
	for _, args := range [][]string{{"dlq", "list", "-h"}, {"console", "-h"}} {
		if _, err := cli(t, args...); err != nil {
			t.Errorf("%v: %v, want success", args, err)
		}
	}
	if _, err := cli(t, "console", "-rabbitmq", "amqp://guest:guest@127.0.0.1:1/", "orders"); err == nil || !strings.Contains(err.Error(), "orders") {
		t.Errorf("console with a stray argument: %v, want a refusal naming it", err)
	}
}

// console refuses an address beyond loopback without a token before it
// says it serves there (it printed "plugbus console on http://0.0.0.0:…"
// and then failed).
func TestConsoleRefusesAddressWithoutToken(t *testing.T) {
	out, err := cli(t, "console", "-addr", "0.0.0.0:0", "-rabbitmq", "amqp://guest:guest@127.0.0.1:1/", "-connect-timeout", "100ms")
	if !errors.Is(err, console.ErrTokenRequired) || strings.Contains(out, "console on") {
		t.Errorf("console -addr 0.0.0.0:0 without a token: %v, stdout %q; want console.ErrTokenRequired and nothing said", err, out)
	}
}

// A flag's value may be "--" (an error text to look for): it does not end
// the flags, so a flag after the IDs is still read as one.
func TestDLQFlagValueOfTwoDashes(t *testing.T) {
	d, err := parseDLQ("purge", []string{"-endpoint", "orders", "-error", "--", "id-1", "-dry-run"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if d.f.Reason != "--" || !d.dryRun || !slices.Equal(d.f.IDs, []string{"id-1"}) {
		t.Errorf("error filter %q, dry run %v, IDs %q; want --, true, [id-1]", d.f.Reason, d.dryRun, d.f.IDs)
	}
	d, err = parseDLQ("list", []string{"-endpoint", "orders", "-dry-run-is-no-flag-of-list", "x"}, io.Discard)
	if err == nil {
		t.Errorf("an unknown flag: IDs %q, want an error", d.f.IDs)
	}
	d, err = parseDLQ("purge", []string{"-endpoint", "orders", "-dry-run", "--", "-x", "id-2", "--"}, io.Discard)
	if err != nil || !d.dryRun || !slices.Equal(d.f.IDs, []string{"-x", "id-2", "--"}) {
		t.Errorf("after --: %v, dry run %v, IDs %q; want true and [-x id-2 --]", err, d.dryRun, d.f.IDs)
	}
}

// A dead letter's history lists every distinct error it failed with, the
// last one included: show labelled each "Earlier error", so a message
// that failed once, permanently, seemed to have failed before as well.
func TestDLQShowLabelsHistoryErrors(t *testing.T) {
	ctx := t.Context()
	tr := memory.New()
	defer func() { _ = tr.Close(ctx) }()
	if err := tr.Setup(ctx, bus.Topology{Endpoint: "hist", MaxAttempts: 1, Concurrency: 1}); err != nil {
		t.Fatal(err)
	}
	env := &bus.Envelope{Name: "hist.job", ContentType: "application/json", Body: []byte(`{}`),
		Attributes: bus.NewAttributes("hist-1", "corr", time.Now().UTC(), nil, nil)}
	if err := tr.Send(ctx, env, "hist"); err != nil {
		t.Fatal(err)
	}
	d, err := tr.Receive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	f := bus.Failure{Reason: "declined (permanent failure: dead-lettered at once, not retried)", Attempts: 1, Endpoint: "hist",
		Time: time.Now(), History: bus.RetryHistory{Errors: []string{"declined"}}}
	if err := tr.Fail(ctx, d, f); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := show(ctx, stdio{out: &out, err: io.Discard}, tr, bus.DeadLetterFilter{Endpoint: "hist"}, "table"); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "Earlier error") || !strings.Contains(out.String(), "Failed with") {
		t.Errorf("show labels the errors of the history as earlier ones, though the last is the failure itself:\n%s", out.String())
	}
}
