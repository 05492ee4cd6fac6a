package bus_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
	"github.com/plugbus/plugbus/transports/memory"
)

func TestPluginsInstantiatedOncePerBusWithLifecycle(t *testing.T) {
	var made atomic.Int32
	var order []string
	plugin := func(name string) bus.Plugin {
		return bus.PluginFunc(func(info bus.PluginInfo) (bus.Middleware, error) {
			made.Add(1)
			if info.Endpoint != "ep" || info.Bus == nil || info.Logger == nil || info.Transport == nil || len(info.Handles) != 1 {
				t.Errorf("plugin info %+v", info)
			}
			return bus.Middleware{
				Name:  name,
				Start: func(context.Context) error { order = append(order, "start "+name); return nil },
				Stop:  func(context.Context) error { order = append(order, "stop "+name); return nil },
			}, nil
		})
	}
	b, err := bus.New(bus.WithEndpoint("ep"), bus.WithLogger(discard()), bus.WithMiddleware(plugin("p1"), plugin("p2")),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	if made.Load() != 2 {
		t.Fatalf("plugins instantiated %d times", made.Load())
	}
	if err := b.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(t.Context()); !errors.Is(err, bus.ErrAlreadyStarted) {
		t.Fatalf("second Start: %v", err)
	}
	if err := b.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(order, ", "); got != "start p1, start p2, stop p2, stop p1" {
		t.Fatalf("lifecycle order: %s", got)
	}
	if made.Load() != 2 {
		t.Fatalf("plugins instantiated %d times", made.Load())
	}
	if err := b.Start(t.Context()); !errors.Is(err, bus.ErrClosed) {
		t.Fatalf("Start after Stop: %v", err)
	}
	if err := b.Send(t.Context(), orderPlaced{}); !errors.Is(err, bus.ErrClosed) {
		t.Fatalf("Send after Stop: %v", err)
	}
	if err := b.Deliver(t.Context(), bustest.Delivery(orderPlaced{}, bus.Attributes{})); !errors.Is(err, bus.ErrClosed) {
		t.Fatalf("Deliver after Stop: %v", err)
	}
	if err := b.Stop(t.Context()); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
}

func TestTwoBusesAreIsolated(t *testing.T) {
	broker := memory.NewBroker()
	var aOut, bOut, aIn, bIn atomic.Int32
	count := func(name string, in, out *atomic.Int32) bus.Plugin {
		return bus.PluginFunc(func(info bus.PluginInfo) (bus.Middleware, error) {
			return bus.Middleware{
				Name:     name,
				Incoming: func(ctx context.Context, _ *bus.Incoming, next bus.Next) error { in.Add(1); return next(ctx) },
				Outgoing: func(ctx context.Context, _ *bus.Outgoing, next bus.Next) error { out.Add(1); return next(ctx) },
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
