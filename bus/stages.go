package bus

import (
	"context"
	"iter"
	"log/slog"
	"maps"
	"sync/atomic"
	"time"
)

// Incoming is the incoming stage's view of one received message. It is
// read-only. It is valid only while the middleware that received it runs.
type Incoming struct {
	r *incomingRun
	i int
}

type incomingRun struct {
	run[Incoming, IncomingNext, *IncomingNext]
	b             *Bus
	d             *Delivery
	endpoint      string
	deliveryInUse bool     // a handler run of d did not end clean: its middleware may still read d
	unhandled     bool     // the terminal step found no handler for d's name
	self          Incoming // the run as dispatch's stage context
}

func newIncomingRun(b *Bus, p *pipe[Incoming, IncomingNext], endpoint string) *incomingRun {
	r := &incomingRun{b: b, endpoint: endpoint}
	r.self = Incoming{r: r}
	r.init(p, func(i int) Incoming { return Incoming{r: r, i: i} }, dispatch,
		func() []any { return describeEnvelope(&r.d.Envelope) },
		"message handled by incoming middleware; handlers skipped, message deleted")
	return r
}

// Name returns the message's wire name.
func (in *Incoming) Name() string { return in.r.d.Name }

// Attributes returns the message's attributes.
func (in *Incoming) Attributes() Attributes { return in.r.d.Attributes }

// Header returns the native header named key, as the transport read it.
func (in *Incoming) Header(key string) (string, bool) {
	v, ok := in.r.d.Headers[key]
	return v, ok
}

// Headers iterates over the native headers the transport read.
func (in *Incoming) Headers() iter.Seq2[string, string] { return maps.All(in.r.d.Headers) }

// Body returns the encoded message. It must not be modified.
func (in *Incoming) Body() []byte { return in.r.d.Body }

// ContentType returns the content type the message was encoded with.
func (in *Incoming) ContentType() string { return in.r.d.ContentType }

// Raw returns the transport-native message, for example a *amqp091.Delivery.
// It is valid until the message is settled: a transport may reuse it.
func (in *Incoming) Raw() any { return in.r.d.Raw }

// Attempt returns the delivery attempt, 1 the first time.
func (in *Incoming) Attempt() int { return in.r.d.Attempt }

// Endpoint returns the endpoint receiving the message.
func (in *Incoming) Endpoint() string { return in.r.endpoint }

// Unhandled reports whether the rest of the chain reached the bus's
// terminal step and found no handler for the message's name. Read it after
// next returned: next then returned a [*NoHandlerError] (the message is
// dead-lettered), or nil when the bus discards such messages
// ([UnhandledDiscard]: the message is deleted). It is false before next
// is called, when a middleware further in handled the message without
// calling its next, and in a context made by [NewIncoming] (an
// out-of-process plugin's). The otel plugin counts discarded messages with
// it; reading it costs nothing.
func (in *Incoming) Unhandled() bool { return in.r.unhandled }

// Middleware returns the name of the middleware this context was given to.
func (in *Incoming) Middleware() string { return in.r.middlewareName(in.i) }

// Logger returns the bus logger scoped with the stage, the middleware and
// the message (name, id, correlation id).
func (in *Incoming) Logger() *slog.Logger { return in.r.logger(in.i) }

// Handling is the handler stage's view of one handler about to handle one
// message. It is valid only while the middleware that received it runs.
type Handling struct {
	r *handlingRun
	i int
}

type handlingRun struct {
	run[Handling, HandlingNext, *HandlingNext]
	b     *Bus
	h     *handler
	msg   any // as the handler's decode returned it (see handler.asReceived)
	d     *Delivery
	scope *handlerScope
}

func newHandlingRun(b *Bus, p *pipe[Handling, HandlingNext]) *handlingRun {
	r := &handlingRun{b: b}
	r.init(p, func(i int) Handling { return Handling{r: r, i: i} }, invokeHandler,
		func() []any { return append(describeEnvelope(&r.d.Envelope), slog.String("handler", r.h.name)) },
		"handler skipped by handler middleware")
	return r
}

// invokeHandler is the handler stage's terminal step: it calls the handler.
func invokeHandler(ctx context.Context, hd *Handling, _ *HandlingNext) error {
	r := hd.r
	e, err := r.enterTerminal()
	if err != nil {
		return err
	}
	err = r.h.invoke(ctx, r.msg, r.d.Attributes)
	r.leaveTerminal(e, err)
	return err
}

