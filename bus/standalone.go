package bus

import (
	"context"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/plugbus/plugbus/internal/lazylog"
)

// StageInfo describes a stage context made outside a bus, by
// [NewIncoming], [NewHandling] or [NewOutgoing].
type StageInfo struct {
	// Middleware is the name the context reports; default "middleware".
	Middleware string
	// Endpoint is the receiving endpoint.
	Endpoint string
	// Logger is scoped like a bus would scope it; default slog.Default().
	Logger *slog.Logger
}

func standalonePipe[C, N any](stage Stage, info StageInfo) *pipe[C, N] {
	if info.Middleware == "" {
		info.Middleware = "middleware"
	}
	if info.Logger == nil {
		info.Logger = slog.Default()
	}
	p := &pipe[C, N]{stage: stage}
	p.names = []string{info.Middleware}
	p.twice = []error{&NextMisuseError{Stage: stage, Middleware: info.Middleware}}
	// Scoped when a record is handled: scoping eagerly would cost every
	// standalone context (a plugin process makes one per message).
	scoped := lazylog.New(info.Logger.Handler(), slog.String("stage", stage.String()), slog.String("middleware", info.Middleware))
	p.base = []*slog.Logger{slog.New(scoped)}
	return p
}

// NewIncoming returns an incoming stage context for d outside any bus, to
// call an [IncomingFunc] directly: in unit tests (see package bustest) or
// in a process that serves a plugin.
func NewIncoming(d *Delivery, info StageInfo) *Incoming {
	return NewStageMaker(info).Incoming(d, "")
}

// NewHandling returns a handler stage context for the handler handlerName about to handle
// msg, received as d, outside any bus. UseOutbox on it records nothing.
func NewHandling(handlerName string, msg Message, d *Delivery, info StageInfo) *Handling {
	return NewStageMaker(info).Handling(handlerName, msg, d)
}

// StageMaker makes stage contexts outside any bus for one middleware, as
// [NewIncoming], [NewHandling] and [NewOutgoing] do, sharing what they
// have in common (the middleware's name, its scoped logger) from one
// context to the next: a process that serves a plugin makes one per
// message. It is safe for concurrent use.
//
// A context given back with [StageMaker.ReleaseIncoming] or
// [StageMaker.ReleaseHandling] is reused by a later call, so that making
// one allocates nothing.
type StageMaker struct {
	info         StageInfo
	incoming     *pipe[Incoming, IncomingNext]
	handling     *pipe[Handling, HandlingNext]
	outgoing     *pipe[Outgoing, OutgoingNext]
	incomingRuns sync.Pool // *incomingRun given back
	handlingRuns sync.Pool // *handlingRun given back
}

// NewStageMaker returns a StageMaker for the middleware info describes.
func NewStageMaker(info StageInfo) *StageMaker {
	return &StageMaker{info: info, incoming: standalonePipe[Incoming, IncomingNext](StageIncoming, info),
		handling: standalonePipe[Handling, HandlingNext](StageHandler, info), outgoing: standalonePipe[Outgoing, OutgoingNext](StageOutgoing, info)}
}

// Incoming returns an incoming stage context for d, received by endpoint
// (empty: the StageInfo's Endpoint).
func (s *StageMaker) Incoming(d *Delivery, endpoint string) *Incoming {
	if endpoint == "" {
		endpoint = s.info.Endpoint
	}
	r, _ := s.incomingRuns.Get().(*incomingRun)
	if r == nil {
		r = &incomingRun{}
		r.init(s.incoming, func(i int) Incoming { return Incoming{r: r, i: i} },
			nil, func() []any { return describeEnvelope(&r.d.Envelope) }, "")
	}
	r.d, r.endpoint = d, endpoint
	return &r.contexts[0]
}

// ReleaseIncoming gives back in, made by s.Incoming, for a later call to
// reuse: call it once the middleware given in returned, when nothing it
// started may still read in (it called next before returning, and its
// next returned nil). Neither in nor its Delivery may be used afterwards.
func (s *StageMaker) ReleaseIncoming(in *Incoming) {
	r := in.r
	r.d, r.endpoint = nil, ""
	clear(r.messageLoggers)
	s.incomingRuns.Put(r)
}

