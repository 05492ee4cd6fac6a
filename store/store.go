// Package store keeps the durable state of the inbox and outbox plugins in
// a SQL database: SQLite (the embedded default, package store/sqlite) or
// PostgreSQL (package store/postgres).
//
// One [*Store] holds both tables. Pass the same value to outbox.New and
// inbox.New and they share one transaction per handler: the handler's own
// writes, the messages it sends and the inbox record of the message commit
// or roll back together. That is what gives the exactly-once processing
// effect (see docs/plugins/outbox.md).
//
//	st, err := sqlite.Open("app.db")
//	b, err := bus.New(bus.WithEndpoint("orders"),
//		bus.WithMiddleware(outbox.New(st), inbox.New(st)), ...)
//
// Most code never calls the methods of Store directly: the plugins do. The
// transaction of a handler is read with outbox.Tx(ctx) or [TxFrom].
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"time"
)

// Default table names.
const (
	DefaultOutboxTable = "plugbus_outbox"
	DefaultInboxTable  = "plugbus_inbox"
)

// Dialect is the SQL flavour of a database. Use [SQLite] or [PostgreSQL];
// packages store/sqlite and store/postgres pick it for you.
type Dialect struct {
	name       string
	numbered   bool   // $1 placeholders instead of ?
	blob       string // binary column type
	serial     string // auto-increment primary key column definition
	skipLocked bool   // FOR UPDATE SKIP LOCKED and pg_notify
	schemas    bool   // table names may be schema-qualified
}

// SQLite is the dialect of modernc.org/sqlite (and SQLite in general).
var SQLite = Dialect{name: "sqlite", blob: "BLOB", serial: "INTEGER PRIMARY KEY"}

// PostgreSQL is the dialect of PostgreSQL through github.com/jackc/pgx/v5/stdlib.
var PostgreSQL = Dialect{name: "postgres", numbered: true, blob: "BYTEA", serial: "BIGSERIAL PRIMARY KEY", skipLocked: true, schemas: true}

// String returns the dialect's name.
func (d Dialect) String() string { return d.name }

// ErrInvalidName is matched by [*InvalidNameError].
var ErrInvalidName = errors.New("store: invalid table name")

// InvalidNameError reports a table name that is not a plain SQL identifier.
// Table names are put in SQL text, so only identifiers are accepted.
type InvalidNameError struct {
	Option string // the option that received it
	Name   string
	Reason string
}

// Error implements error.
func (e *InvalidNameError) Error() string {
	return fmt.Sprintf("store: %s(%q): %s; use letters, digits and underscores, starting with a letter or underscore, at most %d characters", e.Option, e.Name, e.Reason, maxIdent)
}

// Is reports whether target is ErrInvalidName.
func (e *InvalidNameError) Is(target error) bool { return target == ErrInvalidName }

// maxIdent leaves room for index name suffixes within PostgreSQL's 63 bytes.
const maxIdent = 48

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// tableName is a validated, possibly schema-qualified, table name.
type tableName struct {
	schema, name string
}

func (t tableName) quoted() string {
	if t.schema != "" {
		return `"` + t.schema + `"."` + t.name + `"`
	}
	return `"` + t.name + `"`
}

func (t tableName) String() string {
	if t.schema != "" {
		return t.schema + "." + t.name
	}
	return t.name
}

func parseTable(option, s string, d Dialect) (tableName, error) {
	parts := strings.Split(s, ".")
	if len(parts) > 2 || (len(parts) == 2 && !d.schemas) {
		reason := "too many dots"
		if !d.schemas {
			reason = d.name + " has no schemas: give a table name without a dot"
		}
		return tableName{}, &InvalidNameError{Option: option, Name: s, Reason: reason}
	}
	for _, p := range parts {
		switch {
		case p == "":
			return tableName{}, &InvalidNameError{Option: option, Name: s, Reason: "empty identifier"}
		case len(p) > maxIdent:
			return tableName{}, &InvalidNameError{Option: option, Name: s, Reason: "identifier too long"}
		case !identRE.MatchString(p):
			return tableName{}, &InvalidNameError{Option: option, Name: s, Reason: "not an SQL identifier"}
		}
	}
	if len(parts) == 2 {
		return tableName{schema: parts[0], name: parts[1]}, nil
	}
	return tableName{name: parts[0]}, nil
}

// Notifier wakes outbox relays in other processes when messages are
// committed: PostgreSQL LISTEN/NOTIFY. Package store/postgres provides one.
type Notifier interface {
	// Listen calls wake for every notification on channel until ctx is
	// done. It returns ctx's error, or another error when the connection
	// is lost (the relay then listens again).
	Listen(ctx context.Context, channel string, wake func()) error
}

