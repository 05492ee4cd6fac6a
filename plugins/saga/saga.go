// Package saga runs long-running workflows: a saga is a typed state
// struct and the handlers of the messages that start and continue it,
// persisted in a SQL [store.Store] between messages.
//
//	type Order struct{ Paid, Shipped bool }
//
//	orders := saga.New[Order]("order", st, saga.WithRetention(time.Hour))
//	saga.StartedBy(orders, saga.By(func(m OrderPlaced) string { return m.OrderID }),
//		func(c *saga.Context[Order], m OrderPlaced) error {
//			return c.RequestTimeout(30*time.Minute, PaymentOverdue{OrderID: m.OrderID})
//		})
//	saga.Handles(orders, saga.By(func(m PaymentReceived) string { return m.OrderID }),
//		func(c *saga.Context[Order], m PaymentReceived) error {
//			c.State.Paid = true
//			return c.Send(ShipOrder{OrderID: m.OrderID})
//		})
//	saga.HandlesTimeout(orders, func(c *saga.Context[Order], m PaymentOverdue) error {
//		c.Complete()
//		return c.Publish(OrderCancelled{OrderID: m.OrderID})
//	})
//	b, err := bus.New(bus.WithEndpoint("orders"),
//		bus.WithMiddleware(outbox.New(st), inbox.New(st)),
//		orders.Option())
//
// Each message type maps to an instance through a declared correlation: a
// field of the message ([By]) or an attribute ([ByAttribute]); no
// reflection runs per message. A value that no store can keep alike
// (empty, longer than [MaxKeyLength], with a NUL byte or invalid UTF-8)
// fails its message permanently with a [*CorrelationError]. A saga's
// handlers are ordinary handlers of the bus, named after the saga: the
// bus's handler-stage middleware (the inbox, the outbox, tracing) sees
// them as such, and what a saga sends is what its handler sends.
//
// # Exactly-once effects
//
// With the outbox and the inbox plugins on the saga's store (as above;
// bus.New refuses them on another store, with a *bus.TxSourceConflictError,
// since they would not share the handler's transaction), the
// instance's new state, the messages the handler sends and the inbox
// record of the message commit in one transaction, or not at all: a
// redelivered message is skipped by the inbox, and a failed one leaves
// no trace. Without the outbox the state commits in the handler's
// transaction, but the inbox withdraws the message's record before the
// commit (the sends are flushed after it, and a failed flush must be able
// to run again): a message that comes back — after a failed flush, or a
// sibling handler's failure — runs its step again. State and sends are
// then at least once; use the outbox on the saga's store for exactly once.
//
// # Concurrency
//
// Every instance has a version. Two messages for one instance handled at
// once (by two workers, or two processes on one PostgreSQL database) both
// read version n; the first to save writes n+1, the second finds its
// version gone: it is a conflict, counted ([Saga.Conflicts]), and the
// loser's effects are undone (a savepoint within the transaction) and its
// handler runs again on the new state, up to [WithConflictRetries] times,
// before the message goes back to the bus's retry policy.
//
// # Timeouts
//
// [Context.RequestTimeout] sends a message to the saga's own endpoint
// after a delay (delayed delivery of the transport); it reaches the
// [HandlesTimeout] handler only if the instance that asked for it still
// runs: a timeout for a completed instance, or for an earlier instance
// with the same correlation value, is dropped.
//
// Package saga/sagatest drives a saga with messages and a fake clock,
// with no bus and no database. See docs/plugins/saga.md.
package saga

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/sqlstore"
	"github.com/plugbus/plugbus/store"
)

// The attributes a timeout carries to find its instance again.
const (
	AttrSaga     = "plugbus-saga"          // the saga's name
	AttrKey      = "plugbus-saga-key"      // the instance's correlation value
	AttrInstance = "plugbus-saga-instance" // the instance's id
)

// MaxKeyLength is the longest correlation value, in bytes, that a saga
// accepts, and the longest saga name. PostgreSQL's B-tree index refuses a
// row longer than about 2.7 KB (the saga's name and the value together),
// which SQLite keeps: a longer value fails its message permanently with a
// [*CorrelationError] on every store, before the store is touched, and
// [New] refuses a longer name.
const MaxKeyLength = 1024

// Defaults of the options.
const (
	DefaultConflictRetries = 20
	DefaultCleanupInterval = time.Minute
)

// Option configures a saga.
type Option func(*config)

