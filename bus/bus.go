package bus

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
)

const (
	stateNew = iota
	stateRunning
	stateStopping
	stateClosed
)

// Bus sends, publishes and receives messages through one transport, running
// every message through its middleware pipeline. Build it with [New]; it
// is safe for concurrent use.
type Bus struct {
	name, endpoint string
	t              Transport
	hv             HeaderValidator
	releaser       DeliveryReleaser
	lendEnvelopes  bool // the transport copies envelopes: a sent one can live in its pooled run
	countsReceives bool // the broker dead-letters past the maximum attempts (ReceiveCounter)
	logger         *slog.Logger
	ser            Serializer
	contentType    string
	maxAttempts    int
	concurrency    int
	handlers       map[string][]*handler
	handles        []string
	routes         map[string]string
	unhandled      UnhandledPolicy
	mws            []Middleware
	instance       bool // a middleware needs an instance queue

	in  *pipe[Incoming]
	hd  *pipe[Handling]
	out *pipe[Outgoing]

	inPool, hdPool, outPool sync.Pool

	lifecycle sync.Mutex    // serialises Start and Stop
	stopping  chan struct{} // closed when Stop begins
	mu        sync.Mutex    // orders Deliver's inflight.Add before Stop's Wait
	state     atomic.Int32  // stateNew … stateClosed
	started   int           // middleware whose Start ran
	rcancel   context.CancelFunc
	icancel   context.CancelFunc // the instance queue's own receive loop
	ireceiver sync.WaitGroup
	pcancel   context.CancelFunc
	workers   sync.WaitGroup
	inflight  sync.WaitGroup // pushed deliveries
}

// New builds a bus from options, applied once: nothing can be registered on
// a bus afterwards. Each plugin is instantiated here, in order.
func New(opts ...Option) (*Bus, error) {
	c := config{concurrency: 8, maxAttempts: 5, serializer: JSON{}}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	if c.name == "" {
		c.name = c.endpoint
	}
	if len(c.handlers) > 0 && c.endpoint == "" {
		return nil, errors.New("bus: a bus with handlers needs an endpoint: add bus.WithEndpoint(name)")
	}
	if c.transport == nil {
		c.transport = NewMemoryTransport(NewMemoryBroker())
	}
	b := &Bus{
		name: c.name, endpoint: c.endpoint, t: c.transport,
		logger:      c.logger.With(slog.String("bus", c.name)),
		ser:         c.serializer,
		contentType: c.serializer.ContentType(),
		maxAttempts: c.maxAttempts, concurrency: c.concurrency,
		handlers: make(map[string][]*handler),
		routes:   c.routes, unhandled: c.unhandled,
	}
	b.hv, _ = c.transport.(HeaderValidator)
	b.releaser, _ = c.transport.(DeliveryReleaser)
	if ec, ok := c.transport.(EnvelopeCopier); ok {
		b.lendEnvelopes = ec.CopiesEnvelopes()
	}
	if rc, ok := c.transport.(ReceiveCounter); ok {
		b.countsReceives = rc.CountsReceives()
	}
	for _, h := range c.handlers {
		for _, other := range b.handlers[h.msgName] {
			if other.goType != h.goType {
				return nil, fmt.Errorf("bus: message name %q is the MessageName of both %s and %s: one name must decode into one Go type (the body would be decoded into both, and the fields one type lacks left zero); give one type its own MessageName, or handle both with the same type", h.msgName, other.typ, h.typ)
			}
			if other.name == h.name {
				return nil, fmt.Errorf("bus: two handlers of %s are named %q: give each its own name with bus.HandlerName (names identify handlers in errors, traces and the inbox)", h.msgName, h.name)
			}
		}
		b.handlers[h.msgName] = append(b.handlers[h.msgName], h)
	}
	b.handles = slices.Sorted(maps.Keys(b.handlers))

	b.in = &pipe[Incoming]{stage: StageIncoming}
	b.hd = &pipe[Handling]{stage: StageHandler}
	b.out = &pipe[Outgoing]{stage: StageOutgoing}
	info := PluginInfo{Bus: b, Name: b.name, Endpoint: b.endpoint, Logger: b.logger, Transport: b.t, Handles: slices.Clone(b.handles)}
	for i, p := range c.plugins {
		m, err := p.Instantiate(info)
		if err != nil {
			return nil, fmt.Errorf("bus: plugin %d (%T): %w", i, p, err)
		}
		if m.Name == "" {
			return nil, fmt.Errorf("bus: plugin %d (%T) returned a middleware without a name", i, p)
		}
		b.mws = append(b.mws, m)
		if m.InstanceQueue {
			if _, ok := b.t.(InstanceQueuer); !ok {
				return nil, fmt.Errorf("bus: middleware %q needs a queue of this bus instance, which the %T transport cannot give (it does not implement bus.InstanceQueuer)", m.Name, b.t)
			}
			b.instance = true
		}
		if m.Incoming != nil {
			b.in.add(m.Name, m.Incoming, b.logger)
		}
		if m.Handling != nil {
			b.hd.add(m.Name, m.Handling, b.logger)
		}
		if m.Outgoing != nil {
			b.out.add(m.Name, m.Outgoing, b.logger)
		}
	}
	b.stopping = make(chan struct{})
	b.inPool.New = func() any { return newIncomingRun(b, b.in, b.endpoint) }
	b.hdPool.New = func() any { return newHandlingRun(b, b.hd) }
	b.outPool.New = func() any { return newOutgoingRun(b, b.out) }
	return b, nil
}

