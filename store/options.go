package store

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/plugbus/plugbus/bus"
)

// Option configures a [Store].
type Option func(*config) error

type config struct {
	outbox, inbox    string
	saga             string
	notifier         Notifier
	logger           *slog.Logger
	closeDB          bool
	dispatchAttempts int
	backoff          bus.Backoff
	timeout          time.Duration
}

// Defaults of [WithDispatchAttempts], [WithBackoff] and [WithTimeout].
const (
	DefaultDispatchAttempts = 10
	DefaultBackoffInitial   = time.Second
	DefaultBackoffMax       = 5 * time.Minute
	DefaultTimeout          = 30 * time.Second
)

// WithTimeout bounds each statement the store runs on its own (default
// [DefaultTimeout], 30s): the outbox relay's claim, its marks and its
// commit, the inbox's lookups and records, the cleanup jobs. A connection
// that goes silent without closing (a half-open TCP connection: a
// firewall or NAT that dropped it, a database host that vanished) then
// fails that statement after d, and the connection is discarded, instead
// of holding the relay or the message forever: the kernel would take many
// minutes to notice. The handler's own transaction runs under the
// handler's ctx: give handlers a deadline with middleware/timeout.
// docs/reliability.md says what a silent database does to a bus.
func WithTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("store: WithTimeout(%v): the timeout must be positive", d)
		}
		c.timeout = d
		return nil
	}
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
		c.dispatchAttempts = n
		return nil
	}
}

// WithBackoff sets how long a stored message the transport refused waits
// before the outbox relay tries it again: after its n-th failure, b.Delay(n),
// a random delay of at most Initial·2^(n-1), capped at Max ([bus.Backoff]).
// The other messages are dispatched meanwhile. A zero field keeps its
// default: Initial [DefaultBackoffInitial] (1s), Max [DefaultBackoffMax]
// (5m).
func WithBackoff(b bus.Backoff) Option {
	return func(c *config) error {
		b = bus.Backoff{Initial: cmp.Or(b.Initial, DefaultBackoffInitial), Max: cmp.Or(b.Max, DefaultBackoffMax)}
		if err := b.Validate(); err != nil {
			return fmt.Errorf("store: WithBackoff: %w", err)
		}
		c.backoff = b
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

// WithSagaTable names the table of saga instances (default
// "plugbus_saga"), shared by every saga of plugins/saga on this store. On
// PostgreSQL it may be schema-qualified ("app.sagas"); the schema must exist.
func WithSagaTable(name string) Option {
	return func(c *config) error { c.saga = name; return nil }
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
	return func(c *config) error { c.closeDB = true; return nil }
}
