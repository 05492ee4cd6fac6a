package requestreply

import (
	"errors"
	"fmt"
	"time"
)

var (
	// ErrTimeout is matched by [*TimeoutError].
	ErrTimeout = errors.New("requestreply: no reply in time")
	// ErrResponder is matched by [*Error]: the responder answered with an error.
	ErrResponder = errors.New("requestreply: the responder answered with an error")
	// ErrTooManyPending is matched by [*PendingLimitError].
	ErrTooManyPending = errors.New("requestreply: too many requests waiting for replies")
	// ErrNoPlugin is returned by [Request] on a bus without the plugin,
	// before anything is sent.
	ErrNoPlugin = errors.New("requestreply: the bus has no requestreply plugin: add bus.WithMiddleware(requestreply.New()) to the requesting bus")
	// ErrNotRequest is returned by [Reply] and [ReplyError] when the message
	// being handled carries no reply address: it was not sent by [Request].
	// It is returned marked permanent (bus.Permanent): no retry gives the
	// message a reply address, so a handler that returns it dead-letters
	// the message at once, with this reason.
	ErrNotRequest = errors.New("requestreply: the message being handled is not a request (no reply address): it was sent with bus.Send, or by a bus without the requestreply plugin")
	// ErrNoHandlerContext is returned by [Reply] and [ReplyError] called with
	// a context that is not a handler's.
	ErrNoHandlerContext = errors.New("requestreply: Reply needs the context the handler received (or one derived from it)")
)

// Error is an error answered by a responder. The requester receives it from
// [Request]; errors.Is(err, ErrResponder) matches it, and errors.As gives
// its Code.
//
// A handler answers a request with an error by returning an *Error (on a
// bus with the plugin) or by calling [ReplyError].
type Error struct {
	// Code is an application-defined code the requester can switch on,
	// such as "not_found". It may be empty.
	Code string
	// Message describes the error.
	Message string
}

// Errorf returns an [*Error] with code and a formatted message.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Error implements error.
func (e *Error) Error() string {
	if e.Code == "" {
		return "requestreply: responder error: " + e.Message
	}
	return "requestreply: responder error " + e.Code + ": " + e.Message
}

// Is reports whether target is ErrResponder.
func (e *Error) Is(target error) bool { return target == ErrResponder }

// TimeoutError reports a request whose reply did not arrive before its
// deadline. Its pending entry is removed: a reply arriving later is dropped.
type TimeoutError struct {
	// Request is the request's message name.
	Request string
	// Destination is the endpoint the request was sent to.
	Destination string
	// RequestID is the id stamped on the request ([AttrRequestID]).
	RequestID string
	// Waited is how long Request waited after sending.
	Waited time.Duration
	// Err is the context's error, context.DeadlineExceeded.
	Err error
}

// Error implements error.
func (e *TimeoutError) Error() string {
	return fmt.Sprintf("requestreply: no reply to %s (request %s) from %q within %v: the responder is down, slow or failing (a failing handler is retried), or its reply was lost; raise the deadline with requestreply.WithTimeout or the context, and check the responder's logs and dead-letter queue",
		e.Request, e.RequestID, e.Destination, e.Waited.Round(time.Millisecond))
}

// Is reports whether target is ErrTimeout.
func (e *TimeoutError) Is(target error) bool { return target == ErrTimeout }

// Unwrap returns the context's error.
func (e *TimeoutError) Unwrap() error { return e.Err }

// PendingLimitError reports a request refused because the table of
// pending requests is full ([WithMaxPending]). Nothing was sent.
type PendingLimitError struct {
	Limit int
}

// Error implements error.
func (e *PendingLimitError) Error() string {
	return fmt.Sprintf("requestreply: %d requests are already waiting for replies (the limit): nothing was sent; retry later, shorten timeouts, or raise the limit with requestreply.WithMaxPending", e.Limit)
}

// Is reports whether target is ErrTooManyPending.
func (e *PendingLimitError) Is(target error) bool { return target == ErrTooManyPending }

// ReplyTypeError reports a reply whose message name is not the one of the
// type [Request] was asked to return.
type ReplyTypeError struct {
	// Want is the message name of the requested response type.
	Want string
	// Got is the message name of the reply.
	Got string
}

// Error implements error.
func (e *ReplyTypeError) Error() string {
	return fmt.Sprintf("requestreply: the reply is %s, but the request expects %s: call Request with the type the responder replies with", e.Got, e.Want)
}
