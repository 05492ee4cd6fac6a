package bus_test

import (
	"context"
	"errors"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
)

// Deliver returns nil for a message handled, the handler's error for one
// to retry, and a DecodeError for one that can never be processed.
func TestDeliverReturnsNilTheHandlersErrorOrPoison(t *testing.T) {
	boom := errors.New("boom")
	b, err := bus.New(bus.WithEndpoint("ep"), bus.WithLogger(discard()),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			if m.ID == "bad" {
				return boom
			}
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop(context.Background())
	ctx := t.Context()
	if err := b.Deliver(ctx, bustest.Delivery(orderPlaced{ID: "good"}, bus.Attributes{})); err != nil {
		t.Fatalf("good: %v", err)
	}
	if err := b.Deliver(ctx, bustest.Delivery(orderPlaced{ID: "bad"}, bus.Attributes{})); !errors.Is(err, boom) {
		t.Fatalf("bad: %v", err)
	}
	poison := bustest.Delivery(orderPlaced{}, bus.Attributes{})
	poison.Body = []byte("not json")
	if err := b.Deliver(ctx, poison); !errors.Is(err, bus.ErrDecode) {
		t.Fatalf("poison: %v", err)
	}
}

// A handler reads the native headers of the message it handles (what a
// foreign producer set) with MessageHeader, also through a context derived
// from its own; outside a handler there is none.
func TestHandlerReadsANativeHeader(t *testing.T) {
	type seen struct {
		tenant, missing string
		ok, okMissing   bool
	}
	got := make(chan seen, 1)
	type key struct{}
	b, err := bus.New(bus.WithEndpoint("ep"), bus.WithLogger(discard()),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			ctx = context.WithValue(ctx, key{}, "derived")
			var s seen
			s.tenant, s.ok = bus.MessageHeader(ctx, "x-tenant")
			s.missing, s.okMissing = bus.MessageHeader(ctx, "x-other")
			got <- s
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop(context.Background())
	d := bustest.Delivery(orderPlaced{ID: "1"}, bus.Attributes{})
	d.Headers = bus.Headers{"x-tenant": "acme"}
	if err := b.Deliver(t.Context(), d); err != nil {
		t.Fatal(err)
	}
	if s := <-got; s != (seen{tenant: "acme", ok: true}) {
		t.Fatalf("handler read %+v; want x-tenant acme and no x-other", s)
	}
	if v, ok := bus.MessageHeader(t.Context(), "x-tenant"); ok || v != "" {
		t.Fatalf("outside a handler: %q, %v", v, ok)
	}
}
