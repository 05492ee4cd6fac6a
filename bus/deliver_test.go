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
