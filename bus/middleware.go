package bus

import (
	"context"
	"log/slog"
)

// Stage names one of the three points where middleware runs.
type Stage uint8

const (
	// StageIncoming runs once per received message, before any handler.
	StageIncoming Stage = iota + 1
	// StageHandler runs around each handler, inside that handler's outbox.
	StageHandler
	// StageOutgoing runs when Send or Publish is called.
	StageOutgoing
)

// String implements fmt.Stringer.
func (s Stage) String() string {
	switch s {
	case StageIncoming:
		return "incoming"
	case StageHandler:
		return "handler"
	case StageOutgoing:
		return "outgoing"
	}
	return "unknown"
}

// IncomingNext, [HandlingNext] and [OutgoingNext] continue a stage's
// chain: their Call runs the next middleware of the stage, or the stage's
// terminal step after the last one. Pass Call a context derived from the
// one you received to hand values downstream:
//
//	func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
//		return next.Call(ctx)
//	}
//
// Call it at most once: a second call returns a [*NextMisuseError] and
// runs nothing. A next is not safe for concurrent use (two calls at once
// are a data race; the handlers, or the send, still run once: the
// terminal step refuses the second with a NextMisuseError naming the
// innermost middleware), and is valid only while the middleware that
// received it runs: a middleware that hands it to another goroutine (a
// timeout) waits for it to return, or returns an error (which a
// middleware around it may catch). Once an invocation ended otherwise
// than cleanly (the chain failed or panicked, a next in it returned an
// error that a middleware caught, or the chain returned nil without
// reaching the terminal step), a next still on its way — on a timed-out
// goroutine, or kept — that reaches the terminal step runs no handler and
// sends nothing: it returns a [*NextMisuseError] with AfterReturn. A next
// kept after a successful call reports a second call until the bus
// reuses the invocation's pooled state for another message, whose chain
// it may then run: do not keep it.
//
// A next is a pointer whose Call the compiler inlines into the middleware,
// so that a layer costs one call, as a function wrapping a handler does.
// Outside a bus (tests, a process serving a plugin), [NewIncomingNext] and
// its siblings make one from a function.
type IncomingNext hop[Incoming, IncomingNext]

// Call runs the rest of the incoming chain with ctx.
func (n *IncomingNext) Call(ctx context.Context) error {
	if n.ret != error(errFresh) { // see hop
		return n.twice
	}
	n.ret = n.fn(ctx, n.c, n.next)
	return n.ret
}

// HandlingNext continues the handler stage's chain; see [IncomingNext].
type HandlingNext hop[Handling, HandlingNext]

// Call runs the rest of the handler chain with ctx.
func (n *HandlingNext) Call(ctx context.Context) error {
	if n.ret != error(errFresh) { // see hop
		return n.twice
	}
	n.ret = n.fn(ctx, n.c, n.next)
	return n.ret
}

// OutgoingNext continues the outgoing stage's chain; see [IncomingNext].
type OutgoingNext hop[Outgoing, OutgoingNext]

// Call runs the rest of the outgoing chain with ctx.
func (n *OutgoingNext) Call(ctx context.Context) error {
	if n.ret != error(errFresh) { // see hop
		return n.twice
	}
	n.ret = n.fn(ctx, n.c, n.next)
	return n.ret
}

// Next is what the three stages' nexts have in common, for code that
// several stages share: *IncomingNext, *HandlingNext and *OutgoingNext
// implement it. A middleware calls the next it was given, not an
// interface: a call through Next costs one more indirect call.
type Next interface {
	Call(ctx context.Context) error
}

// Reset re-arms a next made by [NewIncomingNext] for another invocation
// (a benchmark's loop, the next message of a process serving a plugin).
// It does nothing to a bus's next.
func (n *IncomingNext) Reset() {
	if n.f != nil {
		n.ret = errFresh
	}
}

// NewIncomingNext returns a next whose Call calls fn, to call an
// [IncomingFunc] outside a bus: in a test (package bustest records calls
// with it) or in a process serving a plugin, where fn crosses back to the
// host. Like a bus's, it runs once: a second Call returns a
// [*NextMisuseError] without calling fn, until [IncomingNext.Reset]. The
// error names the middleware "middleware"; [StageMaker.IncomingNext]
// makes one that names the StageMaker's.
func NewIncomingNext(fn func(ctx context.Context) error) *IncomingNext {
	return (*IncomingNext)(standaloneHop[Incoming, IncomingNext](fn, &NextMisuseError{Stage: StageIncoming, Middleware: "middleware"}))
}

// Reset re-arms a next made by [NewHandlingNext] for another invocation
// (a benchmark's loop, the next message of a process serving a plugin).
// It does nothing to a bus's next.
func (n *HandlingNext) Reset() {
	if n.f != nil {
		n.ret = errFresh
	}
}

// NewHandlingNext is [NewIncomingNext] for a [HandlingFunc].
func NewHandlingNext(fn func(ctx context.Context) error) *HandlingNext {
	return (*HandlingNext)(standaloneHop[Handling, HandlingNext](fn, &NextMisuseError{Stage: StageHandler, Middleware: "middleware"}))
}

// Reset re-arms a next made by [NewOutgoingNext] for another invocation
// (a benchmark's loop, the next message of a process serving a plugin).
// It does nothing to a bus's next.
func (n *OutgoingNext) Reset() {
	if n.f != nil {
		n.ret = errFresh
	}
}

// NewOutgoingNext is [NewIncomingNext] for an [OutgoingFunc].
func NewOutgoingNext(fn func(ctx context.Context) error) *OutgoingNext {
	return (*OutgoingNext)(standaloneHop[Outgoing, OutgoingNext](fn, &NextMisuseError{Stage: StageOutgoing, Middleware: "middleware"}))
}

