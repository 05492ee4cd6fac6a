package rabbitmq_test

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/rabbitmq"
)

type reply struct{}

func (reply) MessageName() string { return "test.reply" }

// A handler holding the bus's only worker while it waits for a message on
// its instance queue (a reply) still gets it: the bus reads the instance
// queue with a loop of its own (bus.InstanceReceiver).
func TestInstanceQueueReceivedBesideBusyWorkers(t *testing.T) {
	e := newEnv(t)
	tr := e.transport(t)
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
	b, err := bus.New(bus.WithEndpoint(e.endpoint), bus.WithTransport(tr), bus.WithConcurrency(1), bus.WithMiddleware(resolver),
		bus.WithHandler(func(ctx context.Context, o order, _ bus.Attributes) error {
			b, _, _ := bus.MessageContext(ctx)
			if err := b.Send(ctx, reply{}, bus.To(tr.InstanceAddress()), bus.Immediately(), bus.WithMessageID("reply-1")); err != nil {
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
	ctx := testContext(t, 30*time.Second)
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop(context.Background()) })
	if err := b.Send(ctx, order{ID: 1}); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-got:
		if id != "reply-1" {
			t.Fatalf("got %s", id)
		}
	case <-ctx.Done():
		t.Fatal("the reply never reached the handler waiting for it")
	}
}

// The sent-at of a message whose id is the bus's UUIDv7 travels in the id;
// a message with an id of the sender's own carries a sent-at header.
func TestSentAtTravelsInAUUIDv7ID(t *testing.T) {
	e := newEnv(t)
	type seen struct {
		id     string
		header bool
		sentAt time.Time
	}
	got := make(chan seen, 2)
	b := e.start(t, bus.WithMiddleware(bus.Middleware{Name: "look", Incoming: func(ctx context.Context, in *bus.Incoming, next bus.Next) error {
		raw := in.Raw().(amqp.Delivery)
		_, has := raw.Headers[rabbitmq.HeaderSentAt]
		got <- seen{in.Attributes().MessageID, has, in.Attributes().SentAt}
		return next(ctx)
	}}), bus.WithHandler(func(context.Context, order, bus.Attributes) error { return nil }))
	ctx := testContext(t, 30*time.Second)
	before := time.Now().Add(-time.Millisecond)
	if err := b.Send(ctx, order{ID: 1}); err != nil {
		t.Fatal(err)
	}
	s := <-got
	if s.header || s.sentAt.Before(before) || s.sentAt.After(time.Now()) {
		t.Fatalf("bus id %s: sent-at header %v, sent-at %v", s.id, s.header, s.sentAt)
	}
	if err := b.Send(ctx, order{ID: 2}, bus.WithMessageID("order-2")); err != nil {
		t.Fatal(err)
	}
	s = <-got
	if !s.header || s.sentAt.Before(before) {
		t.Fatalf("own id: sent-at header %v, sent-at %v", s.header, s.sentAt)
	}
}
