package bus

import "context"

// FilterResult is a filter's decision.
type FilterResult uint8

const (
	// FilterContinue lets the message through to the rest of the chain.
	FilterContinue FilterResult = iota
	// FilterStop ends the chain: an incoming message is handled without
	// running handlers (and deleted); an outgoing message is dropped.
	FilterStop
)

// FilterIncoming returns a middleware whose incoming stage asks f whether a
// received message proceeds. It is sugar for an IncomingFunc that calls
// next on FilterContinue and returns nil on FilterStop. For a check that can fail
// (a lookup), write an IncomingFunc and return the error, so the message is
// retried.
func FilterIncoming(name string, f func(ctx context.Context, in *Incoming) FilterResult) Middleware {
	return Middleware{Name: name, Incoming: func(ctx context.Context, in *Incoming, next *IncomingNext) error {
		if f(ctx, in) == FilterStop {
			return nil
		}
		return next.Call(ctx)
	}}
}

// FilterOutgoing returns a middleware whose outgoing stage asks f whether a
// message being sent proceeds. FilterStop drops the message; Send returns nil.
func FilterOutgoing(name string, f func(ctx context.Context, out *Outgoing) FilterResult) Middleware {
	return Middleware{Name: name, Outgoing: func(ctx context.Context, out *Outgoing, next *OutgoingNext) error {
		if f(ctx, out) == FilterStop {
			return nil
		}
		return next.Call(ctx)
	}}
}
