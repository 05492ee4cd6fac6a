package store_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/store"
	"github.com/plugbus/plugbus/store/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestNewRefusesInvalidTableNames(t *testing.T) {
	db := &sql.DB{} // never used: names are checked before any query
	cases := []struct {
		d    store.Dialect
		opt  store.Option
		name string
	}{
		{store.SQLite, store.WithOutboxTable("bad name"), "space"},
		{store.SQLite, store.WithInboxTable("x;DROP TABLE y"), "injection"},
		{store.SQLite, store.WithOutboxTable("s.t"), "schema on sqlite"},
		{store.PostgreSQL, store.WithOutboxTable("a.b.c"), "three parts"},
		{store.PostgreSQL, store.WithOutboxTable(""), "empty"},
		{store.PostgreSQL, store.WithOutboxTable("1abc"), "leading digit"},
		{store.PostgreSQL, store.WithInboxTable(`in"box`), "quote"},
		{store.PostgreSQL, store.WithOutboxTable("x_1234567890123456789012345678901234567890123456789"), "too long"},
		{store.PostgreSQL, store.WithInboxTable("plugbus_outbox"), "same as outbox"},
		// SQLite folds the case of identifiers, quoted ones included.
		{store.SQLite, store.WithInboxTable("PLUGBUS_OUTBOX"), "same as outbox but for case on sqlite"},
		{store.SQLite, store.WithSagaTable("Plugbus_Inbox"), "saga same as inbox but for case on sqlite"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := store.New(db, c.d, c.opt)
			var ie *store.InvalidNameError
			if !errors.As(err, &ie) || !errors.Is(err, store.ErrInvalidName) {
				t.Fatalf("got %v, want *InvalidNameError", err)
			}
		})
	}
}

func TestNewAcceptsSchemaQualifiedTableOnPostgreSQL(t *testing.T) {
	st, err := store.New(&sql.DB{}, store.PostgreSQL, store.WithOutboxTable("app.outbox_1"))
	if err != nil {
		t.Fatalf("valid schema-qualified name refused: %v", err)
	}
	if got := st.OutboxTable(); got != "app.outbox_1" {
		t.Fatalf("OutboxTable = %q", got)
	}
}

// WithBackoff refuses a back-off whose delays make no sense, saying what
// to change; a zero field keeps its default (here Max, 5m, below the
// Initial given).
func TestWithBackoffRefusesInvalid(t *testing.T) {
	for _, b := range []bus.Backoff{{Initial: -time.Second}, {Initial: time.Hour}, {Initial: time.Second, Max: time.Millisecond}} {
		if _, err := store.New(&sql.DB{}, store.SQLite, store.WithBackoff(b)); err == nil || !strings.Contains(err.Error(), "store: WithBackoff") || !strings.Contains(err.Error(), "Initial") {
			t.Errorf("WithBackoff(%+v): %v, want an error saying what to change", b, err)
		}
	}
	if _, err := store.New(&sql.DB{}, store.SQLite, store.WithBackoff(bus.Backoff{Max: time.Hour})); err != nil {
		t.Errorf("WithBackoff with the default Initial: %v", err)
	}
}

func TestNewRefusesUnknownDialect(t *testing.T) {
	for _, d := range []store.Dialect{0, store.PostgreSQL + 1} {
		if _, err := store.New(&sql.DB{}, d); err == nil {
			t.Fatalf("New accepted Dialect(%d)", d)
		}
	}
}

func TestDialectRebindNumbersPlaceholdersOnPostgreSQL(t *testing.T) {
	const q = "SELECT ? WHERE a = ?"
	if got := store.SQLite.Rebind(q); got != q {
		t.Errorf("SQLite.Rebind = %q", got)
	}
	if got := store.PostgreSQL.Rebind(q); got != "SELECT $1 WHERE a = $2" {
		t.Errorf("PostgreSQL.Rebind = %q", got)
	}
	if store.SQLite.String() != "sqlite" || store.PostgreSQL.String() != "postgres" {
		t.Errorf("names %q, %q", store.SQLite, store.PostgreSQL)
	}
}

// Migrate creates the tables once; running it again, and from several
// stores on the same tables at once, is harmless.
func TestMigrateIsIdempotentAndSafeConcurrently(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		ctx := context.Background()
		var wg sync.WaitGroup
		for range 3 {
			other := db.Open(t)
			wg.Go(func() {
				if err := other.Migrate(ctx); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		st := db.Open(t)
		for range 2 {
			if err := st.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if n, err := st.Pending(ctx); err != nil || n != 0 {
			t.Fatalf("Pending on fresh tables = %d, %v", n, err)
		}
	})
}

// The inbox remembers a processed message per endpoint; recording it
// twice is not an error.
func TestProcessedAfterMarkProcessed(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		ctx := context.Background()
		st := migrated(t, db)
		if ok, err := st.Processed(ctx, "ep", "m1"); ok || err != nil {
			t.Fatalf("Processed before MarkProcessed = %v, %v", ok, err)
		}
		for range 2 {
			if err := st.MarkProcessed(ctx, "ep", "m1"); err != nil {
				t.Fatal(err)
			}
		}
		if ok, err := st.Processed(ctx, "ep", "m1"); !ok || err != nil {
			t.Fatalf("Processed = %v, %v", ok, err)
		}
		if ok, err := st.Processed(ctx, "other", "m1"); ok || err != nil {
			t.Fatalf("Processed on another endpoint = %v, %v; want false: records leak across endpoints", ok, err)
		}
	})
}

// PurgeProcessed deletes the records made before its time only.
func TestPurgeProcessedKeepsNewerRecords(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		ctx := context.Background()
		st := migrated(t, db)
		for _, id := range []string{"m1", "m2"} {
			if err := st.MarkProcessed(ctx, "ep", id); err != nil {
				t.Fatal(err)
			}
		}
		if n, err := st.PurgeProcessed(ctx, time.Now().Add(-time.Hour)); err != nil || n != 0 {
			t.Fatalf("PurgeProcessed of records older than an hour = %d, %v; want 0", n, err)
		}
		if n, err := st.PurgeProcessed(ctx, time.Now().Add(time.Hour)); err != nil || n != 2 {
			t.Fatalf("PurgeProcessed = %d, %v; want 2", n, err)
		}
		if ok, _ := st.Processed(ctx, "ep", "m1"); ok {
			t.Fatal("a purged record is still processed")
		}
	})
}

// migrated opens a store on db with its tables created.
func migrated(t *testing.T, db storetest.DB) *store.Store {
	t.Helper()
	st := db.Open(t)
	if err := st.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return st
}
