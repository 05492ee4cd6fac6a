package requestreply

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/plugbus/plugbus/bus"
)

// MiddlewareName is the name of the middleware in the bus's logs and errors.
const MiddlewareName = "requestreply"

// Attribute keys the plugin writes, as one-hop bus attributes: they travel
// with one message and are not copied onto messages sent while handling it.
const (
	// AttrRequestID identifies a request within the instance that sent it.
	AttrRequestID = "requestreply.id"
	// AttrReplyTo is the address of the requesting instance's own queue.
	AttrReplyTo = "requestreply.reply-to"
	// AttrInReplyTo marks a reply: the id of the request it answers.
	AttrInReplyTo = "requestreply.in-reply-to"
	// AttrErrorCode is the [Error.Code] of an error reply.
	AttrErrorCode = "requestreply.error-code"
	// AttrErrorMessage is the [Error.Message] of an error reply; its
	// presence marks an error reply.
	AttrErrorMessage = "requestreply.error"
)

// Defaults of the options.
const (
	DefaultTimeout    = 30 * time.Second
	DefaultMaxPending = 10000
)

// Option configures the plugin. Options are applied once, by [New].
type Option func(*config)

type config struct {
	timeout    time.Duration
	maxPending int
}

// WithDefaultTimeout sets how long a request waits for its reply when
// neither its context has a deadline nor [WithTimeout] is given, counted
// from the moment the request is sent; it bounds the send too. The
// default is [DefaultTimeout]; 0 or less waits for the context alone.
func WithDefaultTimeout(d time.Duration) Option { return func(c *config) { c.timeout = d } }

// WithMaxPending bounds how many requests of one bus may wait for replies
// at once; a request beyond it fails with a [*PendingLimitError] and is not
// sent. The default is [DefaultMaxPending].
func WithMaxPending(n int) Option { return func(c *config) { c.maxPending = n } }

// Plugin is the request/reply plugin. Pass it to bus.WithMiddleware; it is
// instantiated once per bus, and each bus keeps its own table of pending
// requests.
type Plugin struct {
	cfg config

	mu sync.Mutex
	// instances is keyed by a weak pointer, removed when the bus is
	// garbage: the plugin does not keep alive a bus that was never built,
	// never started, or stopped and dropped.
	instances map[weak.Pointer[bus.Bus]]*instance
}

// New returns the plugin. It has no side effects: nothing happens until a
// bus is built with it.
func New(opts ...Option) *Plugin {
	c := config{timeout: DefaultTimeout, maxPending: DefaultMaxPending}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	return &Plugin{cfg: c, instances: map[weak.Pointer[bus.Bus]]*instance{}}
}

// Instantiate returns the middleware of one bus. It fails when an option
// is invalid; the bus fails when its transport cannot give an instance
// queue (bus.InstanceQueuer), and when the plugin is given twice (a
// *bus.DuplicateMiddlewareError).
func (p *Plugin) Instantiate(info bus.PluginInfo) (bus.Middleware, error) {
	if p.cfg.maxPending < 1 {
		return bus.Middleware{}, fmt.Errorf("requestreply: WithMaxPending(%d): must be at least 1", p.cfg.maxPending)
	}
	logger := info.Logger
	if logger == nil {
		logger = slog.Default()
	}
	in := &instance{
		cfg:     p.cfg,
		ser:     bus.JSON{},
		log:     logger.With(slog.String("middleware", MiddlewareName)),
		pending: map[string]*call{},
	}
	in.iq, _ = info.Transport.(bus.InstanceQueuer)
	if info.Bus != nil {
		in.ser = info.Bus.Serializer() // replies are decoded like every message of this bus
		key := weak.Make(info.Bus)
		p.mu.Lock()
		p.instances[key] = in
		p.mu.Unlock()
		runtime.AddCleanup(info.Bus, p.forget, key)
	}
	return bus.Middleware{
		Name: MiddlewareName,
		// A second instance would keep a second table of requests that
		// no reply ever resolves.
		Unique:        true,
		InstanceQueue: true,
		Incoming:      in.incoming,
		Handling:      in.handling,
		Outgoing:      in.outgoing,
		Start:         in.start,
		Stop:          in.stop,
	}, nil
}

// forget drops the instance of a bus that was garbage collected.
func (p *Plugin) forget(key weak.Pointer[bus.Bus]) {
	p.mu.Lock()
	delete(p.instances, key)
	p.mu.Unlock()
}

// Stats describes the request/reply state of one bus.
type Stats struct {
	// Pending is the number of requests waiting for a reply.
	Pending int
	// Late counts the replies that arrived after their request ended (timed
	// out, cancelled, or already answered) and were dropped.
	Late uint64
	// Address is the bus instance's reply address, empty before Start.
	Address string
}

