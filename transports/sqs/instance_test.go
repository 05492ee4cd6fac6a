package sqs_test

import (
	"context"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/sqstest"
	"github.com/plugbus/plugbus/transports/sqs"
)

// ReceiveInstance returns messages of the instance queue alone, leaving
// those of the endpoint's queue to Receive; it fails on a transport
// without an instance queue.
func TestReceiveInstanceReadsOnlyTheInstanceQueue(t *testing.T) {
	cfg := awsConfig(t)
	prefix := sqstest.UniquePrefix(t, cfg)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	plain := sqstest.New(t, cfg, sqstest.FastOptions(prefix)...)
	if err := plain.Setup(ctx, bus.Topology{Endpoint: "plain", Concurrency: 1, MaxAttempts: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := plain.ReceiveInstance(ctx); err == nil {
		t.Error("ReceiveInstance without an instance queue succeeded")
	}
	if err := plain.Close(ctx); err != nil {
		t.Fatal(err)
	}

	tr := sqstest.New(t, cfg, sqstest.FastOptions(prefix)...)
	defer tr.Close(context.Background())
	if err := tr.Setup(ctx, bus.Topology{Endpoint: "ep", Concurrency: 1, MaxAttempts: 1, Instance: true}); err != nil {
		t.Fatal(err)
	}
	if err := tr.Send(ctx, envelope("Order", "e1"), "ep"); err != nil {
		t.Fatal(err)
	}
	if err := tr.Send(ctx, envelope("Reply", "r1"), tr.InstanceAddress()); err != nil {
		t.Fatal(err)
	}
	d, err := tr.ReceiveInstance(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d.Attributes.MessageID != "r1" {
		t.Fatalf("ReceiveInstance returned %s, want the instance queue's r1", d.Attributes.MessageID)
	}
	if err := tr.Delete(ctx, d); err != nil {
		t.Fatal(err)
	}
	d, err = tr.Receive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d.Attributes.MessageID != "e1" {
		t.Fatalf("Receive returned %s, want the endpoint's e1", d.Attributes.MessageID)
	}
	if err := tr.Delete(ctx, d); err != nil {
		t.Fatal(err)
	}
}

// A message of the instance queue that fails for good goes to the
// endpoint's dead-letter queue when there is an endpoint.
func TestInstanceQueueFailureGoesToTheEndpointsDeadLetterQueue(t *testing.T) {
	tr, _ := openTransport(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := tr.Setup(ctx, bus.Topology{Endpoint: "ep", Concurrency: 1, MaxAttempts: 1, Instance: true}); err != nil {
		t.Fatal(err)
	}
	if err := tr.Send(ctx, envelope("Reply", "r1"), tr.InstanceAddress()); err != nil {
		t.Fatal(err)
	}
	d, err := tr.Receive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Fail(ctx, d, bus.Failure{Reason: "boom", Attempts: 1, Endpoint: "ep"}); err != nil {
		t.Fatal(err)
	}
	dl := sqstest.DeadLetters(ctx, t, tr, "ep", 1)
	if len(dl) != 1 || dl[0].Failure.Reason != "boom" || dl[0].Envelope.Attributes.MessageID != "r1" {
		t.Errorf("dead letters of ep = %+v, want the failed reply r1", dl)
	}
}

// A message sent to an instance queue with a delay longer than the
// queue's hop (45 s in production: the queue keeps a message 60 s from
// when it was sent, delay included) is carried in hops, each a message of
// its own, and arrives when due, rather than sent with the whole delay
// and expired by the queue before it is due.
func TestDelayOnAnInstanceQueueIsCarriedInHops(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cfg := awsConfig(t)
	logs := &sqstest.LogRecorder{}
	tr := sqstest.New(t, cfg, sqstest.FastOptions(sqstest.UniquePrefix(t, cfg), sqs.WithHop(time.Minute), sqs.WithInstanceHop(time.Second),
		sqs.WithLogger(logs.DebugLogger()))...)
	defer tr.Close(context.Background())
	if err := tr.Setup(ctx, bus.Topology{Endpoint: "ep", Concurrency: 1, MaxAttempts: 1, Instance: true}); err != nil {
		t.Fatal(err)
	}
	since := time.Now()
	const delay = 2500 * time.Millisecond
	if err := tr.SendAt(ctx, envelope("Reply", "r1"), tr.InstanceAddress(), since.Add(delay)); err != nil {
		t.Fatal(err)
	}
	d, err := tr.ReceiveInstance(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(since); d.Attributes.MessageID != "r1" || waited < delay {
		t.Fatalf("received %s after %s, want r1 after %s", d.Attributes.MessageID, waited, delay)
	}
	if hops := logs.Records(t, "DEBUG", "message not due yet sent on"); len(hops) < 2 {
		t.Errorf("%d hops for a delay of %s on an instance queue in hops of 1s, want at least 2:\n%s", len(hops), delay, logs)
	}
	if err := tr.Delete(ctx, d); err != nil {
		t.Fatal(err)
	}
}
