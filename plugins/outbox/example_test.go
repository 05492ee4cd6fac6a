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
