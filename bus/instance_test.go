package bus_test

import (
	"context"
	"strings"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
	"github.com/plugbus/plugbus/transports/memory"
)

// New refuses a middleware that needs an instance queue on a transport
// that cannot give one.
func TestNewRefusesAnInstanceQueueOnATransportWithout(t *testing.T) {
	needs := bus.Middleware{Name: "replies", InstanceQueue: true}
	if _, err := bus.New(bus.WithTransport(nullTransport{}), bus.WithMiddleware(needs)); err == nil || !strings.Contains(err.Error(), "InstanceQueuer") {
		t.Fatalf("New with a transport lacking instance queues: %v", err)
	}
}

// A bus without an endpoint receives what is sent to its instance queue
// once started.
func TestInstanceQueueReceivesOnABusWithoutEndpoint(t *testing.T) {
	got := make(chan string, 1)
	needs := bus.Middleware{Name: "replies", InstanceQueue: true,
		Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
			got <- in.Name()
			return nil
		}}
	broker := memory.NewBroker()
	tr := memory.New(memory.WithBroker(broker))
	b, err := bus.New(bus.WithTransport(tr), bus.WithLogger(discard()), bus.WithMiddleware(needs)) // no endpoint
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer b.Stop(context.Background())
	other, _ := bus.New(bus.WithTransport(memory.New(memory.WithBroker(broker))), bus.WithLogger(discard()))
	defer other.Stop(context.Background())
	if err := other.Send(t.Context(), chargeCard{}, bus.To(tr.InstanceAddress())); err != nil {
		t.Fatal(err)
	}
	if name := await(t, got); name != "shop.charge_card" {
		t.Fatalf("instance received %s", name)
	}
}

// A handler waiting for a message on its instance queue (a reply) must get
// it although it holds the bus's only worker.
func TestInstanceQueueReceivedBesideBusyWorkers(t *testing.T) {
	tr := memory.New()
	replies := make(chan string, 1)
	resolver := bus.Middleware{Name: "replies", InstanceQueue: true,
		Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
			if in.Name() == "shop.charge_card" {
				replies <- in.Attributes().MessageID
				return nil // resolved without handlers
			}
			return next.Call(ctx)
		}}
	got := make(chan string, 1)
	b := bustest.Start(t, bus.WithEndpoint("ep"), bus.WithTransport(tr), bus.WithLogger(discard()), bus.WithConcurrency(1),
		bus.WithMiddleware(resolver),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			b, _, _ := bus.MessageContext(ctx)
			if err := b.Send(ctx, chargeCard{}, bus.To(tr.InstanceAddress()), bus.Immediately(), bus.WithMessageID("reply-1")); err != nil {
				return err
			}
			select { // the only worker waits here
			case id := <-replies:
				got <- id
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}))
	if err := b.Send(t.Context(), orderPlaced{}); err != nil {
		t.Fatal(err)
	}
	if id := await(t, got); id != "reply-1" {
		t.Fatalf("got %s", id)
	}
}