// HandlerName returns the name of the handler.
func (h *Handling) HandlerName() string { return h.r.h.name }

// MessageName returns the message's wire name.
func (h *Handling) MessageName() string { return h.r.d.Name }

// Message returns the decoded message the handler will receive. It must not
// be modified.
func (h *Handling) Message() Message {
	if asReceived := h.r.h.asReceived; asReceived != nil {
		return asReceived(h.r.msg)
	}
	m, _ := h.r.msg.(Message)
	return m
}

// Attributes returns the message's attributes.
func (h *Handling) Attributes() Attributes { return h.r.d.Attributes }

// Attempt returns the delivery attempt, 1 the first time.
func (h *Handling) Attempt() int { return h.r.d.Attempt }

// Body returns the encoded message as received. It must not be modified.
func (h *Handling) Body() []byte { return h.r.d.Body }

// Header returns the native header named key, as the transport read it.
func (h *Handling) Header(key string) (string, bool) {
	v, ok := h.r.d.Headers[key]
	return v, ok
}

// Headers iterates over the native headers the transport read.
func (h *Handling) Headers() iter.Seq2[string, string] { return maps.All(h.r.d.Headers) }

// Raw returns the transport-native message.
func (h *Handling) Raw() any { return h.r.d.Raw }

// Middleware returns the name of the middleware this context was given to.
func (h *Handling) Middleware() string { return h.r.middlewareName(h.i) }

// Logger returns the bus logger scoped with the stage, the middleware, the
// message and the handler.
func (h *Handling) Logger() *slog.Logger { return h.r.logger(h.i) }

// UseOutbox makes the messages this handler sends go to o instead of the
// in-memory buffer that is flushed when the handler succeeds; messages the
// handler already sent move to o, with ctx. A durable outbox plugin calls
// it to store them in the handler's transaction, and calls restore when
// that transaction ends, so that what outer middleware sends afterwards
// (an error reply, say) goes to the previous outbox again:
//
//	restore, err := h.UseOutbox(ctx, tx)
//	if err != nil {
//		return err
//	}
//	defer restore()
//	return next.Call(ctx)
//
// restore is never nil.
func (h *Handling) UseOutbox(ctx context.Context, o Outbox) (restore func(), err error) {
	if h.r.scope == nil {
		return func() {}, nil
	}
	return h.r.scope.setOutbox(ctx, o)
}

// Outgoing is the outgoing stage's view of one message being sent or
// published. Its attributes and headers may be changed. It is valid only
// while the middleware that received it runs.
type Outgoing struct {
	r *outgoingRun
	i int
}

type outgoingRun struct {
	run[Outgoing, OutgoingNext, *OutgoingNext]
	b               *Bus
	kind            Kind
	msg             Message
	msgName         string
	dest            string
	attrs           Attributes
	owned           uint8 // which of attrs's maps the run may change in place: ownValues, ownSticky
	headers         Headers
	due             time.Time     // zero: now
	scope           *handlerScope // the handler scope it inherits from, if any
	bufferInHandler bool          // into scope's outbox (not Immediately)
	lentEnvelope    Envelope      // handed to a transport that copies envelopes (see EnvelopeCopier)

	// A message for an outbox or a handler's buffer is held by the
	// terminal step and stored by emit once the whole chain returned nil,
	// so that an error returned after next stores nothing.
	contextOutbox Outbox        // the outbox in the caller's context; nil: the handler's buffer, if bufferInHandler
	holdStarted   atomic.Uint64 // the last epoch whose terminal step started holding
	held          Outbound      // the held message; Envelope nil when none
	batch         *[]Outbound   // where a batch outside a handler collects held messages; nil: none
	self          Outgoing      // the run as finishOutgoing's stage context
}

// holds reports whether the terminal step holds the message for emit to
// store, rather than handing it to the transport.
func (r *outgoingRun) holds() bool {
	return r.bufferInHandler || r.contextOutbox != nil || r.batch != nil
}

const (
	ownValues uint8 = 1 << iota
	ownSticky
)

func newOutgoingRun(b *Bus, p *pipe[Outgoing, OutgoingNext]) *outgoingRun {
	r := &outgoingRun{b: b}
	r.self = Outgoing{r: r}
	r.init(p, func(i int) Outgoing { return Outgoing{r: r, i: i} }, finishOutgoing,
		func() []any {
			return []any{slog.String("message_name", r.msgName), slog.String("message_id", r.attrs.MessageID),
				slog.String("correlation_id", r.attrs.CorrelationID), slog.String("kind", r.kind.String())}
		},
		"outgoing message dropped by middleware")
	return r
}

