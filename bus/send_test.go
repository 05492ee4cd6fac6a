package bus_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/memory"
)

func TestSendOnlyBusAndRouting(t *testing.T) {
	broker := memory.NewBroker()
	got := make(chan string, 2)
	newEnv(t, broker, bus.WithHandler(func(ctx context.Context, m chargeCard, a bus.Attributes) error { got <- m.OrderID; return nil }))
	sender, err := bus.New(bus.WithTransport(memory.New(memory.WithBroker(broker))), bus.WithRoute("ep", chargeCard{}), bus.WithLogger(discard()))
	if err != nil {
		t.Fatal(err)
	}
	defer sender.Stop(context.Background())
	ctx := t.Context()
	if err := sender.Send(ctx, chargeCard{OrderID: "routed"}); err != nil {
		t.Fatal(err)
	}
	if err := sender.Send(ctx, chargeCard{OrderID: "direct"}, bus.To("ep")); err != nil {
		t.Fatal(err)
	}
	if a, b := await(t, got), await(t, got); a != "routed" || b != "direct" {
		t.Fatalf("got %s, %s", a, b)
	}
	if err := sender.Send(ctx, orderPlaced{}); !errors.Is(err, bus.ErrNoRoute) || !strings.Contains(err.Error(), "bus.To") {
		t.Fatalf("unrouted send: %v", err)
	}
}

func TestHeaderReservedRefusedAtSendTime(t *testing.T) {
	e := newEnv(t, nil,
		bus.WithTransport(reserving{memory.New()}),
		bus.WithMiddleware(bus.Middleware{Name: "sets-reserved", Outgoing: func(ctx context.Context, out *bus.Outgoing, next bus.Next) error {
			out.Headers()["x-reserved"] = "1"
			return next(ctx)
		}}),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error { return nil }))
	err := e.bus.Send(t.Context(), orderPlaced{})
	var hr *bus.HeaderReservedError
	if !errors.Is(err, bus.ErrHeaderReserved) || !errors.As(err, &hr) || hr.Header != "x-reserved" {
		t.Fatalf("Send: %v", err)
	}
}

// reserving is a memory transport that reserves the header x-reserved.
type reserving struct{ *memory.Transport }

func (reserving) ValidateHeaders(h bus.Headers) error {
	if _, ok := h["x-reserved"]; ok {
		return &bus.HeaderReservedError{Transport: "test", Header: "x-reserved"}
	}
	return nil
}