// Name returns the bus's name.
func (b *Bus) Name() string { return b.name }

// Endpoint returns the bus's endpoint, empty for a send-only bus.
func (b *Bus) Endpoint() string { return b.endpoint }

// Transport returns the bus's transport.
func (b *Bus) Transport() Transport { return b.t }

// Stopping returns a channel closed when Stop begins, before in-flight
// messages drain: code waiting on the bus (a request waiting for its reply)
// can give up at once instead of holding up Stop.
func (b *Bus) Stopping() <-chan struct{} { return b.stopping }

// Running reports whether the bus was started and not yet stopped.
func (b *Bus) Running() bool { return b.state.Load() == stateRunning }

// Serializer returns the bus's body serializer.
func (b *Bus) Serializer() Serializer { return b.ser }

// Start declares the endpoint's topology, runs the middleware Start hooks
// in registration order and starts receiving. A bus without an endpoint
// (and without a middleware that needs an instance queue) only runs the
// hooks. Send and Publish work during Start (from a Start hook, say) and
// without it. A stopped bus cannot start again: build a new one.
func (b *Bus) Start(ctx context.Context) error {
	b.lifecycle.Lock()
	defer b.lifecycle.Unlock()
	switch b.state.Load() {
	case stateRunning:
		return ErrAlreadyStarted
	case stateStopping, stateClosed:
		return fmt.Errorf("%w: a stopped bus cannot start again; build a new one with bus.New", ErrClosed)
	}
	receives := b.endpoint != "" || b.instance
	if receives {
		topo := Topology{Endpoint: b.endpoint, Handles: slices.Clone(b.handles), MaxAttempts: b.maxAttempts, Concurrency: b.concurrency, Instance: b.instance}
		if err := b.t.Setup(ctx, topo); err != nil {
			return fmt.Errorf("bus: setting up endpoint %q: %w", b.endpoint, err)
		}
	}
	for i, m := range b.mws {
		if m.Start == nil {
			continue
		}
		if err := m.Start(ctx); err != nil {
			_ = b.stopMiddleware(ctx, i)
			return fmt.Errorf("bus: starting middleware %q: %w", m.Name, err)
		}
	}
	b.started = len(b.mws)
	rctx, rcancel := context.WithCancel(context.WithoutCancel(ctx))
	pctx, pcancel := context.WithCancel(context.WithoutCancel(ctx))
	b.rcancel, b.pcancel = rcancel, pcancel
	b.state.Store(stateRunning)
	if receives {
		for range b.concurrency {
			b.workers.Go(func() { b.receiveLoop(rctx, pctx, b.t.Receive) })
		}
	}
	ictx, icancel := context.WithCancel(context.WithoutCancel(ctx))
	b.icancel = icancel
	if ir, ok := b.t.(InstanceReceiver); ok && b.instance {
		// Replies to this instance must not wait for a handler worker: a
		// handler may be the one waiting for them.
		b.ireceiver.Go(func() { b.receiveLoop(ictx, pctx, ir.ReceiveInstance) })
	}
	b.logger.InfoContext(ctx, "bus started", slog.String("endpoint", b.endpoint), slog.Int("concurrency", b.concurrency))
	return nil
}

