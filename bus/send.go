package bus

import (
	"context"
	"fmt"
	"reflect"
	"runtime/debug"
	"time"
)

// Send sends msg to one endpoint: the one given with [To], else the route
// set with [WithRoute], else this bus's own endpoint when it handles msg.
// Inside a handler of this bus the message inherits the handled message's
// correlation id and sticky attributes and is buffered until the handler
// succeeds; elsewhere (including in a handler of another bus) Send returns
// once the transport accepted it. A nil msg, or a nil pointer in msg, is
// refused with an error; a nil option is skipped.
func (b *Bus) Send(ctx context.Context, msg Message, opts ...SendOption) error {
	return b.emit(ctx, KindSend, msg, opts)
}

// Publish delivers msg to every endpoint that handles its name. Inside a
// handler the message is buffered and published when the handler succeeds.
func (b *Bus) Publish(ctx context.Context, msg Message, opts ...SendOption) error {
	return b.emit(ctx, KindPublish, msg, opts)
}

func (b *Bus) emit(ctx context.Context, kind Kind, msg Message, opts []SendOption) error {
	return b.emitInto(ctx, kind, msg, opts, nil)
}

// emitInto runs msg through the outgoing stage. With batch non-nil (only
// outside a handler and an outbox) the terminal step appends the finished
// message to it instead of handing it to the transport.
func (b *Bus) emitInto(ctx context.Context, kind Kind, msg Message, opts []SendOption, batch *[]Outbound) (err error) {
	if b.state.Load() == stateClosed {
		return ErrClosed
	}
	cfg, name, err := checkSend(kind, msg, opts)
	if err != nil {
		return err
	}
	scope := scopeFrom(ctx, b)
	dest := ""
	if kind == KindSend {
		if dest = b.destination(name, cfg.to); dest == "" {
			return fmt.Errorf("%w %s: pass bus.To(endpoint) or configure bus.WithRoute", ErrNoRoute, name)
		}
	}
	now := time.Now() // one clock read per send: sent-at and the id's timestamp
	id := cfg.messageID
	if id == "" {
		id = newIDAt(now)
	}
	r := b.outgoingRuns.Get().(*outgoingRun)
	r.kind, r.msg, r.msgName, r.dest, r.scope, r.bufferInHandler = kind, msg, name, dest, scope, scope != nil && !cfg.immediate
	switch {
	case !cfg.at.IsZero():
		r.due = cfg.at
	case cfg.delay > 0:
		r.due = now.Add(cfg.delay)
	}
	r.attrs = Attributes{MessageID: id, CorrelationID: cfg.correlationID, SentAt: now.Truncate(time.Millisecond).UTC(), values: cfg.values, sticky: cfg.sticky}
	if cfg.values != nil {
		r.owned |= ownValues
	}
	if cfg.sticky != nil {
		r.owned |= ownSticky
	}
	if scope != nil {
		r.inherit(scope.attrs)
	}
	if r.attrs.CorrelationID == "" {
		r.attrs.CorrelationID = id
	}
	// An outbox put in the context (outbox.Within) takes the message even
	// inside a handler; Immediately goes past every outbox.
	if !cfg.immediate {
		r.contextOutbox = outboxFrom(ctx, b)
	}
	if batch != nil && !r.holds() {
		r.batch = batch
	}
	defer func() {
		if p := recover(); p != nil {
			err = &PanicError{Value: p, Stack: debug.Stack()}
			r.abandon()
		}
		if r.reusable() {
			r.reset()
			b.outgoingRuns.Put(r)
		}
	}()
	// r.start written out: a frame less above every layer.
	if len(r.chain.funcs) == 0 {
		err = finishOutgoing(ctx, &r.self, nil)
	} else {
		e := r.begin()
		err = r.chain.funcs[0](ctx, &r.contexts[0], &r.nexts[0])
		r.finish(ctx, e, err)
	}
	if err != nil {
		return err
	}
	return r.store(ctx)
}

