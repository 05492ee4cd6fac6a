// Package outbox is the durable, transactional outbox of plugbus.
//
// With the plugin on a bus, every handler runs in a database transaction
// of a [store.Store]. The handler writes its own data in that transaction
// (read it with [Tx]) and the messages it sends are stored in the same
// transaction, as finished messages (outgoing middleware already ran),
// instead of being buffered in memory. The transaction commits when the
// handler succeeds and rolls back when it fails, so the data and the
// messages are kept or lost together.
//
// A relay, started and stopped with the bus, hands the committed messages
// to the bus's transport with [bus.Bus.DispatchBatch] (same message id, no
// middleware re-run; each claimed batch at once, so on a transport that
// takes batches, bus.Batcher, it costs about one confirm round trip),
// marks them dispatched and deletes them after the
// retention window. It wakes on commit and polls as a fallback.
//
//	st, err := sqlite.Open("orders.db")
//	if err != nil { ... }
//	defer st.Close()
//	b, err := bus.New(bus.WithEndpoint("orders"),
//		bus.WithMiddleware(outbox.New(st), inbox.New(st)),
//		bus.WithHandler(func(ctx context.Context, m PlaceOrder, _ bus.Attributes) error {
//			tx, err := outbox.Tx(ctx)
//			if err != nil {
//				return err // outbox.ErrNoTransaction: the bus has neither plugin
//			}
//			if _, err := tx.ExecContext(ctx, "INSERT INTO orders (id) VALUES (?)", m.ID); err != nil {
//				return err
//			}
//			self, _, _ := bus.MessageContext(ctx) // the bus handling m
//			return self.Publish(ctx, OrderPlaced{ID: m.ID}) // stored in the same transaction
//		}))
//
// Outside handlers, [Within] gives the same guarantee to code that is not
// driven by a message (an HTTP handler writing an order and publishing
// OrderPlaced).
//
// The outbox, the inbox and the sagas of a bus must share one store: a
// handler runs in one transaction, and bus.New refuses plugins on two
// stores (a *bus.TxSourceConflictError), and the plugin given twice (a
// *bus.DuplicateMiddlewareError). See docs/plugins/outbox.md.
package outbox

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/sqlstore"
	"github.com/plugbus/plugbus/internal/wait"
	"github.com/plugbus/plugbus/store"
)

// Option configures the outbox plugin.
type Option func(*config)

type config struct {
	batch        int
	poll         time.Duration
	retention    time.Duration
	cleanup      time.Duration
	noRelay      bool
	noMigrate    bool
	backoff      bus.Backoff
	relayWorkers int
}

// Defaults of [WithBackoff].
const (
	DefaultBackoffInitial = 100 * time.Millisecond
	DefaultBackoffMax     = 30 * time.Second
)

// WithBackoff sets the relay's back-off while it cannot work: when a
// round dispatched nothing because the database or the transport is down,
// and when listening for commits (PostgreSQL) failed. Its n-th retry in a
// row waits b.Delay(n), a random delay of at most Initial·2^(n-1), capped
// at Max ([bus.Backoff]); the count starts again after a round that worked.
// A zero field keeps its default: Initial [DefaultBackoffInitial] (100ms),
// Max [DefaultBackoffMax] (30s). A message the transport refuses alone
// waits the store's back-off instead (store.WithBackoff).
func WithBackoff(b bus.Backoff) Option { return func(c *config) { c.backoff = b } }

// WithBatchSize sets how many messages the relay takes per round (default 500).
func WithBatchSize(n int) Option { return func(c *config) { c.batch = n } }

// WithPollInterval sets how often the relay looks for messages when no
// commit woke it (default 1s). Commits in this process, and on PostgreSQL
// in any process, wake it at once.
func WithPollInterval(d time.Duration) Option { return func(c *config) { c.poll = d } }

// WithRetention sets how long dispatched messages stay in the table before
// the cleanup job deletes them (default 24h). Keep it at least as long as
// you may want to inspect what was sent.
func WithRetention(d time.Duration) Option { return func(c *config) { c.retention = d } }