type config struct {
	retention       time.Duration
	keepCompleted   bool
	cleanup         time.Duration
	conflictRetries int
	noMigrate       bool
}

// WithRetention keeps a completed instance for d before a cleanup job
// deletes it (default: deleted when it completes). While it is kept, late
// messages for it, starting messages included, are ignored with an INFO
// log instead of starting a new instance.
func WithRetention(d time.Duration) Option {
	return func(c *config) { c.retention, c.keepCompleted = d, true }
}

// WithCleanupInterval sets how often completed instances older than the
// retention are deleted (default 1m).
func WithCleanupInterval(d time.Duration) Option { return func(c *config) { c.cleanup = d } }

// WithConflictRetries sets how many times a handler that lost an
// optimistic concurrency conflict runs again within its transaction before
// the message is returned to the bus's retry policy (default 20).
func WithConflictRetries(n int) Option { return func(c *config) { c.conflictRetries = n } }

// WithoutMigrate does not create the saga table at start; run
// store.Store.Migrate beforehand.
func WithoutMigrate() Option { return func(c *config) { c.noMigrate = true } }

// Missing is what a saga does with a message that continues an instance
// when there is none (never started, or completed and deleted).
type Missing uint8

const (
	// Ignore drops the message with an INFO log (the default).
	Ignore Missing = iota
	// DeadLetter fails the message permanently with a [*NotFoundError]:
	// it goes to the dead-letter queue at once, with the reason.
	DeadLetter
)

// HandlerOption configures one message type of a saga.
type HandlerOption func(*route)

// WhenMissing sets what [Handles] does with a message for an instance
// that does not exist (default [Ignore]).
func WhenMissing(m Missing) HandlerOption { return func(r *route) { r.missing = m } }

// Correlation maps a message of type M to the correlation value of its
// saga instance. Build it with [By] or [ByAttribute].
type Correlation[M bus.Message] struct {
	field func(M) string
	attr  string
}

// By correlates a message by a value the function reads from it (a field).
func By[M bus.Message](field func(m M) string) Correlation[M] {
	return Correlation[M]{field: field}
}

// ByAttribute correlates a message by the value of one of its attributes
// (a header), such as a sticky attribute set by the message that started
// the instance: the one-hop attribute of that key, else the sticky one.
func ByAttribute[M bus.Message](key string) Correlation[M] {
	return Correlation[M]{attr: key}
}

// route is one message type of a saga.
type route struct {
	msgName string
	starts  bool
	timeout bool
	missing Missing
	// register registers the bus handler of the type with the saga's runner.
	register func(run runner) bus.Option
	// call runs the typed handler on an untyped message; the Context is a *Context[S].
	call func(c any, m bus.Message) error
	key  func(m bus.Message, a bus.Attributes) (string, error)
}

// runner handles one message of a route: the bus's or the simulator's.
type runner func(ctx context.Context, r *route, m bus.Message, a bus.Attributes) error

// Saga is the definition of a saga whose state is S. Declare its messages
// with [StartedBy], [Handles] and [HandlesTimeout], then add it to a bus
// with [Saga.Option]. S is encoded as JSON.
type Saga[S any] struct {
	name   string
	store  *sqlstore.Store
	cfg    config
	routes []*route
	byName map[string]*route
	errs   []error

	conflicts atomic.Int64
	log       atomic.Pointer[slog.Logger] // the last bus's
	mu        sync.Mutex
}

func (s *Saga[S]) logger() *slog.Logger {
	if l := s.log.Load(); l != nil {
		return l
	}
	return slog.Default()
}

// New returns the definition of the saga name, whose instances are kept in
// st (nil for a saga only driven by sagatest). The name identifies its
// instances in the table and its handlers on the bus: keep it stable.
func New[S any](name string, st *store.Store, opts ...Option) *Saga[S] {
	c := config{cleanup: DefaultCleanupInterval, conflictRetries: DefaultConflictRetries}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	s := &Saga[S]{name: name, store: (*sqlstore.Store)(st), cfg: c, byName: map[string]*route{}}
	switch {
	case name == "":
		s.errs = append(s.errs, errors.New("saga: New: empty name; give the saga a stable name"))
	case len(name) > MaxKeyLength:
		s.errs = append(s.errs, fmt.Errorf("saga: New: the name is %d bytes long, longer than saga.MaxKeyLength (%d): give the saga a shorter name", len(name), MaxKeyLength))
	}
	return s
}

// Name returns the saga's name.
func (s *Saga[S]) Name() string { return s.name }

