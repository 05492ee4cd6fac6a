package bustest_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
)

type OrderPlaced struct {
	ID string `json:"id"`
}

func (OrderPlaced) MessageName() string { return "shop.order_placed" }

type ShipOrder struct {
	ID string `json:"id"`
}

func (ShipOrder) MessageName() string { return "shipping.ship_order" }

// A middleware is unit-tested as a plain function: a stage context with
// no bus, and a next that records whether and how it was called.
func ExampleRecordNext() {
	type tenantKey struct{}
	tenancy := bus.Middleware{
		Name: "tenancy",
		Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
			tenant, ok := in.Attributes().StickyValue("tenant")
			if !ok {
				return nil // handled: no tenant, no handlers
			}
			return next.Call(context.WithValue(ctx, tenantKey{}, tenant))
		},
	}
	ctx := context.Background()

	rec := bustest.RecordNext(nil)
	in := bustest.Incoming(bustest.Delivery(OrderPlaced{ID: "o-1"}, bus.Attributes{}.WithSticky("tenant", "acme")))
	err := tenancy.Incoming(ctx, in, rec.IncomingNext())
	fmt.Println("with a tenant:", err, rec.Calls(), rec.Ctx().Value(tenantKey{}))

	rec = bustest.RecordNext(nil)
	in = bustest.Incoming(bustest.Delivery(OrderPlaced{ID: "o-2"}, bus.Attributes{}))
	err = tenancy.Incoming(ctx, in, rec.IncomingNext())
	fmt.Println("without:", err, rec.Called())
	// Output:
	// with a tenant: <nil> 1 acme
	// without: <nil> false
}

// A bus on a recording transport: what it sent and how it settled each
// message it received are read once it is idle. (The orders are sent
// before the bus starts, so that they are recorded before what the
// handler sends.)
func ExampleTransport() {
	tr := bustest.NewTransport()
	b, err := bus.New(bus.WithEndpoint("orders"), bus.WithTransport(tr), bus.WithLogger(slog.New(slog.DiscardHandler)),
		bus.WithConcurrency(1), bus.WithMaxAttempts(2),
		bus.WithHandler(func(ctx context.Context, m OrderPlaced, _ bus.Attributes) error {
			if m.ID == "o-2" {
				return errors.New("out of stock")
			}
			b, _, _ := bus.MessageContext(ctx)
			return b.Send(ctx, ShipOrder(m), bus.To("shipping"))
		}))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for _, id := range []string{"o-1", "o-2"} {
		if err := b.Send(ctx, OrderPlaced{ID: id}); err != nil {
			panic(err)
		}
	}
	if err := b.Start(ctx); err != nil {
		panic(err)
	}
	defer b.Stop(ctx)
	if err := tr.WaitIdle(ctx); err != nil {
		panic(err)
	}
	for _, s := range tr.Sent() {
		fmt.Printf("%s %s to %s: %s\n", s.Kind, s.Envelope.Name, s.Destination, s.Envelope.Body)
	}
	for _, s := range tr.Settled() {
		fmt.Printf("%s %s attempt %d\n", s.Envelope.Body, s.Outcome, s.Attempt)
	}
	// Output:
	// send shop.order_placed to orders: {"id":"o-1"}
	// send shop.order_placed to orders: {"id":"o-2"}
	// send shipping.ship_order to shipping: {"id":"o-1"}
	// {"id":"o-1"} deleted attempt 1
	// {"id":"o-2"} returned attempt 1
	// {"id":"o-2"} dead-lettered attempt 2
}
