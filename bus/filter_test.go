package bus_test

import (
	"context"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
)

// An incoming filter's FilterStop handles the message without its
// handlers; an outgoing filter's drops the message.
func TestFiltersStopIncomingAndOutgoingMessages(t *testing.T) {
	handled := make(chan string, 4)
	e := newEnv(t, nil,
		bus.WithMiddleware(
			bus.FilterIncoming("needs-tenant", func(ctx context.Context, in *bus.Incoming) bus.FilterResult {
				if _, ok := in.Attributes().StickyValue("tenant"); !ok {
					return bus.FilterStop
				}
				return bus.FilterContinue
			}),
			bus.FilterOutgoing("no-test-orders", func(ctx context.Context, out *bus.Outgoing) bus.FilterResult {
				if m, ok := out.Message().(orderPlaced); ok && m.ID == "test" {
					return bus.FilterStop
				}
				return bus.FilterContinue
			})),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error { handled <- m.ID; return nil }))
	ctx := t.Context()
	if err := e.bus.Send(ctx, orderPlaced{ID: "test"}, bus.WithStickyAttribute("tenant", "t")); err != nil {
		t.Fatal(err)
	}
	if err := e.bus.Send(ctx, orderPlaced{ID: "no-tenant"}); err != nil {
		t.Fatal(err)
	}
	if err := e.bus.Send(ctx, orderPlaced{ID: "ok"}, bus.WithStickyAttribute("tenant", "t")); err != nil {
		t.Fatal(err)
	}
	e.waitIdle()
	if got := await(t, handled); got != "ok" {
		t.Fatalf("handled %s", got)
	}
	if len(handled) != 0 {
		t.Fatalf("a filtered message was handled: %s", <-handled)
	}
	if got := e.rec.Settled(); len(got) != 2 || got[0].Outcome != bustest.Deleted || got[1].Outcome != bustest.Deleted {
		t.Fatalf("settled %+v, want the two messages sent deleted", got)
	}
	if n := len(e.rec.Sent()); n != 2 {
		t.Fatalf("%d messages reached the transport, want 2 (the test order is dropped)", n)
	}
}
