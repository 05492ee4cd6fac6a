// Package inbox is the idempotent consumer of plugbus: it deduplicates
// received messages on (endpoint, message id).
//
// In the incoming stage, a message whose id the endpoint already processed
// is not passed on: its handlers are skipped and it is deleted. A message
// is recorded as processed only when every handler succeeded, never before
// the handlers run, so a message whose handler failed is processed again
// when it is redelivered.
//
// On a SQL [store.Store] (store/sqlite, store/postgres) each handler also
// runs in a transaction of the store, in which the inbox records that this
// handler processed this message. The outbox plugin on the bus uses the
// same store (bus.New refuses two stores), and that is the transaction
// the outbox opens (whichever plugin runs first opens it, the other
// joins), so the handler's data, the messages it sends and the inbox
// record commit together: the exactly-once processing effect. With several handlers per message, each handler is recorded on
// its own: when one fails and the message is redelivered, the handlers that
// already committed are skipped and only the failed one runs again.
//
// That per-handler record is written only when the outbox on the same store
// is active for the handler. Without it, a handler's sends are flushed to
// the transport after its transaction commits, so recording the handler
// there would skip it on a retry after a failed flush and lose its sends:
// the handler is then recorded with the message, once every handler and
// every flush succeeded, and a failure anywhere runs all handlers again.
//
// The memory store ([NewMemoryStore]) is for tests and single-process use:
// nothing survives the process.
//
// See docs/plugins/inbox.md.
package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/sqlstore"
	"github.com/plugbus/plugbus/store"
)

// Store remembers the messages an endpoint processed. [*store.Store] and
// [*MemoryStore] implement it.
type Store interface {
	// Processed reports whether endpoint recorded messageID as processed.
	Processed(ctx context.Context, endpoint, messageID string) (bool, error)
	// MarkProcessed records messageID as processed by endpoint.
	MarkProcessed(ctx context.Context, endpoint, messageID string) error
	// PurgeProcessed deletes the records made before before.
	PurgeProcessed(ctx context.Context, before time.Time) (int64, error)
}

// Option configures the inbox plugin.
type Option func(*config)

type config struct {
	retention time.Duration
	cleanup   time.Duration
	noMigrate bool
}

// WithRetention sets how long a processed message id is remembered
// (default 7 days). A duplicate that arrives later is processed again:
// keep it longer than the longest redelivery delay of your transport.
func WithRetention(d time.Duration) Option { return func(c *config) { c.retention = d } }

// WithCleanupInterval sets how often records older than the retention are
// deleted (default 1m).
func WithCleanupInterval(d time.Duration) Option { return func(c *config) { c.cleanup = d } }

// WithoutMigrate does not create the tables at start (SQL stores); run
// store.Store.Migrate beforehand.
func WithoutMigrate() Option { return func(c *config) { c.noMigrate = true } }

// Plugin is the inbox plugin: a [bus.Plugin] over one store.
type Plugin struct {
	records Store
	cfg     config
}

// New returns the inbox plugin on s. On a SQL store, give the bus's
// outbox and sagas the same *store.Store: bus.New refuses them on
// different stores (the same database opened twice is two stores) with a
// *bus.TxSourceConflictError, since their rows and the inbox's would not
// commit together. A [*MemoryStore] opens no transaction and goes with any
// store. The inbox given twice is refused with a
// *bus.DuplicateMiddlewareError.
func New(s Store, opts ...Option) *Plugin {
	c := config{retention: 7 * 24 * time.Hour, cleanup: time.Minute}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	return &Plugin{records: s, cfg: c}
}

// ErrNoStore is returned when the plugin is given no store.
var ErrNoStore = errors.New("inbox: nil store: pass inbox.NewMemoryStore() or a *store.Store")

// ErrNoEndpoint is returned for a bus without an endpoint: it receives
// nothing to deduplicate.
var ErrNoEndpoint = errors.New("inbox: the bus has no endpoint; add bus.WithEndpoint or remove the inbox plugin")

// Instantiate makes the inbox middleware of one bus.
func (p *Plugin) Instantiate(info bus.PluginInfo) (bus.Middleware, error) {
	if p == nil || p.records == nil {
		return bus.Middleware{}, ErrNoStore
	}
	if info.Endpoint == "" {
		return bus.Middleware{}, ErrNoEndpoint
	}
	if p.cfg.retention <= 0 || p.cfg.cleanup <= 0 {
		return bus.Middleware{}, fmt.Errorf("inbox: retention (%s) and cleanup interval (%s) must be positive", p.cfg.retention, p.cfg.cleanup)
	}
	m := &middleware{records: p.records, cfg: p.cfg, endpoint: info.Endpoint, logger: info.Logger.With(slog.String("middleware", "inbox"))}
	// A second inbox would look every message up twice, and record it twice.
	mw := bus.Middleware{Name: "inbox", Unique: true, Incoming: m.incoming, Start: m.start, Stop: m.stop}
	if st, ok := p.records.(*store.Store); ok {
		m.sqlStore = (*sqlstore.Store)(st)
		mw.Handling = m.handling
		mw.TxSource = st // the outbox's and the sagas' must be the same
	}
	return mw, nil
}

