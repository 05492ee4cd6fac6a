// Package validation refuses invalid messages at both ends: a message
// whose type has a Validate() error method ([Validator]) that returns an
// error is refused at Send or Publish, which return the error and send
// nothing (outgoing stage), and, received, is dead-lettered at once as a
// permanent failure ([bus.Permanent]) before its handler runs (handler
// stage), since no retry can make it valid.
//
//	bus.WithMiddleware(validation.New())
//
//	func (m PlaceOrder) Validate() error {
//		if m.Quantity < 1 {
//			return fmt.Errorf("quantity %d: order at least 1", m.Quantity)
//		}
//		return nil
//	}
//
// Given to one handler ([bus.HandlerMiddleware]) it checks what that
// handler receives, and nothing that is sent. A message without the
// method passes. Declare Validate on the value (not the pointer) for it
// to be found both on a T and on a *T.
//
// It needs the message's Go type, so it runs in process: served from
// another process, a middleware sees messages as their JSON
// (sdk.RawMessage), which has no Validate method.
package validation

import (
	"context"
	"errors"
	"fmt"

	"github.com/plugbus/plugbus/bus"
)

// Validator is a message that can check itself.
type Validator interface {
	Validate() error
}

// ErrInvalid is matched by every [*Error].
var ErrInvalid = errors.New("validation: invalid message")

// Error is a message's failed validation.
type Error struct {
	// Message is the message's name.
	Message string
	// Err is what Validate returned.
	Err error
}

// Error names the message and says why it is invalid.
func (e *Error) Error() string {
	return fmt.Sprintf("validation: message %s is invalid: %v", e.Message, e.Err)
}

// Is reports whether target is ErrInvalid.
func (e *Error) Is(target error) bool { return target == ErrInvalid }

// Unwrap returns what Validate returned.
func (e *Error) Unwrap() error { return e.Err }

// Validate returns an [*Error] when m is a [Validator] that finds itself
// invalid, else nil.
func Validate(m bus.Message) error {
	v, ok := m.(Validator)
	if !ok {
		return nil
	}
	if err := v.Validate(); err != nil {
		return &Error{Message: m.MessageName(), Err: err}
	}
	return nil
}

// New returns a plugin that validates what is sent and what is received.
func New() bus.Plugin {
	return bus.PluginFunc(func(info bus.PluginInfo) (bus.Middleware, error) {
		m := bus.Middleware{Name: "validation", Handling: handling}
		if info.Handler == "" {
			m.Outgoing = outgoing
		}
		return m, nil
	})
}

func outgoing(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
	if err := Validate(out.Message()); err != nil {
		return err
	}
	return next.Call(ctx)
}

func handling(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
	if err := Validate(h.Message()); err != nil {
		return bus.Permanent(err)
	}
	return next.Call(ctx)
}