// stopMiddleware runs the Stop hooks of the first n middleware in reverse.
func (b *Bus) stopMiddleware(ctx context.Context, n int) error {
	var errs []error
	for i := n - 1; i >= 0; i-- {
		m := b.mws[i]
		if m.Stop == nil {
			continue
		}
		if err := m.Stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("bus: stopping middleware %q: %w", m.Name, err))
		}
	}
	return errors.Join(errs...)
}

// StopGrace bounds each of the steps of Stop that must run even when
// Stop's own context ended: the wait for handlers after their contexts
// were cancelled, the middleware Stop hooks, and closing the transport.
// Each gets up to StopGrace, whatever is left of Stop's context.
const StopGrace = 5 * time.Second

// Stop stops receiving and waits for in-flight messages to finish, bounded
// by ctx; so is the wait for the instance queue's handlers, which run
// until every other handler returned (one may wait for a reply there).
// When ctx ends first, Stop cancels the handlers' contexts, waits up to
// [StopGrace] for them to return and reports ctx's error. A message whose
// handler fails once its context was cancelled is returned for retry, even
// on its last attempt (the interrupted attempt counts), rather than
// dead-lettered — except on a transport whose broker dead-letters past the
// maximum attempts itself ([ReceiveCounter], SQS), where a last attempt is
// dead-lettered with its reason. What a handler that succeeded sent still
// goes out. On a bus that was never started, Stop waits for [Bus.Deliver]
// calls until ctx ends (it cannot cancel them).
//
// Then Stop runs the middleware Stop hooks in reverse order and closes the
// transport, each bounded by [StopGrace] rather than by ctx, so that they
// run even after ctx ended. Stop on a stopped bus returns nil. Stop from
// inside a handler of the same bus waits for that handler, that is until
// ctx ends.
func (b *Bus) Stop(ctx context.Context) error {
	b.lifecycle.Lock()
	defer b.lifecycle.Unlock()
	b.mu.Lock()
	state := b.state.Load()
	if state == stateStopping || state == stateClosed {
		b.mu.Unlock()
		return nil
	}
	b.state.Store(stateStopping) // under mu: no Deliver adds to inflight after this
	close(b.stopping)
	b.mu.Unlock()

	var errs []error
	var graceEnd time.Time // set once the handlers' contexts are cancelled
	if state == stateRunning {
		b.rcancel()
		errs = append(errs, b.await(ctx, &graceEnd, func() {
			b.workers.Wait()
			b.inflight.Wait()
		}))
		// The instance queue was received until every handler returned
		// (a handler may wait for a reply there); its loop is bounded the
		// same way, since its own handlers may wait for their context.
		b.icancel()
		errs = append(errs, b.await(ctx, &graceEnd, b.ireceiver.Wait))
		hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), StopGrace)
		errs = append(errs, b.stopMiddleware(hctx, b.started))
		cancel()
		b.pcancel()
	} else {
		errs = append(errs, b.await(ctx, &graceEnd, b.inflight.Wait)) // Deliver calls
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), StopGrace)
	defer cancel()
	if err := b.t.Close(cctx); err != nil {
		errs = append(errs, fmt.Errorf("bus: closing transport: %w", err))
	}
	b.state.Store(stateClosed)
	b.logger.InfoContext(ctx, "bus stopped")
	return errors.Join(errs...)
}

