package sqlstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"

	"github.com/plugbus/plugbus/internal/sqlstore"
	"github.com/plugbus/plugbus/store/storetest"
)

// Migrate adds the columns of this release to an outbox table created by
// an earlier one, keeping its rows.
func TestMigrateAddsColumns(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		ctx := context.Background()
		st := (*sqlstore.Store)(db.Open(t))
		blob, serial := "BLOB", "INTEGER PRIMARY KEY"
		if db.Kind == storetest.Postgres {
			blob, serial = "BYTEA", "BIGSERIAL PRIMARY KEY"
		}
		storetest.Exec(t, st.DB(), `CREATE TABLE `+st.OutboxTable()+` (id `+serial+`, message_id TEXT NOT NULL, kind SMALLINT NOT NULL,
	destination TEXT NOT NULL, name TEXT NOT NULL, content_type TEXT NOT NULL, body `+blob+` NOT NULL, correlation_id TEXT NOT NULL,
	sent_at BIGINT NOT NULL, attrs TEXT NOT NULL, headers TEXT NOT NULL, created_at BIGINT NOT NULL, dispatched_at BIGINT,
	attempts INTEGER NOT NULL DEFAULT 0, last_error TEXT)`)
		storetest.Exec(t, st.DB(), `INSERT INTO `+st.OutboxTable()+` (message_id, kind, destination, name, content_type, body, correlation_id, sent_at, attrs, headers, created_at)
	VALUES ('old-1', 1, 'dest', 'test.msg', 'application/json', '{}', 'c', 0, '{}', '{}', 0)`)
		for range 2 { // idempotent
			if err := st.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			if err := db.Open(t).Migrate(ctx); err != nil { // another store on the same tables
				t.Fatal(err)
			}
		}
		if ids, n, err := dispatchedIDs(t, st, 10); n != 1 || err != nil || ids[0] != "old-1" {
			t.Fatalf("DispatchPending on a migrated table = %d, %v, %v; want old-1", n, ids, err)
		}
		// The added due_at column takes the due time of a new row.
		m := testMessage(1)
		m.Envelope.Due = time.Unix(1800000000, 5)
		storeEach(t, st, m)
		var due time.Time
		if _, err := st.DispatchPending(ctx, 10, func(_ context.Context, m bus.Outbound) error { due = m.Envelope.Due; return nil }); err != nil || !due.Equal(time.Unix(1800000000, 5)) {
			t.Fatalf("a row stored after the migration dispatched with due %v, %v; want its due time", due, err)
		}
	})
}

// TestMigrateBesideRunningBuses: a bus that starts (and migrates) while
// others write to the tables in open transactions does not wait for them,
// and stores migrating at once all succeed. CREATE INDEX IF NOT EXISTS
// takes a SHARE lock on PostgreSQL even when the index exists, which used
// to deadlock a starting bus with running handlers.
func TestMigrateBesideRunningBuses(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		ctx := context.Background()
		st := openMigrated(t, db)
		errs := make(chan error, 4)
		for range 4 {
			s := (*sqlstore.Store)(db.Open(t)) // on the test's goroutine: Open may t.Fatal
			go func() { errs <- s.Migrate(ctx) }()
		}
		for range 4 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		if db.Kind != storetest.Postgres {
			return // SQLite's writers take turns: an open write transaction blocks any other
		}
		tx, err := st.DB().BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+st.SagaTable()+` (saga, correlation, instance_id, version, state, created_at, updated_at) VALUES ('s', 'k', 'i', 1, '\x7b7d', 0, 0)`); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+st.InboxTable()+` (endpoint, message_id, handler, processed_at) VALUES ('e', 'm', 'h', 0)`); err != nil {
			t.Fatal(err)
		}
		mctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := (*sqlstore.Store)(db.Open(t)).Migrate(mctx); err != nil {
			t.Fatalf("Migrate beside an open transaction writing the tables: %v", err)
		}
	})
}