// WithCleanupInterval sets how often dispatched messages older than the
// retention are deleted (default 1m).
func WithCleanupInterval(d time.Duration) Option { return func(c *config) { c.cleanup = d } }

// WithRelays sets how many relay loops this bus runs (default 1). More
// than one helps only on PostgreSQL, where they share rows with SKIP LOCKED;
// on SQLite they take turns.
func WithRelays(n int) Option { return func(c *config) { c.relayWorkers = n } }

// WithoutRelay stores messages but runs no relay in this bus: another bus
// or process on the same store dispatches them.
func WithoutRelay() Option { return func(c *config) { c.noRelay = true } }

// WithoutMigrate does not create the tables at start; run [store.Store.Migrate]
// (or your own migrations with the same schema) beforehand.
func WithoutMigrate() Option { return func(c *config) { c.noMigrate = true } }

// Plugin is the outbox plugin: a [bus.Plugin] over one store.
type Plugin struct {
	store *sqlstore.Store
	cfg   config
}

// New returns the outbox plugin on s. Pass the same store to inbox.New to
// record processed messages in the handler's transaction, and to saga.New:
// bus.New refuses the plugins of one bus on different stores (the same
// database opened twice is two stores) with a *bus.TxSourceConflictError,
// and the outbox given twice with a *bus.DuplicateMiddlewareError.
func New(s *store.Store, opts ...Option) *Plugin {
	c := config{batch: 500, poll: time.Second, retention: 24 * time.Hour, cleanup: time.Minute, relayWorkers: 1}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	return &Plugin{store: (*sqlstore.Store)(s), cfg: c}
}

// ErrNoStore is returned when the plugin is given no store.
var ErrNoStore = errors.New("outbox: nil store: pass the *store.Store from sqlite.Open or postgres.Open")

// Instantiate makes the outbox middleware of one bus.
func (p *Plugin) Instantiate(info bus.PluginInfo) (bus.Middleware, error) {
	if p == nil || p.store == nil {
		return bus.Middleware{}, ErrNoStore
	}
	c := p.cfg
	if c.batch < 1 || c.poll <= 0 || c.retention < 0 || c.cleanup <= 0 || c.relayWorkers < 1 {
		return bus.Middleware{}, fmt.Errorf("outbox: invalid options (batch %d, poll %s, retention %s, cleanup %s, relays %d): sizes and intervals must be positive", c.batch, c.poll, c.retention, c.cleanup, c.relayWorkers)
	}
	c.backoff = bus.Backoff{Initial: cmp.Or(c.backoff.Initial, DefaultBackoffInitial), Max: cmp.Or(c.backoff.Max, DefaultBackoffMax)}
	if err := c.backoff.Validate(); err != nil {
		return bus.Middleware{}, fmt.Errorf("outbox: WithBackoff: %w", err)
	}
	r := &relay{store: p.store, bus: info.Bus, cfg: c, logger: info.Logger.With(slog.String("middleware", "outbox"))}
	st := p.store
	return bus.Middleware{
		Name: "outbox",
		// A second outbox would open a transaction in the first and a
		// second relay; one of another store would not commit with it.
		Unique:   true,
		TxSource: (*store.Store)(st),
		Handling: func(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
			return st.InTx(ctx, func(ctx context.Context, tx *sqlstore.Tx) error {
				restore, err := h.UseOutbox(ctx, tx)
				defer restore() // sends after this transaction go to the bus's buffer again
				if err != nil {
					return err
				}
				tx.SetCarriesOutbox() // the inbox may record the handler in tx: its sends commit with it
				return next.Call(ctx)
			})
		},
		Start: r.start,
		Stop:  r.stop,
	}, nil
}

// ErrNoTransaction is returned by [Tx] for a context that carries no
// transaction of a store: the handler's bus has neither the outbox nor
// the inbox plugin on a SQL store, or ctx is not a handler's (or
// [Within]'s). Tx returns it marked permanent (bus.Permanent): no retry
// adds the plugin, so a handler that returns it dead-letters the message
// at once, with this reason.
var ErrNoTransaction = errors.New("outbox: no database transaction in the context: outbox.Tx needs the context of a handler on a bus with bus.WithMiddleware(outbox.New(st)) (or inbox.New(st) on a SQL store), or of outbox.Within; add the plugin to the handler's bus")

