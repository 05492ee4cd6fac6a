// Package timeout gives each handler a deadline: its ctx is cancelled when
// the deadline passes, and a handler that then fails fails with an
// [*Error] naming the handler and the deadline it ran out of.
//
// At the bus level it gives every handler the same deadline; given to one
// handler ([bus.HandlerMiddleware]) it gives that handler its own:
//
//	bus.WithMiddleware(timeout.New(30*time.Second)),
//	bus.WithHandler(chargeCard, bus.HandlerMiddleware(timeout.New(5*time.Second))),
//
// The deadline is the ctx's: a handler has to watch ctx (pass it to the
// database driver, the HTTP client) to be stopped by it. A handler that
// returns nil after its deadline succeeded: its sends go out. A timeout is
// a transient failure, retried by the retry policy.
//
// Served from another process (package sdk), the deadline crosses to the
// host, which runs the handler under it.
package timeout

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/plugbus/plugbus/bus"
)

// ErrTimeout is matched by every [*Error].
var ErrTimeout = errors.New("timeout: handler ran out of its deadline")

// Error is a handler's failure after its deadline passed.
type Error struct {
	// Handler and Message name the handler and the message it handled.
	Handler, Message string
	// After is the deadline the handler had.
	After time.Duration
	// Err is what the handler (or the middleware inside) returned,
	// usually context.DeadlineExceeded.
	Err error
}

// Error says which handler ran out of which deadline.
func (e *Error) Error() string {
	return fmt.Sprintf("timeout: handler %s of %s ran out of its %v deadline: %v", e.Handler, e.Message, e.After, e.Err)
}

// Is reports whether target is ErrTimeout.
func (e *Error) Is(target error) bool { return target == ErrTimeout }

// Unwrap returns the handler's error.
func (e *Error) Unwrap() error { return e.Err }

// New returns a plugin that gives each handler a deadline of d from the
// moment its handler stage starts. d must be positive. A ctx whose
// deadline is earlier (a Lambda invocation's) keeps it, and a failure at
// that earlier deadline is not reported as this timeout's.
func New(d time.Duration) bus.Plugin {
	return bus.PluginFunc(func(bus.PluginInfo) (bus.Middleware, error) {
		if d <= 0 {
			return bus.Middleware{}, fmt.Errorf("timeout.New(%v): the deadline must be positive", d)
		}
		return bus.Middleware{Name: "timeout", Handling: func(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
			deadline := time.Now().Add(d)
			outer, hasOuter := ctx.Deadline()
			ctx, cancel := context.WithDeadline(ctx, deadline)
			defer cancel()
			err := next.Call(ctx)
			// Time decides, not ctx.Err: out of process, the host's
			// deadline may end the handler before this process's timer
			// fires.
			if err != nil && (!hasOuter || deadline.Before(outer)) && !time.Now().Before(deadline) {
				return &Error{Handler: h.HandlerName(), Message: h.MessageName(), After: d, Err: err}
			}
			return err
		}}, nil
	})
}
