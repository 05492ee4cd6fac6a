package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugins/outbox"
	"github.com/plugbus/plugbus/store/sqlite"
)

type OrderPlaced struct{ ID int }

func (OrderPlaced) MessageName() string { return "orders.placed" }

type PlaceOrder struct{ ID int }

func (PlaceOrder) MessageName() string { return "orders.place" }

// A handler writes its data in its transaction (outbox.Tx) and publishes:
// the row and the message commit together, and the relay publishes the
// message after the commit.
func Example() {
	dir, _ := os.MkdirTemp("", "outbox-example")
	defer os.RemoveAll(dir)
	st, err := sqlite.Open(filepath.Join(dir, "orders.db"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer st.Close()
	ctx := context.Background()
	if _, err := st.DB().ExecContext(ctx, "CREATE TABLE orders (id INTEGER PRIMARY KEY)"); err != nil {
		fmt.Println(err)
		return
	}
	placed := make(chan int, 1)
	b, err := bus.New(bus.WithEndpoint("orders"), bus.WithLogger(slog.New(slog.DiscardHandler)),
		bus.WithMiddleware(outbox.New(st)),
		bus.WithHandler(func(ctx context.Context, m PlaceOrder, _ bus.Attributes) error {
			tx, err := outbox.Tx(ctx)
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, "INSERT INTO orders (id) VALUES (?)", m.ID); err != nil {
				return err
			}
			self, _, _ := bus.MessageContext(ctx)    // the bus handling m
			return self.Publish(ctx, OrderPlaced(m)) // stored in the same transaction
		}),
		bus.WithHandler(func(_ context.Context, m OrderPlaced, _ bus.Attributes) error { placed <- m.ID; return nil }))
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := b.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer b.Stop(ctx)

	if err := b.Send(ctx, PlaceOrder{ID: 42}, bus.To("orders")); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("published: order", <-placed)
	var orders int
	_ = st.DB().QueryRowContext(ctx, "SELECT count(*) FROM orders").Scan(&orders)
	fmt.Println("orders stored:", orders)
	// Output:
	// published: order 42
	// orders stored: 1
}

// An HTTP handler (no message drives it) writes an order and publishes
// OrderPlaced atomically with Within; the relay publishes after the commit.
func ExampleWithin() {
	dir, _ := os.MkdirTemp("", "outbox-example")
	defer os.RemoveAll(dir)
	st, err := sqlite.Open(filepath.Join(dir, "app.db"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer st.Close()
	ctx := context.Background()
	placed := make(chan int, 1)
	b, _ := bus.New(bus.WithEndpoint("shipping"), bus.WithLogger(slog.New(slog.DiscardHandler)),
		bus.WithMiddleware(outbox.New(st)),
		bus.WithHandler(func(_ context.Context, m OrderPlaced, _ bus.Attributes) error { placed <- m.ID; return nil }))
	if err := b.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer b.Stop(ctx)
	_, _ = st.DB().ExecContext(ctx, "CREATE TABLE orders (id INTEGER PRIMARY KEY)")

	err = outbox.Within(ctx, b, st, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, "INSERT INTO orders (id) VALUES (?)", 42); err != nil {
			return err
		}
		return b.Publish(ctx, OrderPlaced{ID: 42})
	})
	fmt.Println("committed:", err == nil)
	fmt.Println("shipping received order", <-placed)
	// Output:
	// committed: true
	// shipping received order 42
}
