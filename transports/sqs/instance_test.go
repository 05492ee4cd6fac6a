package sqs_test

import (
	"context"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/sqs"
)

type instanceReply struct{}

func (instanceReply) MessageName() string { return "test.reply" }

// A handler holding the bus's only worker while it waits for a message on
// its instance queue (a reply) still gets it: the bus reads the instance
// queue with a loop of its own (bus.InstanceReceiver).
func TestInstanceQueueReceivedBesideBusyWorkers(t *testing.T) {
	cfg := awsConfig(t)
	prefix := uniquePrefix(t, cfg)
	tr := sqs.New(cfg, fastOptions(prefix)...)
	replies := make(chan string, 1)
	resolver := bus.Middleware{Name: "replies", InstanceQueue: true,
		Incoming: func(ctx context.Context, in *bus.Incoming, next bus.Next) error {
			if in.Name() == "test.reply" {
				replies <- in.Attributes().MessageID
				return nil
			}
			return next(ctx)
		}}
	got := make(chan string, 1)
	b, err := bus.New(bus.WithEndpoint("orders"), bus.WithTransport(tr), bus.WithConcurrency(1), bus.WithMiddleware(resolver),
		bus.WithHandler(func(ctx context.Context, _ orderPlaced, _ bus.Attributes) error {
			b, _, _ := bus.MessageContext(ctx)
			if err := b.Send(ctx, instanceReply{}, bus.To(tr.InstanceAddress()), bus.Immediately(), bus.WithMessageID("reply-1")); err != nil {
				return err
			}
			select {
			case id := <-replies:
				got <- id
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := b.Stop(context.Background()); err != nil {
			t.Errorf("Stop: %v", err)
		}
	}()
	if err := b.Send(ctx, orderPlaced{ID: "o1"}); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-got:
		if id != "reply-1" {
			t.Fatalf("the handler got reply %s, want reply-1", id)
		}
	case <-ctx.Done():
		t.Fatal("the reply never reached the handler waiting for it")
	}
}

// ReceiveInstance returns messages of the instance queue alone, leaving
// those of the endpoint's queue to Receive; it fails on a transport
// without an instance queue.
func TestReceiveInstanceReadsOnlyTheInstanceQueue(t *testing.T) {
	cfg := awsConfig(t)
	prefix := uniquePrefix(t, cfg)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	plain := sqs.New(cfg, fastOptions(prefix)...)
	if err := plain.Setup(ctx, bus.Topology{Endpoint: "plain", Concurrency: 1, MaxAttempts: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := plain.ReceiveInstance(ctx); err == nil {
		t.Error("ReceiveInstance without an instance queue succeeded")
	}
	if err := plain.Close(ctx); err != nil {
		t.Fatal(err)
	}

	tr := sqs.New(cfg, fastOptions(prefix)...)
	defer tr.Close(context.Background())
	if err := tr.Setup(ctx, bus.Topology{Endpoint: "ep", Concurrency: 1, MaxAttempts: 1, Instance: true}); err != nil {
		t.Fatal(err)
	}
	if err := tr.Send(ctx, envelope("Order", "e1"), bus.SendOptions{Destination: "ep"}); err != nil {
		t.Fatal(err)
	}
	if err := tr.Send(ctx, envelope("Reply", "r1"), bus.SendOptions{Destination: tr.InstanceAddress()}); err != nil {
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
