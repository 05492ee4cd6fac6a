package rabbitmq_test

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/rabbitmq"
)

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
	b := e.start(t, bus.WithMiddleware(bus.Middleware{Name: "look", Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
		raw := in.Raw().(*amqp.Delivery)
		_, has := raw.Headers[rabbitmq.HeaderSentAt]
		got <- seen{in.Attributes().MessageID, has, in.Attributes().SentAt}
		return next.Call(ctx)
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