// Conflicts returns how many optimistic concurrency conflicts this saga's
// handlers lost in this process (each was retried).
func (s *Saga[S]) Conflicts() int64 { return s.conflicts.Load() }

func (s *Saga[S]) add(r *route, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.errs = append(s.errs, err)
		return
	}
	if prev := s.byName[r.msgName]; prev != nil {
		s.errs = append(s.errs, fmt.Errorf("saga %s: message %s is declared twice; declare each message type once (StartedBy, Handles or HandlesTimeout)", s.name, r.msgName))
		return
	}
	s.byName[r.msgName] = r
	s.routes = append(s.routes, r)
}

// StartedBy declares that a message of type M starts an instance of s
// (creating it with a zero state when none exists for its correlation
// value) or continues it when it exists: with several starting messages,
// whichever arrives first creates the instance.
func StartedBy[S any, M bus.Message](s *Saga[S], c Correlation[M], fn func(c *Context[S], m M) error, opts ...HandlerOption) {
	r, err := newRoute(s, c, fn, opts)
	if r != nil {
		r.starts = true
	}
	s.add(r, err)
}

// Handles declares that a message of type M continues an instance of s.
// A message for an instance that does not exist is ignored with an INFO
// log, or dead-lettered with [WhenMissing]([DeadLetter]).
func Handles[S any, M bus.Message](s *Saga[S], c Correlation[M], fn func(c *Context[S], m M) error, opts ...HandlerOption) {
	r, err := newRoute(s, c, fn, opts)
	s.add(r, err)
}

// HandlesTimeout declares the handler of the timeout message T, requested
// with [Context.RequestTimeout]. It runs only if the instance that asked
// for the timeout still runs.
func HandlesTimeout[S any, T bus.Message](s *Saga[S], fn func(c *Context[S], m T) error) {
	r, err := newRoute(s, Correlation[T]{attr: AttrKey}, fn, nil)
	if r != nil {
		r.timeout = true
	}
	s.add(r, err)
}

func newRoute[S any, M bus.Message](s *Saga[S], c Correlation[M], fn func(*Context[S], M) error, opts []HandlerOption) (*route, error) {
	var zero M
	name, err := messageName(zero)
	if err != nil {
		return nil, fmt.Errorf("saga %s: %w", s.name, err)
	}
	if fn == nil {
		return nil, fmt.Errorf("saga %s: nil handler for %s", s.name, name)
	}
	if c.field == nil && c.attr == "" {
		return nil, fmt.Errorf("saga %s: no correlation for %s: use saga.By or saga.ByAttribute", s.name, name)
	}
	r := &route{msgName: name}
	for _, o := range opts {
		if o != nil {
			o(r)
		}
	}
	r.call = func(ctx any, m bus.Message) error { return fn(ctx.(*Context[S]), m.(M)) }
	r.key = func(m bus.Message, a bus.Attributes) (string, error) {
		var key string
		if c.field != nil {
			key = c.field(m.(M))
		} else {
			var ok bool
			if key, ok = a.Value(c.attr); !ok {
				key, _ = a.StickyValue(c.attr)
			}
		}
		if err := checkKey(key); err != nil {
			err.Saga, err.Message, err.Attribute = s.name, name, c.attr
			return "", err
		}
		return key, nil
	}
	r.register = func(run runner) bus.Option {
		return bus.WithHandler(func(ctx context.Context, m M, a bus.Attributes) error {
			return run(ctx, r, m, a)
		}, bus.HandlerName(s.name))
	}
	return r, nil
}

// checkKey returns the error of a correlation value no store can keep
// alike, with its Saga, Message and Attribute to fill in; nil when every
// store can. It is the one check of every value that finds an instance:
// a message's field or attribute, a timeout's AttrKey, in a bus or in the
// simulator.
func checkKey(key string) *CorrelationError {
	switch {
	case key == "":
		return &CorrelationError{}
	case len(key) > MaxKeyLength:
		return &CorrelationError{Value: key, Limit: MaxKeyLength}
	case strings.IndexByte(key, 0) >= 0 || !utf8.ValidString(key):
		return &CorrelationError{Value: key}
	}
	return nil
}

// messageName returns m's name, turning a panic into an error.
func messageName(m bus.Message) (name string, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%T.MessageName() panicked on the zero value: %v", m, p)
		}
	}()
	if m == nil {
		return "", errors.New("a message type must be a concrete type, not an interface")
	}
	return m.MessageName(), nil
}

