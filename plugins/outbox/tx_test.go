package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
	"github.com/plugbus/plugbus/plugins/inbox"
	"github.com/plugbus/plugbus/plugins/outbox"
	"github.com/plugbus/plugbus/store/storetest"
)

// TestTxWithoutTheOutboxIsErrNoTransaction: on a bus with neither the
// outbox nor the inbox, outbox.Tx returns outbox.ErrNoTransaction marked
// permanent, whose text says what to add, instead of a nil *sql.Tx that
// panics in the handler and is retried for minutes: the handler that
// returns it fails its message for good, with that reason. With the
// inbox alone on a SQL store, Tx is the inbox's transaction.
func TestTxWithoutTheOutboxIsErrNoTransaction(t *testing.T) {
	if _, err := outbox.Tx(context.Background()); !errors.Is(err, outbox.ErrNoTransaction) || !bus.IsPermanent(err) {
		t.Fatalf("Tx outside a handler = %v; want outbox.ErrNoTransaction, marked permanent", err)
	}

	db := storetest.New(t, storetest.SQLite)
	st := db.Open(t)
	data := db.Table("data")
	storetest.Exec(t, st.DB(), "CREATE TABLE "+data+" (n INTEGER NOT NULL)")
	if err := st.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	insert := func(ctx context.Context, m Work, _ bus.Attributes) error {
		tx, err := outbox.Tx(ctx)
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, "INSERT INTO "+data+" (n) VALUES (?)", m.N)
		return err
	}
	quiet := slog.New(slog.DiscardHandler)

	plain, err := bus.New(bus.WithEndpoint("worker"), bus.WithLogger(quiet), bus.WithHandler(insert, bus.HandlerName("insert")))
	if err != nil {
		t.Fatal(err)
	}
	err = plain.Deliver(t.Context(), bustest.Delivery(Work{N: 1}, bus.Attributes{MessageID: "m-1"}))
	if !errors.Is(err, outbox.ErrNoTransaction) || !bus.IsPermanent(err) || errors.Is(err, bus.ErrPanic) {
		t.Fatalf("Deliver on a bus without the outbox = %v; want a permanent outbox.ErrNoTransaction, no panic", err)
	}
	if !strings.Contains(err.Error(), "bus.WithMiddleware(outbox.New(st))") {
		t.Errorf("error %q; want it to say which plugin to add", err)
	}

	withInbox, err := bus.New(bus.WithEndpoint("worker"), bus.WithLogger(quiet), bus.WithMiddleware(inbox.New(st)),
		bus.WithHandler(insert, bus.HandlerName("insert")))
	if err != nil {
		t.Fatal(err)
	}
	if err := withInbox.Deliver(t.Context(), bustest.Delivery(Work{N: 2}, bus.Attributes{MessageID: "m-2"})); err != nil {
		t.Fatalf("Deliver on a bus with the inbox on a SQL store: %v; want Tx to be its transaction", err)
	}
	if n := count(t, st.DB(), "SELECT count(*) FROM "+data+" WHERE n = 2"); n != 1 {
		t.Fatalf("%d rows written through Tx; want 1, committed with the handler", n)
	}
	// A message without an id (a foreign publisher's) cannot be
	// deduplicated, but its handler still runs in the inbox's
	// transaction: it was run with none, and Tx's permanent
	// ErrNoTransaction dead-lettered it, saying to add the plugin the bus
	// has.
	noID := bustest.Delivery(Work{N: 3}, bus.Attributes{})
	noID.Attributes.MessageID = ""
	if err := withInbox.Deliver(t.Context(), noID); err != nil {
		t.Fatalf("Deliver of a message without an id on a bus with the inbox on a SQL store: %v; want Tx to be its transaction", err)
	}
	if n := count(t, st.DB(), "SELECT count(*) FROM "+data+" WHERE n = 3"); n != 1 {
		t.Fatalf("%d rows written through Tx for the message without an id; want 1", n)
	}
	if err := outbox.Within(t.Context(), withInbox, st, func(ctx context.Context, want *sql.Tx) error {
		got, err := outbox.Tx(ctx)
		if got != want || err != nil {
			t.Errorf("Tx in Within = %p, %v; want Within's transaction", got, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