// IncomingFunc is the incoming stage of a middleware. It runs once per
// received message, whether or not a handler handles it.
//
//   - return next.Call(ctx): pass through;
//   - return nil without calling next: the message is handled, handlers are
//     skipped and the message is deleted;
//   - return an error: the message is returned for retry (or dead-lettered
//     after the maximum attempts); catching the error of next and returning
//     nil marks it handled.
//
// The message and its attributes are read-only.
type IncomingFunc func(ctx context.Context, in *Incoming, next *IncomingNext) error

// HandlingFunc is the handler stage of a middleware. It runs around each
// handler, inside that handler's outbox.
//
//   - return nil without calling next: that handler is skipped and counts
//     as succeeded;
//   - return an error: that handler alone fails, its buffered sends are
//     discarded, its siblings are unaffected and the message is retried.
type HandlingFunc func(ctx context.Context, h *Handling, next *HandlingNext) error

// OutgoingFunc is the outgoing stage of a middleware. It runs when Send or
// Publish is called, after the correlation id and sticky attributes are
// merged and before the message is buffered or handed to the transport.
// It may change attributes and native headers.
//
//   - return nil without calling next: the message is dropped (a debug log
//     names the middleware);
//   - return an error: that Send or Publish returns it and nothing is buffered.
type OutgoingFunc func(ctx context.Context, out *Outgoing, next *OutgoingNext) error

// Middleware is one bus's instance of a plugin: a name and up to three
// stages, plus optional hooks run with the bus's lifecycle. A nil stage
// costs nothing.
//
// Within each stage, middleware runs in registration order and the first
// registered is the outermost layer:
//
//	WithMiddleware(a, b)
//
//	a.Incoming ─▶ b.Incoming ─▶ handlers ─▶ b returns ─▶ a returns
//
// Given to one handler with [HandlerMiddleware], a middleware runs in that
// handler's handler stage only, inside the bus's:
//
//	WithMiddleware(a, b), WithHandler(h, HandlerMiddleware(x))
//
//	a.Handling ─▶ b.Handling ─▶ x.Handling ─▶ h
//
// A Middleware value is itself a [Plugin] that returns itself, so a
// stateless middleware can be passed to [WithMiddleware] directly.
type Middleware struct {
	// Name identifies the middleware in logs and errors. Required.
	Name string

	Incoming IncomingFunc
	Handling HandlingFunc
	Outgoing OutgoingFunc

	// Start, when set, runs at bus Start after the transport is set up and
	// before messages are received, in registration order. An error aborts Start.
	Start func(ctx context.Context) error
	// Stop, when set, runs at bus Stop after in-flight messages drained, in
	// reverse registration order.
	Stop func(ctx context.Context) error

	// InstanceQueue asks the bus for a queue of this bus instance alone
	// (see [InstanceQueuer]); New fails when the transport cannot give one.
	// The bus then receives even without an endpoint, once started.
	InstanceQueue bool

	// Unique says the middleware runs at most once around a handler: New
	// refuses, with a [*DuplicateMiddlewareError], a second middleware of
	// the same Name on the bus, or given to a handler with
	// [HandlerMiddleware] when the bus has one already. Set it for a
	// middleware that a second copy breaks or doubles (an outbox, a
	// tracer), not for one that may be stacked with other settings (two
	// rate limits).
	Unique bool

	// TxSource, when not nil, identifies where the transaction comes
	// from that the middleware runs handlers in: the outbox, inbox and
	// saga plugins set their *store.Store. It must be comparable (a
	// pointer). A handler runs in one transaction, so New refuses, with a
	// [*TxSourceConflictError], two middleware around one handler (of the
	// bus, or given to the handler with [HandlerMiddleware]) whose
	// TxSources differ. A middleware of the bus without a handler stage
	// (a saga's) runs only handlers of its own in that transaction: New
	// compares it with the bus's other middleware, not with those given
	// to another handler.
	TxSource any
}

// Instantiate returns m itself: a Middleware is a stateless plugin.
func (m Middleware) Instantiate(PluginInfo) (Middleware, error) { return m, nil }

// Plugin makes the middleware of one bus. The bus calls Instantiate once,
// from [New]; a plugin that keeps state keeps it in what it returns, never
// at package level, so two buses never share it.
type Plugin interface {
	Instantiate(info PluginInfo) (Middleware, error)
}

// PluginFunc adapts a function to [Plugin].
type PluginFunc func(info PluginInfo) (Middleware, error)

// Instantiate calls f.
func (f PluginFunc) Instantiate(info PluginInfo) (Middleware, error) { return f(info) }

// PluginInfo is what a plugin receives from the bus it is instantiated for.
type PluginInfo struct {
	// Bus is the bus under construction. It may be stored and used once
	// the bus is returned by New (for example to send from a Start hook).
	Bus *Bus
	// Name is the bus's name; Endpoint its endpoint (empty on a send-only bus).
	Name, Endpoint string
	// Logger is the bus's logger.
	Logger *slog.Logger
	// Transport is the bus's transport.
	Transport Transport
	// Handles lists the message names the bus handles; for a plugin
	// given to one handler ([HandlerMiddleware]), that handler's message
	// name alone.
	Handles []string
	// Handler is the name of the handler the plugin is instantiated for
	// with [HandlerMiddleware]; empty for a plugin of the whole bus
	// ([WithMiddleware]). A plugin that works at both levels reads it to
	// return only a handler stage for one handler.
	Handler string
}
