package bus_test

import (
	"context"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
)

func TestFilters(t *testing.T) {
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
	e.expect(bustest.Deleted)
	e.expect(bustest.Deleted)
	if got := await(t, handled); got != "ok" {
		t.Fatalf("handled %s", got)
	}
	if len(handled) != 0 {
		t.Fatal("a filtered message was handled")
	}
}