// Tx returns the database transaction of the handler (or of [Within])
// running with ctx. Write the handler's data with it: it commits with the
// messages the handler sends, or not at all.
//
//	tx, err := outbox.Tx(ctx)
//	if err != nil {
//		return err
//	}
//
// Outside such a transaction it returns [ErrNoTransaction], marked
// permanent: return it from the handler and the message is dead-lettered
// with that reason.
func Tx(ctx context.Context) (*sql.Tx, error) {
	if t := sqlstore.TxFrom(ctx); t != nil {
		return t.SQL(), nil
	}
	return nil, bus.Permanent(ErrNoTransaction)
}

// Within runs fn in a transaction of s in which every message b sends or
// publishes is stored in the outbox instead of being handed to the
// transport (or, inside a handler, to the handler's buffer): fn's writes
// and messages commit together when fn returns nil and are rolled back
// when it returns an error. A relay on s (a bus with outbox.New(s))
// dispatches them after the commit. A send with bus.Immediately (a
// request whose reply fn waits for) goes to the transport at once.
//
// When ctx already carries a transaction of s (inside a handler of a bus
// with this plugin, or with the inbox plugin, on s), fn joins it, and its
// writes and messages commit or roll back with the handler. An error of
// fn (or a panic) still undoes what fn did, to a savepoint: a handler
// that goes on past it keeps nothing of fn.
func Within(ctx context.Context, b *bus.Bus, s *store.Store, fn func(ctx context.Context, tx *sql.Tx) error) error {
	if b == nil || s == nil {
		return errors.New("outbox: Within: nil bus or store")
	}
	return (*sqlstore.Store)(s).InTxUndoable(ctx, func(ctx context.Context, tx *sqlstore.Tx) error {
		return fn(bus.ContextWithOutbox(ctx, b, tx), tx.SQL())
	})
}

// relay dispatches committed messages and deletes old ones.
type relay struct {
	store  *sqlstore.Store
	bus    *bus.Bus
	cfg    config
	logger *slog.Logger

	mu        sync.Mutex
	stopLoops context.CancelFunc
	wg        sync.WaitGroup
}

func (r *relay) start(ctx context.Context) error {
	if !r.cfg.noMigrate {
		if err := r.store.Migrate(ctx); err != nil {
			return fmt.Errorf("outbox: creating tables (or pass outbox.WithoutMigrate and migrate yourself): %w", err)
		}
	}
	if r.cfg.noRelay {
		return nil
	}
	rctx, stopLoops := context.WithCancel(context.WithoutCancel(ctx))
	r.mu.Lock()
	r.stopLoops = stopLoops
	r.mu.Unlock()
	for range r.cfg.relayWorkers {
		r.wg.Go(func() { r.loop(rctx) })
	}
	r.wg.Go(func() { r.cleanupLoop(rctx) })
	if n := r.store.Notifier(); n != nil {
		r.wg.Go(func() { r.listen(rctx, n) })
	}
	return nil
}

func (r *relay) stop(context.Context) error {
	r.mu.Lock()
	stopLoops := r.stopLoops
	r.mu.Unlock()
	if stopLoops != nil {
		stopLoops()
	}
	r.wg.Wait()
	return nil
}