func (r *outgoingRun) reset() {
	r.msg, r.scope, r.headers, r.bufferInHandler = nil, nil, nil, false
	r.held, r.contextOutbox, r.batch = Outbound{}, nil, nil
	r.attrs = Attributes{}
	r.owned = 0
	r.due = time.Time{}
	r.lentEnvelope = Envelope{}
}

// Message returns the message being sent. It must not be modified.
func (o *Outgoing) Message() Message { return o.r.msg }

// Name returns the message's wire name.
func (o *Outgoing) Name() string { return o.r.msgName }

// Kind tells a send from a publish.
func (o *Outgoing) Kind() Kind { return o.r.kind }

// Destination returns the endpoint a sent message goes to; empty for a publish.
func (o *Outgoing) Destination() string { return o.r.dest }

// MessageID returns the message id.
func (o *Outgoing) MessageID() string { return o.r.attrs.MessageID }

// CorrelationID returns the correlation id as it is now.
func (o *Outgoing) CorrelationID() string { return o.r.attrs.CorrelationID }

// InHandler reports whether the message is sent from inside a handler and
// buffered in that handler's outbox (not sent with [Immediately]).
func (o *Outgoing) InHandler() bool { return o.r.bufferInHandler }

// Attributes returns the message's attributes as they are now.
func (o *Outgoing) Attributes() Attributes {
	o.r.owned = 0 // the maps are shared from now on: copy before the next change
	return o.r.attrs
}

// SetValue sets the one-hop attribute key.
func (o *Outgoing) SetValue(key, value string) {
	r := o.r
	if r.owned&ownValues == 0 {
		r.attrs.values = maps.Clone(r.attrs.values)
		if r.attrs.values == nil {
			r.attrs.values = make(map[string]string, 2)
		}
		r.owned |= ownValues
	}
	r.attrs.values[key] = value
}

// DeleteValue removes the one-hop attribute key.
func (o *Outgoing) DeleteValue(key string) {
	r := o.r
	if _, ok := r.attrs.values[key]; !ok {
		return
	}
	if r.owned&ownValues == 0 {
		r.attrs.values = maps.Clone(r.attrs.values)
		r.owned |= ownValues
	}
	delete(r.attrs.values, key)
}

// SetSticky sets the sticky attribute key: it is copied onto every
// message sent while this one is handled.
func (o *Outgoing) SetSticky(key, value string) {
	r := o.r
	if r.owned&ownSticky == 0 {
		r.attrs.sticky = maps.Clone(r.attrs.sticky)
		if r.attrs.sticky == nil {
			r.attrs.sticky = make(map[string]string, 2)
		}
		r.owned |= ownSticky
	}
	r.attrs.sticky[key] = value
}

// SetCorrelationID replaces the correlation id.
func (o *Outgoing) SetCorrelationID(id string) { o.r.attrs.CorrelationID = id }

// Due returns the earliest time the message may be delivered, as it is
// now ([Delay], [At], or a middleware's SetDue); zero when it goes now. A
// due time that has passed also means now.
func (o *Outgoing) Due() time.Time { return o.r.due }

// SetDue changes the earliest time the message may be delivered: zero (or
// a time that has passed) delivers it now. The bus checks it against the
// transport's [Delayer.MaxDelay] once the chain reached its end, and Send
// returns a [*DelayTooLongError] for one too far ahead.
func (o *Outgoing) SetDue(t time.Time) { o.r.due = t }

// Headers returns the native headers bag of the message, to read or change.
func (o *Outgoing) Headers() Headers {
	if o.r.headers == nil {
		o.r.headers = make(Headers, 2)
	}
	return o.r.headers
}

// Middleware returns the name of the middleware this context was given to.
func (o *Outgoing) Middleware() string { return o.r.middlewareName(o.i) }

// Logger returns the bus logger scoped with the stage, the middleware and
// the message.
func (o *Outgoing) Logger() *slog.Logger { return o.r.logger(o.i) }

func describeEnvelope(e *Envelope) []any {
	return []any{slog.String("message_name", e.Name), slog.String("message_id", e.Attributes.MessageID),
		slog.String("correlation_id", e.Attributes.CorrelationID)}
}
