// Package store keeps the durable state of the inbox, outbox and saga plugins in
// a SQL database: SQLite (the embedded default, package store/sqlite) or
// PostgreSQL (package store/postgres).
//
// One [*Store] holds both tables. Pass the same value to outbox.New and
// inbox.New and they share one transaction per handler: the handler's own
// writes, the messages it sends and the inbox record of the message commit
// or roll back together. That is what gives the exactly-once processing
// effect (see docs/plugins/outbox.md). It must be the same value, given to
// saga.New too: bus.New refuses the plugins of one bus on two stores (a
// *bus.TxSourceConflictError), the same database opened twice included,
// since each Store opens transactions of its own.
//
//	st, err := sqlite.Open("app.db")
//	if err != nil { ... }
//	defer st.Close()
//	b, err := bus.New(bus.WithEndpoint("orders"),
//		bus.WithMiddleware(outbox.New(st), inbox.New(st)), ...)
//
// The plugins do the work: a handler reads its transaction with
// outbox.Tx(ctx), and the relay dispatches what it stored. The methods of
// Store are for operating it: creating the tables ([Store.Migrate]),
// watching and requeueing parked messages ([Store.Parked],
// [Store.Requeue]), and looking at the inbox.
package store

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"strings"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/sqlstore"
)

// Default table names.
const (
	DefaultOutboxTable = "plugbus_outbox"
	DefaultInboxTable  = "plugbus_inbox"
	DefaultSagaTable   = "plugbus_saga"
)

// Dialect is the SQL flavour of a database: [SQLite] or [PostgreSQL].
// Packages store/sqlite and store/postgres pick it for you.
type Dialect uint8

// The dialects.
const (
	// SQLite is the dialect of modernc.org/sqlite (and SQLite in general).
	SQLite Dialect = iota + 1
	// PostgreSQL is the dialect of PostgreSQL through github.com/jackc/pgx/v5/stdlib.
	PostgreSQL
)

// sql returns the implementation's dialect, zero for an unknown one.
func (d Dialect) sql() sqlstore.Dialect {
	switch d {
	case SQLite:
		return sqlstore.SQLite
	case PostgreSQL:
		return sqlstore.PostgreSQL
	}
	return 0
}

// dialectOf returns the dialect of the implementation's d.
func dialectOf(d sqlstore.Dialect) Dialect {
	switch d {
	case sqlstore.SQLite:
		return SQLite
	case sqlstore.PostgreSQL:
		return PostgreSQL
	}
	return 0
}

// String returns the dialect's name: "sqlite" or "postgres".
func (d Dialect) String() string { return d.sql().String() }

// Rebind rewrites the ? placeholders of q for d: $1, $2, ... on PostgreSQL,
// unchanged on SQLite.
func (d Dialect) Rebind(q string) string { return d.sql().Rebind(q) }

// Notifier wakes outbox relays in other processes when messages are
// committed: PostgreSQL LISTEN/NOTIFY. Package store/postgres provides one.
type Notifier interface {
	// Listen calls wake for every notification on channel until ctx is
	// done. It returns ctx's error, or another error when the connection
	// is lost (the relay then listens again).
	Listen(ctx context.Context, channel string, wake func()) error
}

// Store is a SQL database holding the outbox and inbox tables. It is safe
// for concurrent use. Build it with [New], or with sqlite.Open /
// postgres.Open.
type Store sqlstore.Store

// impl returns the implementation, with the operations the plugins use.
func (s *Store) impl() *sqlstore.Store { return (*sqlstore.Store)(s) }

// New returns a store on db, whose SQL flavour is d. Table names are
// validated here: a name that is not an identifier returns an
// [*InvalidNameError]. New does not touch the database; the plugins create
// the tables when the bus starts, or call [Store.Migrate].
func New(db *sql.DB, d Dialect, opts ...Option) (*Store, error) {
	if db == nil {
		return nil, errors.New("store: New: nil *sql.DB")
	}
	if d.sql() == 0 {
		return nil, errors.New("store: New: unknown Dialect; use store.SQLite or store.PostgreSQL")
	}
	c := config{outbox: DefaultOutboxTable, inbox: DefaultInboxTable, saga: DefaultSagaTable,
		dispatchAttempts: DefaultDispatchAttempts, backoff: bus.Backoff{Initial: DefaultBackoffInitial, Max: DefaultBackoffMax}, timeout: DefaultTimeout}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	outbox, err := parseTable("WithOutboxTable", c.outbox, d)
	if err != nil {
		return nil, err
	}
	inbox, err := parseTable("WithInboxTable", c.inbox, d)
	if err != nil {
		return nil, err
	}
	if sameTable(d, outbox, inbox) {
		return nil, &InvalidNameError{Option: "WithInboxTable", Name: c.inbox, Reason: "the inbox and the outbox need different tables"}
	}
	saga, err := parseTable("WithSagaTable", c.saga, d)
	if err != nil {
		return nil, err
	}
	if sameTable(d, saga, outbox) || sameTable(d, saga, inbox) {
		return nil, &InvalidNameError{Option: "WithSagaTable", Name: c.saga, Reason: "the saga table must differ from the inbox and the outbox"}
	}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	return (*Store)(sqlstore.New(db, sqlstore.Config{Dialect: d.sql(), Outbox: outbox, Inbox: inbox, Saga: saga, Notifier: c.notifier,
		Logger: c.logger, CloseDB: c.closeDB, DispatchAttempts: c.dispatchAttempts, DispatchBackoff: c.backoff, Timeout: c.timeout})), nil
}

// sameTable reports whether a and b name one table of a database of
// dialect d: SQLite folds the case of identifiers, quoted ones included;
// PostgreSQL keeps the case of the quoted names the store uses.
func sameTable(d Dialect, a, b sqlstore.Table) bool {
	if d == SQLite {
		return strings.EqualFold(a.Schema, b.Schema) && strings.EqualFold(a.Name, b.Name)
	}
	return a == b
}

// DB returns the database.
func (s *Store) DB() *sql.DB { return s.impl().DB() }

// Dialect returns the store's SQL flavour.
func (s *Store) Dialect() Dialect { return dialectOf(s.impl().Dialect()) }

// OutboxTable returns the outbox table's name.
func (s *Store) OutboxTable() string { return s.impl().OutboxTable() }

// InboxTable returns the inbox table's name.
func (s *Store) InboxTable() string { return s.impl().InboxTable() }

// SagaTable returns the saga table's name.
func (s *Store) SagaTable() string { return s.impl().SagaTable() }

// ActiveSagas returns how many instances of the saga named saga are
// running: started and not completed (completed instances kept for
// saga.WithRetention are not counted).
func (s *Store) ActiveSagas(ctx context.Context, saga string) (int64, error) {
	return s.impl().ActiveSagas(ctx, saga)
}

// Close closes the database when the store opened it (sqlite.Open,
// postgres.Open); otherwise it does nothing.
func (s *Store) Close() error { return s.impl().Close() }

// Migrate creates the outbox, inbox and saga tables and their indexes when they
// do not exist, and adds the columns of this release to tables created by
// an earlier one. It is idempotent and safe to run from several processes
// at once; the plugins run it when the bus starts.
func (s *Store) Migrate(ctx context.Context) error { return s.impl().Migrate(ctx) }
