package bus_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
	"github.com/plugbus/plugbus/transports/memory"
)

// New instantiates each plugin once, in order, with the bus's info;
// starting and stopping the bus instantiates nothing again.
func TestNewInstantiatesEachPluginOnceWithTheBusInfo(t *testing.T) {
	var made []string
	plugin := func(name string) bus.Plugin {
		return bus.PluginFunc(func(info bus.PluginInfo) (bus.Middleware, error) {
			made = append(made, name)
			if info.Endpoint != "ep" || info.Name != "ep" || info.Bus == nil || info.Logger == nil || info.Transport == nil || !slices.Equal(info.Handles, []string{"shop.order_placed"}) {
				t.Errorf("plugin info %+v", info)
			}
			return bus.Middleware{Name: name, Start: func(context.Context) error { return nil }}, nil
		})
	}
	b, err := bus.New(bus.WithEndpoint("ep"), bus.WithLogger(discard()), bus.WithMiddleware(plugin("p1"), plugin("p2")),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(made, []string{"p1", "p2"}) {
		t.Fatalf("New instantiated %v, want p1 then p2", made)
	}
	if err := b.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := b.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	if len(made) != 2 {
		t.Fatalf("plugins instantiated %v by New, Start and Stop, want once each", made)
	}
}

// Two buses in one process share neither middleware nor handler scopes:
// a send on bus B with a context of bus A's handler goes out on B at
// once, whatever A's handler does next, and each bus's middleware sees
// only its own messages.
func TestTwoBusesShareNeitherMiddlewareNorHandlerScopes(t *testing.T) {
	broker := memory.NewBroker()
	var aOut, bOut, aIn, bIn atomic.Int32
	count := func(name string, in, out *atomic.Int32) bus.Plugin {
		return bus.PluginFunc(func(info bus.PluginInfo) (bus.Middleware, error) {
			return bus.Middleware{
				Name: name,
				Incoming: func(ctx context.Context, _ *bus.Incoming, next *bus.IncomingNext) error {
					in.Add(1)
					return next.Call(ctx)
				},
				Outgoing: func(ctx context.Context, _ *bus.Outgoing, next *bus.OutgoingNext) error {
					out.Add(1)
					return next.Call(ctx)
				},
			}, nil
		})
	}
	charged := make(chan string, 10)
	var busB *bus.Bus
	sendErr := make(chan error, 10)
	a := newEnv(t, broker, bus.WithMiddleware(count("a", &aIn, &aOut)),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, at bus.Attributes) error {
			// bus B's Send with bus A's handler context is not buffered in A's outbox
			sendErr <- busB.Send(ctx, chargeCard{OrderID: m.ID}, bus.To("billing"))
			return errors.New("a fails: its own sends are discarded, B's are not A's")
		}))
	b, err := bus.New(bus.WithEndpoint("billing"), bus.WithTransport(memory.New(memory.WithBroker(broker))),
		bus.WithLogger(discard()), bus.WithMiddleware(count("b", &bIn, &bOut)),
		bus.WithHandler(func(ctx context.Context, m chargeCard, at bus.Attributes) error {
			if _, _, ok := bus.MessageContext(ctx); !ok {
				return errors.New("no message context")
			}
			charged <- m.OrderID
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	busB = b
	if err := b.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop(context.Background()) })
	if err := a.bus.Send(t.Context(), orderPlaced{ID: "1"}); err != nil {
		t.Fatal(err)
	}
	if err := await(t, sendErr); err != nil {
		t.Fatal(err)
	}
	if got := await(t, charged); got != "1" {
		t.Fatalf("charged %s", got)
	}
	a.expect(bustest.Returned)
	if aOut.Load() != 1 || bOut.Load() < 1 || bIn.Load() < 1 {
		t.Fatalf("middleware counts: a out %d, b out %d, b in %d", aOut.Load(), bOut.Load(), bIn.Load())
	}
	if aIn.Load() < 1 {
		t.Fatal("a's incoming middleware did not run")
	}
}