// await waits for wait to return, bounded by ctx. When ctx ends first it
// cancels the handlers' contexts, once per Stop, and waits until
// [StopGrace] after that (graceEnd, shared by Stop's waits); on a bus that
// was never started there is nothing to cancel, and it returns at once.
// The error says what was left running.
func (b *Bus) await(ctx context.Context, graceEnd *time.Time, wait func()) error {
	done := make(chan struct{})
	go func() {
		wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	if b.pcancel == nil {
		return fmt.Errorf("bus: stop: Deliver calls still running: %w", ctx.Err())
	}
	var err error
	if graceEnd.IsZero() {
		b.pcancel()
		*graceEnd = time.Now().Add(StopGrace)
		err = fmt.Errorf("bus: stop: in-flight messages not drained: %w", ctx.Err())
	}
	grace := time.NewTimer(time.Until(*graceEnd))
	defer grace.Stop()
	select {
	case <-done:
		return err
	case <-grace.C:
		return errors.Join(err, fmt.Errorf("bus: stop: handlers still running %s after their contexts were cancelled; closing anyway", StopGrace))
	}
}

func (b *Bus) receiveLoop(rctx, pctx context.Context, receive func(context.Context) (*Delivery, error)) {
	sctx := context.WithoutCancel(pctx) // settles what was processed, even while stopping
	backoff := time.Duration(0)
	for {
		d, err := receive(rctx)
		if err != nil {
			if rctx.Err() != nil || errors.Is(err, ErrClosed) {
				return
			}
			backoff = min(max(2*backoff, 10*time.Millisecond), 2*time.Second)
			b.logger.WarnContext(rctx, "receive failed; retrying", slog.Any("error", err), slog.Duration("backoff", backoff))
			t := time.NewTimer(backoff)
			select {
			case <-rctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			continue
		}
		backoff = 0
		b.process(pctx, sctx, d)
	}
}

// process runs one polled delivery and settles it with the transport.
func (b *Bus) process(ctx, sctx context.Context, d *Delivery) {
	if d.Attempt < 1 {
		b.attemptOutOfRange(ctx, d)
	}
	clean, err := b.handle(ctx, d)
	if clean && b.releaser != nil {
		// Last: the settling and its logs below still read d.
		defer b.releaser.ReleaseDelivery(d)
	}
	var serr error
	var poison error
	if err != nil {
		poison = poisonCause(err)
	}
	switch {
	case err == nil:
		serr = b.t.Delete(sctx, d)
	case poison == nil && ctx.Err() != nil && (d.Attempt < b.maxAttempts || !b.countsReceives):
		// Stop cancelled the handlers: the attempt was interrupted, not
		// failed, so even a last attempt is retried rather than
		// dead-lettered — unless the broker would dead-letter it on its
		// next receive, without the reason (ReceiveCounter).
		serr = b.t.Return(sctx, d, err)
		b.logger.WarnContext(ctx, "message returned for retry: the bus stopped while it was handled", append(describeEnvelope(&d.Envelope), slog.Int("attempt", d.Attempt), slog.Any("error", err))...)
	case poison != nil || d.Attempt >= b.maxAttempts:
		serr = b.t.Fail(sctx, d, Failure{Reason: err.Error(), Attempts: d.Attempt, Endpoint: b.endpoint, Time: time.Now().UTC()})
		if _, unhandled := poison.(*NoHandlerError); unhandled {
			// Not a failure of this service: someone sent it a message
			// it does not handle. The dead letter keeps it for whoever
			// looks into that.
			b.logger.WarnContext(ctx, "message dead-lettered: no handler for its name", append(describeEnvelope(&d.Envelope), slog.String("endpoint", b.endpoint), slog.Any("error", err))...)
			break
		}
		b.logger.ErrorContext(ctx, "message dead-lettered", append(describeEnvelope(&d.Envelope), slog.Int("attempt", d.Attempt), slog.Any("error", err))...)
	default:
		serr = b.t.Return(sctx, d, err)
		b.logger.WarnContext(ctx, "message returned for retry", append(describeEnvelope(&d.Envelope), slog.Int("attempt", d.Attempt), slog.Any("error", err))...)
	}
	if serr != nil {
		b.logger.ErrorContext(ctx, "settling message with the transport failed", append(describeEnvelope(&d.Envelope), slog.Any("error", serr))...)
	}
}

// attemptOutOfRange counts a delivery whose attempt is below 1 as the
// first, with a warning: whatever the transport read, the bus never lets
// it shorten a message's life. (An attempt above the maximum is one the
// bus makes itself, by returning a last attempt that Stop interrupted:
// the message is dead-lettered on its next failure. A transport reading
// the attempt from something a foreign publisher can write must ignore a
// value it cannot trust; see [Delivery].Attempt.)
func (b *Bus) attemptOutOfRange(ctx context.Context, d *Delivery) {
	b.logger.WarnContext(ctx, "delivery attempt below 1; counting it as the first", append(describeEnvelope(&d.Envelope),
		slog.String("attribute", "attempt"), slog.Int("attempt", d.Attempt), slog.String("transport", fmt.Sprintf("%T", b.t)))...)
	d.Attempt = 1
}

// Deliver runs one message delivered from outside (pushed, for example by
// an AWS Lambda SQS event) through the incoming pipeline and its handlers.
// It returns nil when the message is handled and may be deleted, and an
// error when it must be retried; [IsPoison](err) tells a message that
// will never succeed (one that cannot be decoded, or whose name no
// handler handles: [*NoHandlerError]). Deliver does not call the
// transport to settle the message: the caller does. It works on a bus
// that was not started. An Attempt of 0 counts as the first (a Delivery
// built by hand); a negative one too, with a warning.
func (b *Bus) Deliver(ctx context.Context, d *Delivery) error {
	b.mu.Lock()
	if b.state.Load() >= stateStopping {
		b.mu.Unlock()
		return ErrClosed
	}
	b.inflight.Add(1)
	b.mu.Unlock()
	defer b.inflight.Done()
	switch {
	case d.Attempt == 0:
		d.Attempt = 1
	case d.Attempt < 0:
		b.attemptOutOfRange(ctx, d)
	}
	_, err := b.handle(ctx, d)
	return err
}

// handle runs the incoming pipeline for d. clean reports that nothing can
// reach d any more: every stage run it went through ended clean, so no
// middleware still runs with it on another goroutine.
func (b *Bus) handle(ctx context.Context, d *Delivery) (clean bool, err error) {
	if d.Err != nil {
		return true, &DecodeError{Message: d.Name, Type: "envelope", Err: d.Err}
	}
	if d.Name == "" {
		return true, &DecodeError{Message: "", Type: "envelope", Err: errors.New("message has no name")}
	}
	r := b.inPool.Get().(*incomingRun)
	r.d, r.escaped, r.unhandled = d, false, false
	defer func() {
		if p := recover(); p != nil {
			err = &PanicError{Value: p, Stack: debug.Stack()}
		}
		if r.reusable() { // else a next may still run on another goroutine: leave the run to it
			clean = !r.escaped
			r.d = nil
			b.inPool.Put(r)
		}
	}()
	return false, r.start(ctx)
}

// dispatch is the incoming stage's terminal step: decode, then run every
// handler of the message in its own scope.
func (b *Bus) dispatch(ctx context.Context, r *incomingRun) error {
	d := r.d
	hs := b.handlers[d.Name]
	if len(hs) == 0 {
		r.unhandled = true
		if b.unhandled == UnhandledDiscard {
			if b.logger.Enabled(ctx, slog.LevelInfo) {
				b.logger.InfoContext(ctx, "no handler for message; discarding it (bus.UnhandledDiscard)", append(describeEnvelope(&d.Envelope), slog.String("endpoint", b.endpoint))...)
			}
			return nil
		}
		return &NoHandlerError{Message: d.Name, Endpoint: b.endpoint}
	}
	if d.ContentType != "" && d.ContentType != b.contentType {
		return &DecodeError{Message: d.Name, Type: hs[0].typ, Err: fmt.Errorf("content type %q, the bus's serializer reads %q", d.ContentType, b.contentType)}
	}
	var small [4]any
	msgs := small[:0]
	for _, h := range hs {
		m, err := h.decode(b.ser, d.Body)
		if err != nil {
			return &DecodeError{Message: d.Name, Type: h.typ, Err: err}
		}
		msgs = append(msgs, m)
	}
	var failures []HandlerFailure
	for i, h := range hs {
		if err := b.runHandler(ctx, h, msgs[i], d, r); err != nil {
			failures = append(failures, HandlerFailure{Handler: h.name, Err: err})
		}
	}
	if failures != nil {
		return &HandlerDispatchRejectedError{Message: d.Name, Failures: failures}
	}
	return nil
}

// runHandler runs one handler inside its handler chain and scope, then
// flushes what it sent when it succeeded.
func (b *Bus) runHandler(ctx context.Context, h *handler, msg any, d *Delivery, in *incomingRun) error {
	// The scope is the handler's context too: one allocation for both.
	scope := &handlerScope{Context: ctx, bus: b, attrs: d.Attributes, handler: h.name}
	r := b.hdPool.Get().(*handlingRun)
	r.h, r.msg, r.d, r.scope = h, msg, d, scope
	err := func() (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = &PanicError{Value: p, Stack: debug.Stack()}
			}
		}()
		return r.start(scope)
	}()
	if r.reusable() {
		r.h, r.msg, r.d, r.scope = nil, nil, nil, nil
		b.hdPool.Put(r)
	} else {
		in.escaped = true // its middleware may still read d on another goroutine
	}
	buf := scope.close()
	if err != nil {
		return err
	}
	if ctx.Err() != nil && b.state.Load() >= stateStopping {
		// Stop cancelled the handler's context after it succeeded: what
		// it sent still goes out (the transport's Close bounds this). A
		// Deliver caller's own deadline still bounds its flush.
		ctx = context.WithoutCancel(ctx)
	}
	for i, m := range buf {
		if err := b.transmit(ctx, m); err != nil {
			return fmt.Errorf("bus: flushing message %d of %d (%s) from handler %s: %w", i+1, len(buf), m.Envelope.Name, h.name, err)
		}
	}
	return nil
}

