package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/dltest"
	"github.com/plugbus/plugbus/internal/sqstest"
	"github.com/plugbus/plugbus/internal/testenv"
	"github.com/plugbus/plugbus/transports/memory"
	"github.com/plugbus/plugbus/transports/sqs"
	"github.com/plugbus/plugbus/transports/transporttest"
)

// unknownEndpoint checks what plugbus says of an endpoint that does not
// exist: an error (exit status 1) naming it, on one line, and no count of
// dead letters on stdout (it said "0 dead letters", a typo unnoticed).
func unknownEndpoint(t *testing.T, what string, out string, err error, endpoint string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s succeeded, printing %q; want an error: the endpoint does not exist", what, out)
		return
	}
	line := "plugbus: " + err.Error() // what main prints
	if !errors.Is(err, bus.ErrUnknownEndpoint) || !strings.Contains(line, `"`+endpoint+`"`) || strings.Contains(line, "\n") {
		t.Errorf("%s: %q, want one line naming endpoint %q (bus.ErrUnknownEndpoint)", what, line, endpoint)
	}
	if strings.Contains(out, "dead letters") || strings.Contains(out, "nothing to") {
		t.Errorf("%s printed %q, as if the endpoint existed", what, out)
	}
}

// Every dlq command on an endpoint that does not exist, and a replay to
// one, fails and does nothing.
func TestDLQUnknownEndpointOnRabbitMQ(t *testing.T) {
	url := testenv.RabbitMQ(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	ep, exchange := transporttest.Name("cli-known"), transporttest.Name("cli-unknown-x")
	tr := dltest.RabbitMQ(ctx, t, url, exchange, ep, "shop.order")
	dltest.Make(ctx, t, tr, ep, dltest.Message{Name: "shop.order", Body: `{}`, Reason: "boom"})
	typo := transporttest.Name("cli-typo")
	conn := []string{"-rabbitmq", url, "-exchange", exchange}
	for _, args := range [][]string{
		{"list", "-endpoint", typo},
		{"show", "-endpoint", typo},
		{"replay", "-endpoint", typo, "-all"},
		{"replay", "-endpoint", typo, "-all", "-dry-run"},
		{"purge", "-endpoint", typo, "-all"},
		{"replay", "-endpoint", ep, "-all", "-to", typo},
		{"replay", "-endpoint", ep, "-all", "-to", typo, "-dry-run"},
	} {
		out, err := cli(t, append(append([]string{"dlq"}, args...), conn...)...)
		unknownEndpoint(t, strings.Join(args, " "), out, err, typo)
		if n, err := tr.CountDeadLetters(ctx, ep); err != nil || n != 1 {
			t.Fatalf("after %v: %d dead letters of %s (%v), want the 1 as it was", args, n, ep, err)
		}
	}
	if _, err := tr.QueueDepth(ctx, typo); !errors.Is(err, bus.ErrUnknownEndpoint) {
		t.Errorf("QueueDepth(%s) after the commands: %v; want it still unknown", typo, err)
	}
}

// On a transport that lists its endpoints, the error names them and
// suggests the nearest.
func TestDLQUnknownEndpointNamesTheKnownOnes(t *testing.T) {
	ctx := t.Context()
	broker := memory.NewBroker()
	payments := memory.New(memory.WithBroker(broker))
	defer func() { _ = payments.Close(context.Background()) }()
	if err := payments.Setup(ctx, bus.Topology{Endpoint: "payments", MaxAttempts: 1, Concurrency: 1}); err != nil {
		t.Fatal(err)
	}
	tr := memory.New(memory.WithBroker(broker))
	defer func() { _ = tr.Close(context.Background()) }()
	if err := tr.Setup(ctx, bus.Topology{Endpoint: "orders", MaxAttempts: 1, Concurrency: 1}); err != nil {
		t.Fatal(err)
	}
	dltest.Make(ctx, t, tr, "orders", dltest.Message{Name: "shop.order", Body: `{}`, Reason: "boom"})
	var out bytes.Buffer
	err := list(ctx, stdio{out: &out, err: io.Discard}, tr, bus.DeadLetterFilter{Endpoint: "ordrs"}, "table")
	unknownEndpoint(t, "list -endpoint ordrs", out.String(), err, "ordrs")
	if err != nil && (!strings.Contains(err.Error(), `did you mean "orders"?`) || !strings.Contains(err.Error(), "orders, payments")) {
		t.Errorf("list -endpoint ordrs: %v; want a suggestion of orders and the known endpoints", err)
	}
	out.Reset()
	err = bulk(ctx, stdio{out: &out, err: io.Discard}, tr, "replay", bus.DeadLetterFilter{Endpoint: "orders"}, bus.Replay{To: "paymnts"}, true, "table")
	unknownEndpoint(t, "replay -to paymnts -dry-run", out.String(), err, "paymnts")
	if err != nil && !strings.Contains(err.Error(), `did you mean "payments"?`) {
		t.Errorf("replay -to paymnts -dry-run: %v; want a suggestion of payments", err)
	}
}

// On SQS the error names the queues looked for, with the prefix: a wrong
// -sqs-prefix is the other usual mistake.
func TestDLQUnknownEndpointOnSQS(t *testing.T) {
	httpTransport := &http.Transport{}
	t.Cleanup(httpTransport.CloseIdleConnections)
	cfg := sqstest.Config(t, &http.Client{Transport: httpTransport})
	prefix := sqstest.UniquePrefix(t, cfg)
	tr := sqstest.New(t, cfg, sqs.WithPrefix(prefix))
	defer func() { _ = tr.Close(context.Background()) }()
	var out bytes.Buffer
	err := list(t.Context(), stdio{out: &out, err: io.Discard}, tr, bus.DeadLetterFilter{Endpoint: "ordrs"}, "table")
	unknownEndpoint(t, "list -endpoint ordrs", out.String(), err, "ordrs")
	if err != nil && !strings.Contains(err.Error(), prefix+"ordrs-dlq") {
		t.Errorf("list -endpoint ordrs: %v; want the dead-letter queue's name, with the prefix", err)
	}
}

// A dry run of a replay to an endpoint without its queue (deleted by an
// operator; its dead-letter queue remains) fails as the replay does. It
// asked only whether the endpoint existed (QueueDepth, which answers 0 for
// it), and said it would replay what the replay then refused.
func TestDLQDryRunChecksTheDestinationQueue(t *testing.T) {
	url := testenv.RabbitMQ(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	ep, exchange := transporttest.Name("cli-from"), transporttest.Name("cli-from-x")
	tr := dltest.RabbitMQ(ctx, t, url, exchange, ep, "shop.order")
	dltest.Make(ctx, t, tr, ep, dltest.Message{Name: "shop.order", Body: `{}`, Reason: "boom"})
	gone := transporttest.Name("cli-noqueue")
	other := dltest.RabbitMQ(ctx, t, url, transporttest.Name("cli-noqueue-x"), gone)
	dltest.DeleteQueue(ctx, t, url, other)
	args := []string{"dlq", "replay", "-endpoint", ep, "-all", "-to", gone, "-rabbitmq", url, "-exchange", exchange}
	for _, run := range [][]string{append(args, "-dry-run"), args} {
		out, err := cli(t, run...)
		unknownEndpoint(t, strings.Join(run[1:], " "), out, err, gone)
		if n, err := tr.CountDeadLetters(ctx, ep); err != nil || n != 1 {
			t.Fatalf("after %v: %d dead letters of %s (%v), want the 1 as it was", run, n, ep, err)
		}
	}
}

// A dry run of a replay to the address of a gone SQS instance queue fails
// as the replay does; a queue URL was not looked up at all.
func TestDLQDryRunChecksAQueueURL(t *testing.T) {
	httpTransport := &http.Transport{}
	t.Cleanup(httpTransport.CloseIdleConnections)
	cfg := sqstest.Config(t, &http.Client{Transport: httpTransport})
	prefix := sqstest.UniquePrefix(t, cfg)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	gone := sqstest.GoneInstanceAddress(ctx, t, cfg, prefix)
	const ep = "cli-dry-url"
	tr := sqstest.New(t, cfg, sqstest.FastOptions(prefix)...)
	defer func() { _ = tr.Close(context.Background()) }()
	if err := tr.Setup(ctx, bus.Topology{Endpoint: ep, MaxAttempts: 1, Concurrency: 1}); err != nil {
		t.Fatal(err)
	}
	dltest.Make(ctx, t, tr, ep, dltest.Message{Name: "shop.order", Body: `{}`, Reason: "boom"})
	for _, dryRun := range []bool{true, false} {
		var out bytes.Buffer
		err := bulk(ctx, stdio{out: &out, err: io.Discard}, tr, "replay", bus.DeadLetterFilter{Endpoint: ep}, bus.Replay{To: gone}, dryRun, "table")
		unknownEndpoint(t, fmt.Sprintf("replay -to %s (dry run: %t)", gone, dryRun), out.String(), err, gone)
	}
	if n, err := tr.CountDeadLetters(ctx, ep); err != nil || n != 1 {
		t.Errorf("after the replays: %d dead letters (%v), want the 1 as it was", n, err)
	}
}

// A bulk replay that stops at its first dead letter, whose endpoint has no
// queue, says how many of the selected were replayed and how many are
// left, as for any other stop: it printed the error alone, naming the one
// dead letter that stays, as if the others had been replayed.
func TestDLQReplayStoppedAtItsFirstDeadLetterCounts(t *testing.T) {
	ctx := t.Context()
	tr := memory.New()
	defer func() { _ = tr.Close(context.Background()) }()
	if err := tr.Setup(ctx, bus.Topology{Endpoint: "shop", MaxAttempts: 1, Concurrency: 1}); err != nil {
		t.Fatal(err)
	}
	dltest.Make(ctx, t, tr, "shop",
		dltest.Message{Name: "shop.order", Body: `{}`, Reason: "a", FailedOn: "gone"},
		dltest.Message{Name: "shop.order", Body: `{}`, Reason: "b"})
	var out bytes.Buffer
	err := bulk(ctx, stdio{out: &out, err: io.Discard}, tr, "replay", bus.DeadLetterFilter{Endpoint: "shop"}, bus.Replay{}, false, "table")
	if !errors.Is(err, bus.ErrUnknownEndpoint) || !strings.Contains(out.String(), "replayed 0 of 2 dead letters of shop") || !strings.Contains(out.String(), "2 left") {
		t.Errorf("replay -all: %v, printing %q; want bus.ErrUnknownEndpoint and that 0 of 2 were replayed, 2 left", err, out.String())
	}
	if n, err := tr.CountDeadLetters(ctx, "shop"); err != nil || n != 2 {
		t.Errorf("after the replay: %d dead letters (%v), want the 2", n, err)
	}
}
