package inbox_test

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugins/inbox"
)

// Charge asks billing to charge an order.
type Charge struct{ Order string }

func (Charge) MessageName() string { return "billing.charge" }

// A message delivered twice with one message id (a redelivery after a
// lost acknowledgement, an outbox relay that re-dispatched) is handled
// once. In production, use the SQL store of the outbox (inbox.New(st)).
func Example() {
	ctx := context.Background()
	charged := make(chan string, 3)
	b, err := bus.New(bus.WithEndpoint("billing"), bus.WithConcurrency(1), bus.WithLogger(slog.New(slog.DiscardHandler)),
		bus.WithMiddleware(inbox.New(inbox.NewMemoryStore())),
		bus.WithHandler(func(_ context.Context, m Charge, _ bus.Attributes) error {
			charged <- m.Order
			return nil
		}))
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := b.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer b.Stop(ctx)

	for _, c := range []struct{ id, order string }{{"msg-1", "order-1"}, {"msg-1", "order-1"}, {"msg-2", "order-2"}} {
		if err := b.Send(ctx, Charge{Order: c.order}, bus.To("billing"), bus.WithMessageID(c.id)); err != nil {
			fmt.Println(err)
			return
		}
	}
	// One at a time, in order: by the time order-2 is charged, the
	// duplicate of msg-1 was skipped.
	fmt.Println("charged", <-charged)
	fmt.Println("charged", <-charged)
	// Output:
	// charged order-1
	// charged order-2
}
