package saga_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugins/inbox"
	"github.com/plugbus/plugbus/plugins/outbox"
	"github.com/plugbus/plugbus/plugins/saga"
	"github.com/plugbus/plugbus/store/sqlite"
)

// An order saga on SQLite: placed, then paid, which completes it; a payment
// timeout would cancel it if the payment did not come within a minute.
func Example() {
	dir, _ := os.MkdirTemp("", "saga-example-")
	defer os.RemoveAll(dir)
	st, err := sqlite.Open(filepath.Join(dir, "orders.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()

	done := make(chan string, 1)
	orders := saga.New[Order]("order", st)
	saga.StartedBy(orders, saga.By(func(m Placed) string { return m.OrderID }), func(c *saga.Context[Order], m Placed) error {
		c.State.Amount = m.Amount
		return c.RequestTimeout(time.Minute, PaymentOverdue{OrderID: m.OrderID})
	})
	saga.Handles(orders, saga.By(func(m Paid) string { return m.OrderID }), func(c *saga.Context[Order], m Paid) error {
		c.State.Paid = true
		c.Complete()
		done <- fmt.Sprintf("order %s paid %d", c.ID(), c.State.Amount)
		return nil
	})
	saga.HandlesTimeout(orders, func(c *saga.Context[Order], m PaymentOverdue) error {
		c.Complete()
		return c.Publish(Cancelled(m))
	})

	ctx := context.Background()
	b, err := bus.New(bus.WithEndpoint("orders"),
		bus.WithMiddleware(outbox.New(st), inbox.New(st)),
		orders.Option())
	if err != nil {
		log.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer b.Stop(ctx)
	_ = b.Send(ctx, Placed{OrderID: "o-1", Amount: 42}, bus.To("orders"))
	// Paid continues an instance: wait until the order is stored (Paid
	// for no instance would be ignored).
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for n := int64(0); n == 0; <-tick.C {
		n, _ = st.ActiveSagas(ctx, "order")
	}
	_ = b.Send(ctx, Paid{OrderID: "o-1"}, bus.To("orders"))
	fmt.Println(<-done)
	// Output: order o-1 paid 42
}
