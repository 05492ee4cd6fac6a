package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugins/inbox"
	"github.com/plugbus/plugbus/plugins/outbox"
	"github.com/plugbus/plugbus/store/storetest"
	"github.com/plugbus/plugbus/transports/memory"
)

// Inside a handler of a bus with the inbox plugin alone on the store,
// Within joins the inbox's transaction: what it wrote is rolled back with
// the handler that fails after it.
func TestWithinJoinsTheInboxTransaction(t *testing.T) {
	db := storetest.New(t, storetest.SQLite)
	st := db.Open(t)
	data := db.Table("data")
	storetest.Exec(t, st.DB(), "CREATE TABLE "+data+" (n INTEGER NOT NULL)")
	if err := st.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	broker := memory.NewBroker()
	var b *bus.Bus
	b, err := bus.New(bus.WithEndpoint("worker"), bus.WithTransport(memory.New(memory.WithBroker(broker))),
		bus.WithMiddleware(inbox.New(st)), // no outbox plugin on this bus
		bus.WithHandler(func(ctx context.Context, m Work, _ bus.Attributes) error {
			err := outbox.Within(ctx, b, st, func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, db.Rebind("INSERT INTO "+data+" (n) VALUES (?)"), m.N)
				return err
			})
			if err != nil {
				return err
			}
			return bus.Permanent(errors.New("the handler fails after Within returned nil"))
		}, bus.HandlerName("work")))
	if err != nil {
		t.Fatal(err)
	}
	start(t, b)
	if err := b.Send(context.Background(), Work{N: 7}, bus.To("worker")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the dead letter", func() bool { return len(broker.DeadLetters("worker")) > 0 })
	if err := b.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := count(t, st.DB(), "SELECT count(*) FROM "+data); n != 0 {
		t.Fatalf("%d rows written by Within are left; want 0: rolled back with the handler", n)
	}
}