// Send sends msg to one endpoint: the one given with [To], else the route
// set with [WithRoute], else this bus's own endpoint when it handles msg.
// Inside a handler of this bus the message inherits the handled message's
// correlation id and sticky attributes and is buffered until the handler
// succeeds; elsewhere (including in a handler of another bus) Send returns
// once the transport accepted it.
func (b *Bus) Send(ctx context.Context, msg Message, opts ...SendOption) error {
	return b.emit(ctx, KindSend, msg, opts)
}

// Publish delivers msg to every endpoint that handles its name. Inside a
// handler the message is buffered and published when the handler succeeds.
func (b *Bus) Publish(ctx context.Context, msg Message, opts ...SendOption) error {
	return b.emit(ctx, KindPublish, msg, opts)
}

func (b *Bus) emit(ctx context.Context, kind Kind, msg Message, opts []SendOption) (err error) {
	if b.state.Load() == stateClosed {
		return ErrClosed
	}
	if msg == nil {
		return fmt.Errorf("bus: %s: nil message", kind)
	}
	var o sendConfig
	if len(opts) > 0 {
		o = applySendOptions(opts)
	}
	name := msg.MessageName()
	scope := scopeFrom(ctx, b)
	dest := ""
	if kind == KindSend {
		dest = o.to
		if dest == "" {
			dest = b.routes[name]
		}
		if dest == "" && len(b.handlers[name]) > 0 {
			dest = b.endpoint
		}
		if dest == "" {
			return fmt.Errorf("%w %s: pass bus.To(endpoint) or configure bus.WithRoute", ErrNoRoute, name)
		}
	}
	now := time.Now() // one clock read per send: sent-at and the id's timestamp
	id := o.messageID
	if id == "" {
		id = newIDAt(now)
	}
	r := b.outPool.Get().(*outgoingRun)
	r.kind, r.msg, r.msgName, r.dest, r.scope, r.buffer = kind, msg, name, dest, scope, scope != nil && !o.immediate
	r.attrs = Attributes{MessageID: id, CorrelationID: o.correlationID, SentAt: now.Truncate(time.Millisecond).UTC(), values: o.values, sticky: o.sticky}
	if o.values != nil {
		r.owned |= ownValues
	}
	if o.sticky != nil {
		r.owned |= ownSticky
	}
	if scope != nil {
		if r.attrs.CorrelationID == "" {
			r.attrs.CorrelationID = scope.attrs.CorrelationID
		}
		if len(scope.attrs.sticky) > 0 {
			if r.attrs.sticky == nil {
				r.attrs.sticky = scope.attrs.sticky // immutable: shared, not owned
			} else {
				for k, v := range scope.attrs.sticky {
					if _, set := r.attrs.sticky[k]; !set {
						r.attrs.sticky[k] = v
					}
				}
			}
		}
	}
	if r.attrs.CorrelationID == "" {
		r.attrs.CorrelationID = id
	}
	// An outbox put in the context (outbox.Within) takes the message even
	// inside a handler; Immediately goes past every outbox.
	if !o.immediate {
		r.holdTo = outboxFrom(ctx, b)
	}
	defer func() {
		if p := recover(); p != nil {
			err = &PanicError{Value: p, Stack: debug.Stack()}
		}
		if r.reusable() {
			r.reset()
			b.outPool.Put(r)
		}
	}()
	if err = r.start(ctx); err != nil {
		return err
	}
	return r.store(ctx)
}