// destination returns the endpoint a sent message named name goes to:
// to, else its route, else this bus's endpoint when it handles the
// message; empty when there is none.
func (b *Bus) destination(name, to string) string {
	if to != "" {
		return to
	}
	if dest := b.routes[name]; dest != "" {
		return dest
	}
	if len(b.handlers[name]) > 0 {
		return b.endpoint
	}
	return ""
}

// inherit gives the message being sent the correlation id (unless it has
// one) and the sticky attributes (but those it sets itself) of the
// message being handled, whose attributes are handled.
func (r *outgoingRun) inherit(handled Attributes) {
	if r.attrs.CorrelationID == "" {
		r.attrs.CorrelationID = handled.CorrelationID
	}
	if len(handled.sticky) == 0 {
		return
	}
	if r.attrs.sticky == nil {
		r.attrs.sticky = handled.sticky // immutable: shared, not owned
		return
	}
	for k, v := range handled.sticky {
		if _, set := r.attrs.sticky[k]; !set {
			r.attrs.sticky[k] = v
		}
	}
}

// store stores the message the terminal step held for an outbox or the
// handler's buffer, once the chain returned nil.
func (r *outgoingRun) store(ctx context.Context) error {
	if !r.holds() {
		return nil // handed to the transport by the terminal step
	}
	if e := r.epoch.Load(); len(r.chain.funcs) > 0 && r.terminalReturned.Load() != e {
		if r.holdStarted.Load() == e {
			// The terminal step was called and has not returned: a
			// middleware returned nil while its next runs elsewhere.
			return fmt.Errorf("bus: %s %s: outgoing middleware returned before the next it called did; the message was not stored", r.kind, r.msgName)
		}
		return nil // a middleware did not call next: dropped
	}
	if r.held.Envelope == nil {
		return nil // dropped: failed validation or encoding returned an error
	}
	m, o := r.held, r.contextOutbox
	r.held = Outbound{}
	if r.batch != nil {
		*r.batch = append(*r.batch, m)
		return nil
	}
	if o != nil {
		return o.Add(ctx, m)
	}
	return r.scope.add(ctx, m)
}

// finishOutgoing is the outgoing stage's terminal step: encode, then buffer
// or hand the message to the transport. It is the innermost next's step
// itself, a frame less under every layer than a step calling it; with no
// outgoing chain, the stage's caller calls it with the run's own stage
// context.
func finishOutgoing(ctx context.Context, out *Outgoing, _ *OutgoingNext) error {
	r := out.r
	e, err := r.enterStep()
	if err != nil {
		return err
	}
	b := r.b
	if r.holds() {
		r.holdStarted.Store(r.epoch.Load()) // store tells a next still running from a drop
	}
	if b.headerValidator != nil && len(r.headers) > 0 {
		if err := b.headerValidator.ValidateHeaders(r.headers); err != nil {
			return r.left(e, err)
		}
	}
	due, err := b.checkDue(r.msgName, r.due)
	if err != nil {
		return r.left(e, err)
	}
	body, err := b.serializer.Marshal(r.msg)
	if err != nil {
		return r.left(e, fmt.Errorf("bus: encoding %s: %w", r.msgName, err))
	}
	m := Outbound{Kind: r.kind, Destination: r.dest}
	env := Envelope{Name: r.msgName, ContentType: b.contentType, Body: body, Attributes: r.attrs, Headers: r.headers, Due: due}
	r.owned = 0 // the envelope owns the maps now
	r.headers = nil
	if !r.holds() {
		if b.lendEnvelopes {
			// Handed straight to a transport that copies what it keeps:
			// the envelope lives in the run, reused only once the run
			// ended clean.
			r.lentEnvelope = env
			m.Envelope = &r.lentEnvelope
		} else {
			m.Envelope = new(Envelope)
			*m.Envelope = env
		}
		return r.left(e, b.transmit(ctx, m))
	}
	m.Envelope = new(Envelope) // kept after the run ends
	*m.Envelope = env
	r.held = m
	return r.left(e, nil)
}