// Option configures a [Store].
type Option func(*config) error

type config struct {
	outbox, inbox string
	notifier      Notifier
	logger        *slog.Logger
	owned         bool
	retry         retryPolicy
}

// retryPolicy says when a row the transport refused is tried again, and
// when it is parked.
type retryPolicy struct {
	attempts    int
	first, most time.Duration
}

// Defaults of [WithDispatchAttempts] and [WithDispatchBackoff].
const (
	DefaultDispatchAttempts   = 10
	DefaultDispatchBackoff    = time.Second
	DefaultDispatchMaxBackoff = 5 * time.Minute
)

// after returns the delay before the next try of a row that failed
// attempts times: first, doubling, at most most.
func (p retryPolicy) after(attempts int) time.Duration {
	d := p.first
	for i := 1; i < attempts && d < p.most; i++ {
		d *= 2
	}
	return min(d, p.most)
}

// WithDispatchAttempts sets how many times the outbox relay hands a stored
// message to the transport before it parks it (default 10): a parked row
// stays in the table with its last error, is no longer dispatched, and is
// listed by [Store.Parked] and sent again after [Store.Requeue].
func WithDispatchAttempts(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return fmt.Errorf("store: WithDispatchAttempts(%d): give at least 1", n)
		}
		c.retry.attempts = n
		return nil
	}
}

// WithDispatchBackoff sets how long a stored message the transport refused
// waits before it is tried again: first after the first failure, doubling
// after each further one, at most most (default 1s doubling to 5m). The
// other messages are dispatched meanwhile.
func WithDispatchBackoff(first, most time.Duration) Option {
	return func(c *config) error {
		if first <= 0 || most < first {
			return fmt.Errorf("store: WithDispatchBackoff(%s, %s): first must be positive and at most most", first, most)
		}
		c.retry.first, c.retry.most = first, most
		return nil
	}
}

// WithOutboxTable names the outbox table (default "plugbus_outbox"). On
// PostgreSQL it may be schema-qualified ("app.outbox"); the schema must exist.
func WithOutboxTable(name string) Option {
	return func(c *config) error { c.outbox = name; return nil }
}

// WithInboxTable names the inbox table (default "plugbus_inbox"). On
// PostgreSQL it may be schema-qualified ("app.inbox"); the schema must exist.
func WithInboxTable(name string) Option {
	return func(c *config) error { c.inbox = name; return nil }
}

// WithNotifier wakes relays in other processes on commit. Package
// store/postgres sets it.
func WithNotifier(n Notifier) Option {
	return func(c *config) error { c.notifier = n; return nil }
}

// WithLogger sets the logger. The default is slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return errors.New("store: WithLogger: nil logger")
		}
		c.logger = l
		return nil
	}
}

// WithCloseDB makes [Store.Close] close the database. Open functions of
// the dialect packages set it.
func WithCloseDB() Option {
	return func(c *config) error { c.owned = true; return nil }
}

// Store is a SQL database holding the outbox and inbox tables. It is safe
// for concurrent use. Build it with [New], or with sqlite.Open /
// postgres.Open.
type Store struct {
	db       *sql.DB
	d        Dialect
	outbox   tableName
	inbox    tableName
	notifier Notifier
	logger   *slog.Logger
	owned    bool
	retry    retryPolicy
	q        queries

	sigMu  sync.Mutex
	sig    chan struct{} // closed and replaced on every commit that stored messages
	relay  sync.Mutex    // one SQLite relay at a time
	migrMu sync.Mutex
	migr   bool
}

// New returns a store on db, whose SQL flavour is d. Table names are
// validated here: a name that is not an identifier returns an
// [*InvalidNameError]. New does not touch the database; the plugins create
// the tables when the bus starts, or call [Store.Migrate].
func New(db *sql.DB, d Dialect, opts ...Option) (*Store, error) {
	if db == nil {
		return nil, errors.New("store: New: nil *sql.DB")
	}
	if d.name == "" {
		return nil, errors.New("store: New: zero Dialect; use store.SQLite or store.PostgreSQL")
	}
	c := config{outbox: DefaultOutboxTable, inbox: DefaultInboxTable,
		retry: retryPolicy{attempts: DefaultDispatchAttempts, first: DefaultDispatchBackoff, most: DefaultDispatchMaxBackoff}}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	ot, err := parseTable("WithOutboxTable", c.outbox, d)
	if err != nil {
		return nil, err
	}
	it, err := parseTable("WithInboxTable", c.inbox, d)
	if err != nil {
		return nil, err
	}
	if ot == it {
		return nil, &InvalidNameError{Option: "WithInboxTable", Name: c.inbox, Reason: "the inbox and the outbox need different tables"}
	}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	s := &Store{db: db, d: d, outbox: ot, inbox: it, notifier: c.notifier, owned: c.owned, retry: c.retry,
		logger: c.logger.With(slog.String("store", d.name)), sig: make(chan struct{})}
	s.q = buildQueries(d, ot, it)
	return s, nil
}