func (r *relay) loop(ctx context.Context) {
	retries := 0          // failed rounds in a row
	var retryAt time.Time // the earliest retry of a row this relay saw refused
	poll := time.NewTimer(r.cfg.poll)
	defer poll.Stop()
	for {
		woken := r.store.Committed()
		if !retryAt.IsZero() && !time.Now().Before(retryAt) {
			retryAt = time.Time{} // due: this DispatchPendingBatch takes it
		}
		n, err := r.store.DispatchPendingBatch(ctx, r.cfg.batch, r.bus.DispatchBatch)
		if ctx.Err() != nil {
			return
		}
		refusedRows, firstTries, t := refusals(err)
		if !t.IsZero() && (retryAt.IsZero() || t.Before(retryAt)) {
			retryAt = t
		}
		if err != nil {
			// Refused rows wait for their own retry time (or are parked)
			// and the others go on; the relay itself backs off only when
			// nothing got through: the database or the transport is down.
			// A full round refused whole, every row on its first
			// attempt, goes on at once too: the rows behind it may go
			// through (a burst to an endpoint not deployed yet), and a
			// back-off longer than the rows' own would let them come
			// round again first and hold the others up until parked. In
			// an outage that tries each row of the backlog once; the
			// rounds of retried rows then back off, so that the backlog
			// is not brought to parking at the speed of the errors.
			var de *sqlstore.DispatchError
			refused := errors.As(err, &de)
			if refused && (n > 0 || firstTries && refusedRows >= r.cfg.batch) {
				retries = 0
				r.logger.WarnContext(ctx, "outbox relay: the transport refused messages; each is retried after its backoff", slog.Any("error", err), slog.Int("dispatched", n), slog.Int("refused", refusedRows))
				continue
			}
			retries++
			backoff := r.cfg.backoff.Delay(retries)
			r.logger.WarnContext(ctx, "outbox relay: dispatch failed; retrying", slog.Any("error", err), slog.Int("dispatched", n), slog.Int("retry", retries), slog.Duration("backoff", backoff))
			if !wait.Sleep(ctx, backoff) {
				return
			}
			continue
		}
		retries = 0
		if n == r.cfg.batch {
			continue // more may be waiting
		}
		// Wait for a commit, the poll, or the first refused row's retry,
		// whichever comes first: a row the transport refused is retried
		// when its backoff ends, not at the next poll.
		wait := r.cfg.poll
		if !retryAt.IsZero() {
			wait = max(min(wait, time.Until(retryAt)), 0)
		}
		poll.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-woken:
		case <-poll.C:
		}
	}
}

// refusals returns how many rows err reports refused (a
// *sqlstore.DispatchError, or several joined), parked ones included,
// whether each was on its first attempt, and the earliest RetryAt among
// them, zero when there is none.
func refusals(err error) (n int, first bool, t time.Time) {
	first = true
	var visit func(error)
	visit = func(err error) {
		var de *sqlstore.DispatchError
		switch e := err.(type) {
		case nil:
		case interface{ Unwrap() []error }:
			for _, inner := range e.Unwrap() {
				visit(inner)
			}
		default:
			if !errors.As(err, &de) {
				return
			}
			n++
			first = first && de.Attempts == 1
			if !de.RetryAt.IsZero() && (t.IsZero() || de.RetryAt.Before(t)) {
				t = de.RetryAt
			}
		}
	}
	visit(err)
	return n, first && n > 0, t
}

func (r *relay) cleanupLoop(ctx context.Context) {
	sqlstore.RunPurge(ctx, r.cfg.cleanup, r.logger, "outbox cleanup", func(ctx context.Context) (int64, error) {
		return r.store.PurgeDispatched(ctx, time.Now().Add(-r.cfg.retention))
	})
}

func (r *relay) listen(ctx context.Context, n sqlstore.Notifier) {
	retries := 0 // failed listens in a row
	for {
		var listening atomic.Bool
		err := n.Listen(ctx, r.store.Channel(), func() {
			// The notifier wakes once right after LISTEN took effect: the
			// connection works, so the next loss starts a fresh back-off.
			listening.Store(true)
			r.store.Wake()
		})
		if ctx.Err() != nil {
			return
		}
		if listening.Load() {
			retries = 0
		}
		retries++
		backoff := r.cfg.backoff.Delay(retries)
		r.logger.WarnContext(ctx, "outbox relay: listening for commits failed; polling meanwhile", slog.Any("error", err), slog.Int("retry", retries), slog.Duration("backoff", backoff))
		if !wait.Sleep(ctx, backoff) {
			return
		}
	}
}

var _ bus.Plugin = (*Plugin)(nil)