// checkDue returns the due time a message named name is sent with: zero
// when due is zero or has passed (now), due itself when the transport
// carries a delay that long, else a [*DelayTooLongError].
func (b *Bus) checkDue(name string, due time.Time) (time.Time, error) {
	if due.IsZero() {
		return due, nil
	}
	delay := time.Until(due)
	if delay <= 0 {
		return time.Time{}, nil
	}
	var most time.Duration
	if b.delayer != nil {
		most = b.delayer.MaxDelay()
	}
	if delay > most {
		return time.Time{}, &DelayTooLongError{Message: name, Transport: fmt.Sprintf("%T", b.t), Delay: delay, Max: most}
	}
	return due, nil
}

// transmit hands a finished message to the transport. It never runs middleware.
func (b *Bus) transmit(ctx context.Context, m Outbound) error {
	if m.Kind == KindPublish {
		return b.t.Publish(ctx, m.Envelope)
	}
	return b.t.Send(ctx, m.Envelope, m.Destination)
}

// Dispatch hands a finished message to the transport without running any
// middleware. An outbox relay uses it to send what a handler stored.
func (b *Bus) Dispatch(ctx context.Context, m Outbound) error { return b.transmit(ctx, m) }

// ValidateSend returns the error that [Bus.Send] (kind [KindSend]) or
// [Bus.Publish] ([KindPublish]) of a running bus returns for msg and opts
// whatever the bus's configuration, before any middleware runs:
// [ErrInvalidMessage] for a nil message, a nil pointer, or a MessageName
// that panics or is empty, and [ErrInvalidOption] for [To] given to a
// publish. Nil does not promise that a bus sends msg: its routes,
// middleware, delay limit and transport may still refuse it. A stand-in
// for a bus (a test harness that records what a handler sends) calls it
// to refuse what a bus refuses, with the same errors.
func ValidateSend(kind Kind, msg Message, opts ...SendOption) error {
	_, _, err := checkSend(kind, msg, opts)
	return err
}

// checkSend is what [ValidateSend] checks; it returns the options applied
// and msg's name for the send to go on with.
func checkSend(kind Kind, msg Message, opts []SendOption) (cfg sendConfig, name string, err error) {
	if isNil(msg) {
		return cfg, "", fmt.Errorf("%w: %s of a nil %T", ErrInvalidMessage, kind, msg)
	}
	if len(opts) > 0 {
		cfg = applySendOptions(opts)
		if kind == KindPublish && cfg.to != "" {
			return cfg, "", publishToError(cfg.to)
		}
	}
	if name, err = messageName(msg); err != nil {
		return cfg, "", fmt.Errorf("%w: %s: %v", ErrInvalidMessage, kind, err)
	}
	return cfg, name, nil
}

// applySendOptions is apart from emit so that a send without options does
// not move its config to the heap. A nil option is skipped, as New skips
// a nil Option.
func applySendOptions(opts []SendOption) sendConfig {
	var o sendConfig
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	return o
}

// publishToError refuses [To] on a publish, which goes to every
// subscriber: silently ignoring it would publish what the caller meant to
// send to one endpoint.
func publishToError(to string) error {
	return fmt.Errorf("%w: bus.To(%q) given to a publish, which goes to every subscriber of the message; use Send for one endpoint", ErrInvalidOption, to)
}

// isNil reports whether msg is nil, or a nil pointer in a Message: its
// MessageName may panic, and it would encode as JSON null, decoded as a
// zero message. A nil map or slice is a value of its message type, named
// and decoded as sent: it is sent.
func isNil(msg Message) bool {
	if msg == nil {
		return true
	}
	v := reflect.ValueOf(msg)
	return v.Kind() == reflect.Pointer && v.IsNil()
}
