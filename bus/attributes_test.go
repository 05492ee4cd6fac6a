package bus_test

import (
	"context"
	"testing"

	"github.com/plugbus/plugbus/bus"
)

// A message sent while handling another inherits its correlation id and
// sticky attributes, not its one-hop attributes, and gets an id and a
// sent-at time of its own; a new conversation is correlated by its first
// message's id.
func TestCorrelationAndStickyAttributesFlowDownstream(t *testing.T) {
	got := make(chan bus.Attributes, 1)
	var first bus.Attributes
	e := newEnv(t, nil,
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			first = a
			return handlingBus(ctx).Send(ctx, chargeCard{OrderID: m.ID}, bus.WithAttribute("hop", "2"))
		}),
		bus.WithHandler(func(ctx context.Context, m chargeCard, a bus.Attributes) error { got <- a; return nil }))
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}, bus.WithAttribute("hop", "1"), bus.WithStickyAttribute("tenant", "acme")); err != nil {
		t.Fatal(err)
	}
	a := await(t, got)
	if first.MessageID == "" || first.CorrelationID != first.MessageID {
		t.Fatalf("first message: id %q correlation %q (a new conversation is correlated by its first id)", first.MessageID, first.CorrelationID)
	}
	if a.CorrelationID != first.CorrelationID {
		t.Fatalf("correlation id not inherited: %s vs %s", a.CorrelationID, first.CorrelationID)
	}
	if a.MessageID == first.MessageID || a.MessageID == "" {
		t.Fatalf("message id %q not new", a.MessageID)
	}
	if v, _ := a.StickyValue("tenant"); v != "acme" {
		t.Fatalf("sticky attribute not copied: %q", v)
	}
	if v, _ := a.Value("hop"); v != "2" {
		t.Fatalf("one-hop attribute: %q, want only the new message's own", v)
	}
	if a.SentAt.IsZero() || a.SentAt.Before(first.SentAt) {
		t.Fatalf("sent-at %v before %v", a.SentAt, first.SentAt)
	}
}