// Handling returns a handler stage context for the handler handlerName
// about to handle msg, received as d. UseOutbox on it records nothing.
func (s *StageMaker) Handling(handlerName string, msg Message, d *Delivery) *Handling {
	r, _ := s.handlingRuns.Get().(*handlingRun)
	if r == nil {
		r = &handlingRun{h: &handler{}}
		r.init(s.handling, func(i int) Handling { return Handling{r: r, i: i} },
			nil, func() []any { return append(describeEnvelope(&r.d.Envelope), slog.String("handler", r.h.name)) }, "")
	}
	r.h.name, r.msg, r.d = handlerName, msg, d
	return &r.contexts[0]
}

// ReleaseHandling gives back h, made by s.Handling, for a later call to
// reuse, under the conditions of [StageMaker.ReleaseIncoming].
func (s *StageMaker) ReleaseHandling(h *Handling) {
	r := h.r
	r.h.name, r.msg, r.d = "", nil, nil
	clear(r.messageLoggers)
	s.handlingRuns.Put(r)
}

// IncomingNext returns a next for an incoming stage context made by s,
// as [NewIncomingNext] does, whose error for a second call names the
// StageMaker's middleware.
func (s *StageMaker) IncomingNext(fn func(ctx context.Context) error) *IncomingNext {
	return (*IncomingNext)(standaloneHop[Incoming, IncomingNext](fn, s.incoming.twice[0]))
}

// HandlingNext is [StageMaker.IncomingNext] for a handler stage.
func (s *StageMaker) HandlingNext(fn func(ctx context.Context) error) *HandlingNext {
	return (*HandlingNext)(standaloneHop[Handling, HandlingNext](fn, s.handling.twice[0]))
}

// OutgoingNext is [StageMaker.IncomingNext] for an outgoing stage.
func (s *StageMaker) OutgoingNext(fn func(ctx context.Context) error) *OutgoingNext {
	return (*OutgoingNext)(standaloneHop[Outgoing, OutgoingNext](fn, s.outgoing.twice[0]))
}

// OutgoingMessage describes a message being sent, for [NewOutgoing].
type OutgoingMessage struct {
	Kind        Kind
	Name        string
	Message     Message // may be nil where the Go value is unknown
	Destination string
	Attributes  Attributes
	Headers     Headers
	InHandler   bool
	Due         time.Time // zero: now
}

// NewOutgoing returns an outgoing stage context for m outside any bus.
// Read the result of a middleware with its Attributes, Headers and Due
// methods.
func NewOutgoing(m OutgoingMessage, info StageInfo) *Outgoing {
	return NewStageMaker(info).Outgoing(m)
}

// Outgoing returns an outgoing stage context for m, as [NewOutgoing] does.
func (s *StageMaker) Outgoing(m OutgoingMessage) *Outgoing {
	r := &outgoingRun{kind: m.Kind, msg: m.Message, msgName: m.Name, dest: m.Destination, attrs: m.Attributes, headers: maps.Clone(m.Headers), due: m.Due}
	if m.Name == "" && m.Message != nil {
		r.msgName = m.Message.MessageName()
	}
	if m.InHandler {
		r.scope, r.bufferInHandler = &handlerScope{Context: context.Background()}, true
	}
	r.init(s.outgoing, func(i int) Outgoing { return Outgoing{r: r, i: i} },
		nil, func() []any {
			return []any{slog.String("message_name", r.msgName), slog.String("message_id", r.attrs.MessageID)}
		}, "")
	return &r.contexts[0]
}

// outboxKey carries an outbox put in the context by ContextWithOutbox.
type outboxKey struct{}

type ctxOutbox struct {
	bus    *Bus
	outbox Outbox
}

// ContextWithOutbox returns a context in which messages that b sends or
// publishes go to o once the outgoing middleware returned nil, instead of
// to the transport — or, inside a handler, instead of to the handler's
// buffer, so that they commit with the caller's transaction whatever the
// handler does next. A durable outbox uses it to store messages in a
// transaction the caller opened (an HTTP handler writing an order and
// publishing OrderPlaced atomically). A send with [Immediately] goes past
// it to the transport.
func ContextWithOutbox(ctx context.Context, b *Bus, o Outbox) context.Context {
	return context.WithValue(ctx, outboxKey{}, &ctxOutbox{bus: b, outbox: o})
}

func outboxFrom(ctx context.Context, b *Bus) Outbox {
	if c, _ := ctx.Value(outboxKey{}).(*ctxOutbox); c != nil && c.bus == b {
		return c.outbox
	}
	return nil
}
