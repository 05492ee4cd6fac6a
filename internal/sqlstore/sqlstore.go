// Package sqlstore is the implementation of package store: the outbox and
// inbox tables in SQL, and the operations on them that only the inbox and
// outbox plugins use (a handler's transaction, the relay's dispatch and
// its wake-up, the per-handler inbox records, the cleanup jobs).
//
// Package store declares its Store as this package's Store
// (`type Store sqlstore.Store`) with the methods users call; a plugin
// converts a *store.Store to a *sqlstore.Store to reach the rest.
package sqlstore

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/plugbus/plugbus/bus"
)

// Dialect is the SQL flavour of a database.
type Dialect uint8

// The dialects.
const (
	SQLite Dialect = iota + 1
	PostgreSQL
)

// String returns the dialect's name.
func (d Dialect) String() string {
	switch d {
	case SQLite:
		return "sqlite"
	case PostgreSQL:
		return "postgres"
	}
	return fmt.Sprintf("Dialect(%d)", uint8(d))
}

// HasSchemas reports whether table names may be schema-qualified.
func (d Dialect) HasSchemas() bool { return d == PostgreSQL }

// numberedPlaceholders reports whether placeholders are $1, $2, ... rather than ?.
func (d Dialect) numberedPlaceholders() bool { return d == PostgreSQL }

// rowLocks reports whether the database has FOR UPDATE SKIP LOCKED,
// NOTIFY and advisory locks, so that relays in several processes share
// one table.
func (d Dialect) rowLocks() bool { return d == PostgreSQL }

func (d Dialect) blobType() string {
	if d == PostgreSQL {
		return "BYTEA"
	}
	return "BLOB"
}

func (d Dialect) serialPrimaryKey() string {
	if d == PostgreSQL {
		return "BIGSERIAL PRIMARY KEY"
	}
	return "INTEGER PRIMARY KEY"
}

// Table is a table name, possibly schema-qualified, that package store
// validated as SQL identifiers.
type Table struct {
	Schema, Name string
}

func (t Table) quoted() string {
	if t.Schema != "" {
		return `"` + t.Schema + `"."` + t.Name + `"`
	}
	return `"` + t.Name + `"`
}

// String returns the table name as the user gave it.
func (t Table) String() string {
	if t.Schema != "" {
		return t.Schema + "." + t.Name
	}
	return t.Name
}

// Notifier wakes outbox relays in other processes when messages are
// committed. It has the method of store.Notifier, whose doc it follows.
type Notifier interface {
	Listen(ctx context.Context, channel string, wake func()) error
}

// Config is what package store validated from its options.
type Config struct {
	Dialect       Dialect
	Outbox, Inbox Table
	Saga          Table    // the saga table
	Notifier      Notifier // nil without one
	Logger        *slog.Logger
	CloseDB       bool // Close closes the database

	// DispatchAttempts is how many times a row is handed to the transport
	// before it is parked; a row refused n times waits
	// DispatchBackoff.Delay(n) before its next try.
	DispatchAttempts int
	DispatchBackoff  bus.Backoff
	// Timeout bounds each statement the store runs on its own (not in a
	// handler's transaction); zero means 30s.
	Timeout time.Duration
}

// retryPolicy says when a row the transport refused is tried again, and
// when it is parked.
type retryPolicy struct {
	attempts int
	backoff  bus.Backoff
}

// after returns the delay before the next try of a row that failed
// attempts times.
func (p retryPolicy) after(attempts int) time.Duration { return p.backoff.Delay(attempts) }

// Store is a SQL database holding the outbox and inbox tables. It is safe
// for concurrent use. Its fields are unexported: package store declares
// its Store on this struct.
type Store struct {
	db       *sql.DB
	dialect  Dialect
	outbox   Table
	inbox    Table
	saga     Table
	notifier Notifier
	logger   *slog.Logger
	closeDB  bool
	retry    retryPolicy
	timeout  time.Duration // of each statement the store runs on its own
	// purgeChunk is how many rows a purge deletes per statement, so that
	// none runs long or holds SQLite's write lock long after a backlog:
	// 5,000, less in tests (export_test.go).
	purgeChunk int
	queries    queries
	sagaQ      sagaQueries

	commitMu sync.Mutex
	commit   chan struct{} // closed, and replaced, at every commit that stores messages

	sqliteRelay sync.Mutex // SQLite has no row locks: one relay dispatches at a time

	migrateMu sync.Mutex
	migrated  bool
}

// New returns a store on db. It does not touch the database.
func New(db *sql.DB, c Config) *Store {
	s := &Store{db: db, dialect: c.Dialect, outbox: c.Outbox, inbox: c.Inbox, saga: c.Saga, notifier: c.Notifier, closeDB: c.CloseDB,
		retry:   retryPolicy{attempts: c.DispatchAttempts, backoff: c.DispatchBackoff},
		timeout: cmp.Or(c.Timeout, 30*time.Second), purgeChunk: 5000,
		logger: c.Logger.With(slog.String("store", c.Dialect.String())), commit: make(chan struct{}),
		queries: buildQueries(c.Dialect, c.Outbox, c.Inbox)}
	if s.saga.Name == "" {
		s.saga = Table{Name: "plugbus_saga"}
	}
	var sagaDDL []ddl
	sagaDDL, s.sagaQ = buildSagaQueries(c.Dialect, s.saga)
	s.queries.ddl = append(s.queries.ddl, sagaDDL...)
	return s
}