// DB returns the database.
func (s *Store) DB() *sql.DB { return s.db }

// Dialect returns the store's SQL flavour.
func (s *Store) Dialect() Dialect { return s.d }

// OutboxTable returns the outbox table's name.
func (s *Store) OutboxTable() string { return s.outbox.String() }

// InboxTable returns the inbox table's name.
func (s *Store) InboxTable() string { return s.inbox.String() }

// Notifier returns the notifier set with [WithNotifier], or nil.
func (s *Store) Notifier() Notifier { return s.notifier }

// Channel is the LISTEN/NOTIFY channel on which commits to the outbox are
// announced.
func (s *Store) Channel() string {
	h := fnv.New32a()
	h.Write([]byte(s.outbox.String()))
	return fmt.Sprintf("plugbus_outbox_%08x", h.Sum32())
}

// Close closes the database when the store opened it (sqlite.Open,
// postgres.Open); otherwise it does nothing.
func (s *Store) Close() error {
	if s.owned {
		return s.db.Close()
	}
	return nil
}

// Migrate creates the outbox and inbox tables and their indexes when they
// do not exist. It is idempotent and safe to run from several processes at
// once; the plugins run it when the bus starts.
func (s *Store) Migrate(ctx context.Context) error {
	s.migrMu.Lock()
	defer s.migrMu.Unlock()
	if s.migr {
		return nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: migrate: %w", err)
	}
	defer tx.Rollback()
	if s.d.skipLocked {
		// Concurrent CREATE TABLE IF NOT EXISTS can race in PostgreSQL.
		h := fnv.New64a()
		h.Write([]byte("plugbus-migrate:" + s.outbox.String() + "/" + s.inbox.String()))
		if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", int64(h.Sum64())); err != nil {
			return fmt.Errorf("store: migrate: taking the migration lock: %w", err)
		}
	}
	for _, stmt := range s.q.ddl {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("store: migrate: %s: %w", firstLine(stmt), err)
		}
	}
	for _, c := range s.q.addColumns {
		if err := s.addColumn(ctx, tx, c); err != nil {
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: migrate: commit: %w", err)
	}
	s.migr = true
	return nil
}

// addColumn adds c to a table created by an earlier release. It looks
// first: ALTER TABLE takes an exclusive lock even when the column exists,
// which would deadlock with relays of running buses on PostgreSQL.
func (s *Store) addColumn(ctx context.Context, tx *sql.Tx, c addColumn) error {
	var n int
	var err error
	stmt := `ALTER TABLE ` + c.table.quoted() + ` ADD COLUMN ` + c.name + ` ` + c.def
	if s.d.skipLocked {
		err = tx.QueryRowContext(ctx, `SELECT count(*) FROM information_schema.columns
WHERE table_schema = COALESCE(NULLIF($1, ''), current_schema()) AND table_name = $2 AND column_name = $3`,
			c.table.schema, c.table.name, c.name).Scan(&n)
		stmt = `ALTER TABLE ` + c.table.quoted() + ` ADD COLUMN IF NOT EXISTS ` + c.name + ` ` + c.def
	} else {
		err = tx.QueryRowContext(ctx, `SELECT count(*) FROM pragma_table_info(?) WHERE name = ?`, c.table.name, c.name).Scan(&n)
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

// signal wakes the relays of this process.
func (s *Store) signal() {
	s.sigMu.Lock()
	close(s.sig)
	s.sig = make(chan struct{})
	s.sigMu.Unlock()
}

// Wake wakes the relays of this process as if messages were committed. A
// [Notifier] calls it for notifications from other processes.
func (s *Store) Wake() { s.signal() }

// Committed returns a channel closed at the next commit that stores
// outgoing messages in this process (or the next [Store.Wake]). Take it
// before looking for messages, so that no commit is missed.
func (s *Store) Committed() <-chan struct{} {
	s.sigMu.Lock()
	defer s.sigMu.Unlock()
	return s.sig
}