// Option returns the bus option that registers the saga on a bus: a
// handler per declared message type, named after the saga, and a
// middleware (named "saga:" + the saga's name) that creates the saga table
// at start and deletes completed instances after the retention. It fails
// bus.New with the first error of the declarations, and for a saga that
// declares no message with [StartedBy]. bus.New refuses too a saga whose
// store is not that of the bus's outbox, inbox and other sagas (a
// *bus.TxSourceConflictError), and two sagas of one name on one bus (a
// *bus.DuplicateMiddlewareError).
func (s *Saga[S]) Option() bus.Option {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.errs) > 0 {
		return failing(s.errs[0])
	}
	if s.store == nil {
		return failing(fmt.Errorf("saga %s: no store: pass the *store.Store to saga.New (nil only for sagatest)", s.name))
	}
	if err := s.incomplete(); err != nil {
		return failing(err)
	}
	opts := make([]bus.Option, 0, len(s.routes)+1)
	opts = append(opts, bus.WithMiddleware(bus.PluginFunc(s.instantiate)))
	for _, r := range s.routes {
		opts = append(opts, r.register(s.handle))
	}
	return bus.WithOptions(opts...)
}

// incomplete returns the error of declarations that cannot run: none, or
// none that starts an instance (Handles and HandlesTimeout only continue
// one, so every message would be ignored). Call it with s.mu held.
func (s *Saga[S]) incomplete() error {
	if len(s.routes) == 0 {
		return fmt.Errorf("saga %s: no messages: declare them with StartedBy, Handles and HandlesTimeout", s.name)
	}
	for _, r := range s.routes {
		if r.starts {
			return nil
		}
	}
	return fmt.Errorf("saga %s: no message starts an instance: declare at least one with saga.StartedBy (Handles and HandlesTimeout only continue a running instance: every message would be ignored)", s.name)
}

// failing returns an option that fails bus.New with err.
func failing(err error) bus.Option {
	return bus.WithMiddleware(bus.PluginFunc(func(bus.PluginInfo) (bus.Middleware, error) { return bus.Middleware{}, err }))
}

func (s *Saga[S]) instantiate(info bus.PluginInfo) (bus.Middleware, error) {
	if info.Endpoint == "" {
		return bus.Middleware{}, fmt.Errorf("saga %s: the bus has no endpoint", s.name)
	}
	if s.cfg.conflictRetries < 0 || s.cfg.cleanup <= 0 || s.cfg.retention < 0 {
		return bus.Middleware{}, fmt.Errorf("saga %s: invalid options (conflict retries %d, cleanup %s, retention %s)", s.name, s.cfg.conflictRetries, s.cfg.cleanup, s.cfg.retention)
	}
	s.log.Store(info.Logger)
	j := &janitor{saga: s.name, store: s.store, cfg: s.cfg, logger: info.Logger.With(slog.String("saga", s.name))}
	// Unique: a second saga of this name would share its instances. The
	// saga's handlers run in a transaction of its store, which the
	// outbox and the inbox of the bus join only on the same store.
	return bus.Middleware{Name: "saga:" + s.name, Unique: true, TxSource: (*store.Store)(s.store), Start: j.start, Stop: j.stopFn}, nil
}

// janitor migrates at start and purges completed instances.
type janitor struct {
	saga   string
	store  *sqlstore.Store
	cfg    config
	logger *slog.Logger

	mu     sync.Mutex
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func (j *janitor) start(ctx context.Context) error {
	if !j.cfg.noMigrate {
		if err := j.store.Migrate(ctx); err != nil {
			return fmt.Errorf("saga %s: creating tables (or pass saga.WithoutMigrate and migrate yourself): %w", j.saga, err)
		}
	}
	if !j.cfg.keepCompleted {
		return nil
	}
	cctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	j.mu.Lock()
	j.cancel = stop
	j.mu.Unlock()
	j.wg.Go(func() {
		sqlstore.RunPurge(cctx, j.cfg.cleanup, j.logger, "saga cleanup", func(ctx context.Context) (int64, error) {
			return j.store.PurgeCompletedSagas(ctx, j.saga, time.Now().Add(-j.cfg.retention))
		})
	})
	return nil
}

func (j *janitor) stopFn(context.Context) error {
	j.mu.Lock()
	stop := j.cancel
	j.mu.Unlock()
	if stop != nil {
		stop()
	}
	j.wg.Wait()
	return nil
}