// DB returns the database.
func (s *Store) DB() *sql.DB { return s.db }

// Dialect returns the store's SQL flavour.
func (s *Store) Dialect() Dialect { return s.dialect }

// OutboxTable returns the outbox table's name.
func (s *Store) OutboxTable() string { return s.outbox.String() }

// InboxTable returns the inbox table's name.
func (s *Store) InboxTable() string { return s.inbox.String() }

// Notifier returns the notifier of the configuration, or nil.
func (s *Store) Notifier() Notifier { return s.notifier }

// Channel is the LISTEN/NOTIFY channel on which commits to the outbox are
// announced.
func (s *Store) Channel() string {
	h := fnv.New32a()
	h.Write([]byte(s.outbox.String()))
	return fmt.Sprintf("plugbus_outbox_%08x", h.Sum32())
}

// Close closes the database when the configuration says so.
func (s *Store) Close() error {
	if s.closeDB {
		return s.db.Close()
	}
	return nil
}

// Migrate creates the outbox, inbox and saga tables and their indexes when they
// do not exist, and adds the columns of this release to tables created by
// an earlier one. It is idempotent and safe to run from several processes
// at once.
func (s *Store) Migrate(ctx context.Context) error {
	s.migrateMu.Lock()
	defer s.migrateMu.Unlock()
	if s.migrated {
		return nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: migrate: %w", err)
	}
	defer tx.Rollback()
	if s.dialect.rowLocks() {
		// Concurrent CREATE TABLE IF NOT EXISTS can race in PostgreSQL.
		// One lock for every store of the database: stores may share a
		// table (the saga table, by default).
		h := fnv.New64a()
		h.Write([]byte("plugbus-migrate"))
		if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", int64(h.Sum64())); err != nil {
			return fmt.Errorf("store: migrate: taking the migration lock: %w", err)
		}
	}
	for _, d := range s.queries.ddl {
		if s.dialect == PostgreSQL {
			// CREATE ... IF NOT EXISTS takes its lock before it looks:
			// CREATE INDEX a SHARE lock on the table, which waits for the
			// handlers of running buses writing to it while this
			// transaction holds the locks of the statements before, and
			// the handlers wait for those: a deadlock when a bus starts
			// beside running ones. Look first, as addColumn does.
			var exists bool
			if err := tx.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, d.object).Scan(&exists); err != nil {
				return fmt.Errorf("store: migrate: looking for %s: %w", d.object, err)
			}
			if exists {
				continue
			}
		}
		if _, err := tx.ExecContext(ctx, d.stmt); err != nil {
			return fmt.Errorf("store: migrate: %s: %w", firstLine(d.stmt), err)
		}
	}
	for _, c := range s.queries.addColumns {
		if err := s.addColumn(ctx, tx, c); err != nil {
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: migrate: commit: %w", err)
	}
	s.migrated = true
	return nil
}

// addColumn adds c to a table created by an earlier release. It looks
// first: ALTER TABLE takes an exclusive lock even when the column exists,
// which would deadlock with relays of running buses on PostgreSQL.
func (s *Store) addColumn(ctx context.Context, tx *sql.Tx, c addColumn) error {
	var n int
	var err error
	stmt := `ALTER TABLE ` + c.table.quoted() + ` ADD COLUMN ` + c.name + ` ` + c.def
	if s.dialect == PostgreSQL {
		err = tx.QueryRowContext(ctx, `SELECT count(*) FROM information_schema.columns
WHERE table_schema = COALESCE(NULLIF($1, ''), current_schema()) AND table_name = $2 AND column_name = $3`,
			c.table.Schema, c.table.Name, c.name).Scan(&n)
		stmt = `ALTER TABLE ` + c.table.quoted() + ` ADD COLUMN IF NOT EXISTS ` + c.name + ` ` + c.def
	} else {
		err = tx.QueryRowContext(ctx, `SELECT count(*) FROM pragma_table_info(?) WHERE name = ?`, c.table.Name, c.name).Scan(&n)
	}
	if err != nil {
		return fmt.Errorf("store: migrate: reading the columns of %s: %w", c.table, err)
	}
	if n > 0 {
		return nil
	}
	if _, err := tx.ExecContext(ctx, stmt); err != nil {
		return fmt.Errorf("store: migrate: adding column %s to %s: %w", c.name, c.table, err)
	}
	return nil
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// Wake wakes the relays of this process as if messages were committed:
// for a commit the [Notifier] reports from another process, and after a
// requeue.
func (s *Store) Wake() {
	s.commitMu.Lock()
	close(s.commit)
	s.commit = make(chan struct{})
	s.commitMu.Unlock()
}

// Committed returns a channel closed at the next commit that stores
// outgoing messages in this process (or the next [Store.Wake]). Take it
// before looking for messages, so that no commit is missed.
func (s *Store) Committed() <-chan struct{} {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	return s.commit
}
