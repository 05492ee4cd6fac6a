package bus_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
	"github.com/plugbus/plugbus/transports/memory"
)

// A send-only bus sends a message to its route, or to the endpoint given
// with To; a message with neither fails with ErrNoRoute.
func TestSendGoesToTheRouteOrTo(t *testing.T) {
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

// Publish delivers a message to every endpoint whose bus handles its
// name, and to no other.
func TestPublishReachesEveryEndpointThatHandlesIt(t *testing.T) {
	broker := memory.NewBroker()
	shipped := make(chan string, 4)
	start := func(endpoint string, opts ...bus.Option) *bustest.Transport {
		tr := bustest.NewTransport(memory.WithBroker(broker))
		bustest.Start(t, append([]bus.Option{bus.WithEndpoint(endpoint), bus.WithTransport(tr), bus.WithLogger(discard())}, opts...)...)
		return tr
	}
	shipping := bus.WithHandler(func(ctx context.Context, m orderShipped, a bus.Attributes) error {
		b, _, _ := bus.MessageContext(ctx)
		shipped <- b.Endpoint()
		return nil
	})
	warehouse, mail := start("warehouse", shipping), start("mail", shipping)
	billing := start("billing", bus.WithHandler(func(context.Context, chargeCard, bus.Attributes) error { return nil }))
	publisher := bustest.Start(t, bus.WithTransport(memory.New(memory.WithBroker(broker))), bus.WithLogger(discard()))
	if err := publisher.Publish(t.Context(), orderShipped{OrderID: "1"}); err != nil {
		t.Fatal(err)
	}
	got := []string{await(t, shipped), await(t, shipped)}
	slices.Sort(got)
	if !slices.Equal(got, []string{"mail", "warehouse"}) {
		t.Fatalf("handled by %v, want mail and warehouse", got)
	}
	for _, tr := range []*bustest.Transport{warehouse, mail, billing} {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		err := tr.WaitIdle(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := len(billing.Settled()); n != 0 || len(shipped) != 0 {
		t.Fatalf("billing settled %d messages, %d more handled: the event reached an endpoint that does not handle it, or one twice", n, len(shipped))
	}
}

// A header the transport reserves fails the Send that set it, before
// anything is buffered.
func TestHeaderReservedRefusedAtSendTime(t *testing.T) {
	e := newEnv(t, nil,
		bus.WithTransport(reservingTransport{memory.New()}),
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

// reservingTransport is a memory transport that reserves the header x-reserved.
type reservingTransport struct{ *memory.Transport }

func (reservingTransport) ValidateHeaders(h bus.Headers) error {
	if _, ok := h["x-reserved"]; ok {
		return &bus.HeaderReservedError{Transport: "test", Header: "x-reserved"}
	}
	return nil
}