// Stats returns the state of the plugin's instance on b, the zero Stats
// when b was not built with this plugin.
func (p *Plugin) Stats(b *bus.Bus) Stats {
	p.mu.Lock()
	in := p.instances[weak.Make(b)]
	p.mu.Unlock()
	if in == nil {
		return Stats{}
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	return Stats{Pending: len(in.pending), Late: in.late.Load(), Address: in.addr}
}

// instance is the plugin's state on one bus.
type instance struct {
	cfg config
	ser bus.Serializer
	log *slog.Logger
	iq  bus.InstanceQueuer
	seq atomic.Uint64

	late atomic.Uint64

	mu      sync.Mutex
	addr    string // the reply address, set by start
	pending map[string]*call
	stopped bool
}

// call is one request waiting for its reply. Whoever removes it from the
// pending table (the reply, the requester giving up, Stop) completes it.
type call struct {
	claimed atomic.Bool // by the outgoing stage of the bus that sends it
	owner   *instance   // set when registered
	id      string
	name    string // request's message name
	dest    string
	decode  func(ser bus.Serializer, r *bus.Incoming) error // stores the reply for Request
	// ownDeadline says the caller's context has a deadline; without one,
	// deadline is the end of the plugin's default timeout, set as the
	// request is sent: it bounds the send and the wait for the reply.
	ownDeadline bool
	deadline    time.Time
	err         error // result, written before done closes
	done        chan struct{}
}

type callKey struct{}

func (in *instance) start(context.Context) error {
	addr := ""
	if in.iq != nil {
		addr = in.iq.InstanceAddress()
	}
	if addr == "" {
		return errors.New("requestreply: the transport gave no instance address after Setup; it does not implement bus.InstanceQueuer correctly")
	}
	in.mu.Lock()
	in.addr = addr
	in.mu.Unlock()
	in.log.Debug("reply address ready", slog.String("reply_to", addr))
	return nil
}

// stop ends every pending request with bus.ErrClosed.
func (in *instance) stop(context.Context) error {
	in.mu.Lock()
	in.stopped = true
	calls := in.pending
	in.pending = map[string]*call{}
	in.mu.Unlock()
	for _, c := range calls {
		c.err = fmt.Errorf("requestreply: the bus stopped before the reply to %s (request %s) arrived: %w", c.name, c.id, bus.ErrClosed)
		close(c.done)
	}
	return nil
}

// outgoing registers a request sent by [Request] and stamps its id and
// the reply address. Other messages pass through.
func (in *instance) outgoing(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
	c, _ := ctx.Value(callKey{}).(*call)
	if c == nil || !c.claimed.CompareAndSwap(false, true) {
		return next.Call(ctx)
	}
	c.id = strconv.FormatUint(in.seq.Add(1), 36)
	c.dest = out.Destination()
	in.mu.Lock()
	switch {
	case in.stopped || in.addr == "":
		in.mu.Unlock()
		return fmt.Errorf("requestreply: request %s: %w", c.name, bus.ErrClosed)
	case len(in.pending) >= in.cfg.maxPending:
		in.mu.Unlock()
		return &PendingLimitError{Limit: in.cfg.maxPending}
	}
	in.pending[c.id] = c
	c.owner = in
	addr := in.addr
	in.mu.Unlock()
	out.SetValue(AttrRequestID, c.id)
	out.SetValue(AttrReplyTo, addr)
	if !c.ownDeadline && in.cfg.timeout > 0 {
		// The default timeout runs from the moment the request is sent
		// and bounds the send too: a transport waiting for its broker
		// waits until the context ends.
		c.deadline = time.Now().Add(in.cfg.timeout)
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, c.deadline)
		defer cancel()
	}
	return next.Call(ctx)
}

// take removes the call id from the pending table; nil when absent.
func (in *instance) take(id string) *call {
	in.mu.Lock()
	c := in.pending[id]
	if c != nil {
		delete(in.pending, id)
	}
	in.mu.Unlock()
	return c
}

// forget removes c from the pending table and reports whether it was there.
func (in *instance) forget(c *call) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.pending[c.id] != c {
		return false
	}
	delete(in.pending, c.id)
	return true
}

// incoming resolves replies without calling next: they never reach a
// handler, and are deleted.
func (in *instance) incoming(ctx context.Context, m *bus.Incoming, next *bus.IncomingNext) error {
	id, ok := m.Attributes().Value(AttrInReplyTo)
	if !ok {
		return next.Call(ctx)
	}
	c := in.take(id)
	if c == nil {
		in.late.Add(1)
		if l := m.Logger(); l.Enabled(ctx, slog.LevelDebug) {
			l.DebugContext(ctx, "late reply dropped: its request already ended (timed out, cancelled or answered)", slog.String("request_id", id))
		}
		return nil
	}
	if msg, isErr := m.Attributes().Value(AttrErrorMessage); isErr {
		code, _ := m.Attributes().Value(AttrErrorCode)
		c.err = &Error{Code: code, Message: msg}
	} else {
		c.err = c.decode(in.ser, m)
	}
	close(c.done)
	return nil
}

// handling turns an [*Error] returned by a handler of a request into an
// error reply; the handler then counts as succeeded.
func (in *instance) handling(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
	err := next.Call(ctx)
	if err == nil {
		return nil
	}
	var re *Error
	if !errors.As(err, &re) {
		return err
	}
	if _, ok := h.Attributes().Value(AttrReplyTo); !ok {
		return err
	}
	if rerr := ReplyError(ctx, re); rerr != nil {
		return errors.Join(err, rerr)
	}
	if l := h.Logger(); l.Enabled(ctx, slog.LevelDebug) {
		l.DebugContext(ctx, "handler answered the request with an error", slog.String("code", re.Code), slog.String("error", re.Message))
	}
	return nil
}

var _ bus.Plugin = (*Plugin)(nil)