// store stores the message the terminal step held for an outbox or the
// handler's buffer, once the chain returned nil.
func (r *outgoingRun) store(ctx context.Context) error {
	if !r.holds() {
		return nil // handed to the transport by the terminal step
	}
	if e := r.epoch.Load(); len(r.p.fns) > 0 && r.term.Load() != e {
		if r.entered.Load() == e {
			// The terminal step was called and has not returned: a
			// middleware returned nil while its next runs elsewhere.
			return fmt.Errorf("bus: %s %s: outgoing middleware returned before the next it called did; the message was not stored", r.kind, r.msgName)
		}
		return nil // a middleware did not call next: dropped
	}
	if r.held.Envelope == nil {
		return nil // dropped: failed validation or encoding returned an error
	}
	m, o := r.held, r.holdTo
	r.held = Outbound{}
	if o != nil {
		return o.Add(ctx, m)
	}
	return r.scope.add(ctx, m)
}

// finishOutgoing is the outgoing stage's terminal step: encode, then buffer
// in the handler's outbox or hand to the transport.
func (b *Bus) finishOutgoing(ctx context.Context, r *outgoingRun) error {
	if r.holds() {
		r.entered.Store(r.epoch.Load()) // store tells a next still running from a drop
	}
	if b.hv != nil && len(r.headers) > 0 {
		if err := b.hv.ValidateHeaders(r.headers); err != nil {
			return err
		}
	}
	body, err := b.ser.Marshal(r.msg)
	if err != nil {
		return fmt.Errorf("bus: encoding %s: %w", r.msgName, err)
	}
	m := Outbound{Kind: r.kind, Options: SendOptions{Destination: r.dest}}
	env := Envelope{Name: r.msgName, ContentType: b.contentType, Body: body, Attributes: r.attrs, Headers: r.headers}
	r.owned = 0 // the envelope owns the maps now
	r.headers = nil
	if !r.holds() {
		if b.lendEnvelopes {
			// Handed straight to a transport that copies what it keeps:
			// the envelope lives in the run, reused only once the run
			// ended clean.
			r.env = env
			m.Envelope = &r.env
		} else {
			m.Envelope = new(Envelope)
			*m.Envelope = env
		}
		return b.transmit(ctx, m)
	}
	m.Envelope = new(Envelope) // kept after the run ends
	*m.Envelope = env
	r.held = m
	return nil
}

