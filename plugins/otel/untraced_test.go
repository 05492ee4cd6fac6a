package otel_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/baggage"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/memory"
)

// A message that arrives with no trace context (sent by a bus without the
// plugin, or another producer) starts a trace of its own: neither the span
// current in the context the bus was started with, nor its baggage, is
// the message's.
func TestUntracedMessageStartsItsOwnTrace(t *testing.T) {
	tel := newTelemetry(t)
	broker := memory.NewBroker()
	handled := make(chan struct{}, 2)
	b, err := bus.New(bus.WithEndpoint("orders"), bus.WithTransport(memory.New(memory.WithBroker(broker))),
		bus.WithMiddleware(tel.plugin()),
		bus.WithHandler(func(ctx context.Context, _ PlaceOrder, _ bus.Attributes) error {
			if n := baggage.FromContext(ctx).Len(); n != 0 {
				t.Errorf("the handler sees %d baggage members of the start context", n)
			}
			handled <- struct{}{}
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	member, err := baggage.NewMember("tenant", "acme")
	if err != nil {
		t.Fatal(err)
	}
	bag, err := baggage.New(member)
	if err != nil {
		t.Fatal(err)
	}
	startCtx, startup := tel.tp.Tracer("app").Start(baggage.ContextWithBaggage(context.Background(), bag), "startup")
	if err := b.Start(startCtx); err != nil {
		t.Fatal(err)
	}
	startup.End()
	defer b.Stop(context.Background())

	// A producer without the plugin.
	plain, err := bus.New(bus.WithTransport(memory.New(memory.WithBroker(broker))), bus.WithRoute("orders", PlaceOrder{}))
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer plain.Stop(context.Background())
	for range 2 {
		if err := plain.Send(context.Background(), PlaceOrder{ID: "1"}); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		select {
		case <-handled:
		case <-time.After(10 * time.Second):
			t.Fatal("not handled")
		}
	}
	if err := b.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	processed := 0
	for _, s := range tel.spans.Ended() {
		if s.Name() != "process PlaceOrder" {
			continue
		}
		processed++
		if s.Parent().IsValid() || s.SpanContext().TraceID() == startup.SpanContext().TraceID() {
			t.Errorf("span %q of an untraced message has parent %s in trace %s: the start-up span's trace (%s)",
				s.Name(), s.Parent().SpanID(), s.SpanContext().TraceID(), startup.SpanContext().TraceID())
		}
	}
	if processed != 2 {
		t.Errorf("%d spans named process PlaceOrder, want one per message (2)", processed)
	}
}