type middleware struct {
	records  Store
	sqlStore *sqlstore.Store // when records is a SQL store: the handler stage records each handler in its transaction
	cfg      config
	endpoint string
	logger   *slog.Logger

	mu          sync.Mutex
	stopCleanup context.CancelFunc
	wg          sync.WaitGroup
}

func (m *middleware) incoming(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
	id := in.Attributes().MessageID
	if id == "" {
		in.Logger().WarnContext(ctx, "inbox: message without id; it cannot be deduplicated")
		return next.Call(ctx)
	}
	seen, err := m.records.Processed(ctx, m.endpoint, id)
	if err != nil {
		return fmt.Errorf("inbox: looking up message %s (it is retried): %w", id, err)
	}
	if seen {
		in.Logger().DebugContext(ctx, "inbox: duplicate message skipped")
		return nil
	}
	if err := next.Call(ctx); err != nil {
		return err
	}
	if err := m.records.MarkProcessed(context.WithoutCancel(ctx), m.endpoint, id); err != nil {
		// The message was processed: failing it now would process it again.
		in.Logger().WarnContext(ctx, "inbox: recording the processed message failed; a later duplicate may be processed again", slog.Any("error", err))
	}
	return nil
}

func (m *middleware) handling(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
	id := h.Attributes().MessageID
	if id == "" {
		// Nothing to record, but the handler runs in a transaction of
		// the store all the same (outbox.Tx, the sagas and the outbox
		// join it), as every handler does on a bus with this plugin.
		return m.sqlStore.InTx(ctx, func(ctx context.Context, _ *sqlstore.Tx) error { return next.Call(ctx) })
	}
	return m.sqlStore.InTx(ctx, func(ctx context.Context, tx *sqlstore.Tx) error {
		first, err := m.sqlStore.ClaimHandler(ctx, tx, m.endpoint, id, h.HandlerName())
		if err != nil {
			return fmt.Errorf("inbox: %w", err)
		}
		if !first {
			h.Logger().DebugContext(ctx, "inbox: handler already processed this message; skipped")
			return nil
		}
		if err := next.Call(ctx); err != nil {
			return err
		}
		if tx.CarriesOutbox() {
			return nil // its sends commit with the record
		}
		// Without the outbox on this store the handler's sends are
		// flushed after tx commits, and may fail: recording the handler
		// now would skip it on the retry and lose them. The message-level
		// record, written once every handler and flush succeeded, covers it.
		if err := m.sqlStore.ReleaseHandler(ctx, tx, m.endpoint, id, h.HandlerName()); err != nil {
			return fmt.Errorf("inbox: %w", err)
		}
		return nil
	})
}

type migrator interface {
	Migrate(ctx context.Context) error
}

func (m *middleware) start(ctx context.Context) error {
	if mg, ok := m.records.(migrator); ok && !m.cfg.noMigrate {
		if err := mg.Migrate(ctx); err != nil {
			return fmt.Errorf("inbox: creating tables (or pass inbox.WithoutMigrate and migrate yourself): %w", err)
		}
	}
	cleanupCtx, stopCleanup := context.WithCancel(context.WithoutCancel(ctx))
	m.mu.Lock()
	m.stopCleanup = stopCleanup
	m.mu.Unlock()
	m.wg.Go(func() { m.cleanupLoop(cleanupCtx) })
	return nil
}

func (m *middleware) stop(context.Context) error {
	m.mu.Lock()
	stopCleanup := m.stopCleanup
	m.mu.Unlock()
	if stopCleanup != nil {
		stopCleanup()
	}
	m.wg.Wait()
	return nil
}

func (m *middleware) cleanupLoop(ctx context.Context) {
	sqlstore.RunPurge(ctx, m.cfg.cleanup, m.logger, "inbox cleanup", func(ctx context.Context) (int64, error) {
		return m.records.PurgeProcessed(ctx, time.Now().Add(-m.cfg.retention))
	})
}

var _ bus.Plugin = (*Plugin)(nil)