// transmit hands a finished message to the transport. It never runs middleware.
func (b *Bus) transmit(ctx context.Context, m Outbound) error {
	if m.Kind == KindPublish {
		return b.t.Publish(ctx, m.Envelope, m.Options)
	}
	return b.t.Send(ctx, m.Envelope, m.Options)
}

// Dispatch hands a finished message to the transport without running any
// middleware. An outbox relay uses it to send what a handler stored.
func (b *Bus) Dispatch(ctx context.Context, m Outbound) error { return b.transmit(ctx, m) }

// applySendOptions is apart from emit so that a send without options does
// not move its config to the heap.
func applySendOptions(opts []SendOption) sendConfig {
	var o sendConfig
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// newID returns a UUIDv7 (RFC 9562): Unix milliseconds, then 74 random
// bits. The random bits come from math/rand/v2's runtime generator
// (ChaCha8, seeded by the operating system, per thread): ids need to be
// unique and unguessable enough to be unforgeable by accident, not secret,
// and this keeps a system call off every send.
func newID() string { return newIDAt(time.Now()) }

// newIDAt returns a UUIDv7 whose timestamp is now.
func newIDAt(now time.Time) string {
	var u uuid.UUID
	binary.BigEndian.PutUint64(u[0:8], rand.Uint64())
	binary.BigEndian.PutUint64(u[8:16], rand.Uint64())
	ms := uint64(now.UnixMilli())
	u[0], u[1], u[2], u[3], u[4], u[5] = byte(ms>>40), byte(ms>>32), byte(ms>>24), byte(ms>>16), byte(ms>>8), byte(ms)
	u[6] = u[6]&0x0f | 0x70 // version 7
	u[8] = u[8]&0x3f | 0x80 // variant RFC 9562
	return u.String()
}

// IsPoison reports whether err says the message can never be processed,
// as opposed to a handler's failure that a retry may fix: the bus could
// not decode it (a [*DecodeError]), or no handler handles its name (a
// [*NoHandlerError]). It looks for either error from the bus itself,
// possibly wrapped by middleware, but not one a handler returned (a
// handler's error inside a HandlerDispatchRejectedError is retried like
// any other).
func IsPoison(err error) bool { return poisonCause(err) != nil }

// poisonCause returns the *DecodeError or *NoHandlerError of the bus that
// makes err poison, or nil.
func poisonCause(err error) error {
	for err != nil {
		switch e := err.(type) {
		case *DecodeError, *NoHandlerError:
			return e
		case *HandlerDispatchRejectedError:
			return nil
		case interface{ Unwrap() []error }:
			for _, inner := range e.Unwrap() {
				if p := poisonCause(inner); p != nil {
					return p
				}
			}
			return nil
		}
		err = errors.Unwrap(err)
	}
	return nil
}
