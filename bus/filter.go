package bus

import "context"

// FilterResult is a filter's decision.
type FilterResult uint8

const (
	// Continue lets the message through to the rest of the chain.
	Continue FilterResult = iota
	// Stop ends the chain: an incoming message is handled without running
	// handlers (and deleted); an outgoing message is dropped.
	Stop
)

// FilterIncoming returns a middleware whose incoming stage asks f whether a
// received message proceeds. It is sugar for an IncomingFunc that calls
// next on Continue and returns nil on Stop. For a check that can fail
// (a lookup), write an IncomingFunc and return the error, so the message is
// retried.
func FilterIncoming(name string, f func(ctx context.Context, in *Incoming) FilterResult) Middleware {
	return Middleware{Name: name, Incoming: func(ctx context.Context, in *Incoming, next Next) error {
		if f(ctx, in) == Stop {
			return nil
		}
		return next(ctx)
	}}
}

// FilterOutgoing returns a middleware whose outgoing stage asks f whether a
// message being sent proceeds. Stop drops the message; Send returns nil.
func FilterOutgoing(name string, f func(ctx context.Context, out *Outgoing) FilterResult) Middleware {
	return Middleware{Name: name, Outgoing: func(ctx context.Context, out *Outgoing, next Next) error {
		if f(ctx, out) == Stop {
			return nil
		}
		return next(ctx)
	}}
}
