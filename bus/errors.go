package bus

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

var (
	// ErrClosed is returned by a bus or transport that was stopped.
	ErrClosed = errors.New("bus: closed")
	// ErrNotStarted is returned when an operation needs a started bus.
	ErrNotStarted = errors.New("bus: not started")
	// ErrAlreadyStarted is returned by Start on a bus that is running.
	ErrAlreadyStarted = errors.New("bus: already started")
	// ErrNextMisused is matched by [*NextMisuseError].
	ErrNextMisused = errors.New("bus: next called twice or after its middleware returned")
	// ErrHeaderReserved is matched by [*HeaderReservedError].
	ErrHeaderReserved = errors.New("bus: header name reserved by the transport")
	// ErrMessageTooLarge is matched by [*MessageTooLargeError].
	ErrMessageTooLarge = errors.New("bus: message too large for the transport")
	// ErrHandlerDispatchRejected is matched by [*HandlerDispatchRejectedError].
	ErrHandlerDispatchRejected = errors.New("bus: handler dispatch rejected")
	// ErrDecode is matched by [*DecodeError].
	ErrDecode = errors.New("bus: message cannot be decoded")
	// ErrNoHandler is matched by [*NoHandlerError].
	ErrNoHandler = errors.New("bus: no handler for message")
	// ErrNoRoute is returned by Send for a message with no destination: give
	// one with [To] or [WithRoute].
	ErrNoRoute = errors.New("bus: no route for message")
	// ErrDelayTooLong is matched by [*DelayTooLongError].
	ErrDelayTooLong = errors.New("bus: delivery delay beyond what the transport carries")
	// ErrBatchIncomplete is matched by [*BatchError].
	ErrBatchIncomplete = errors.New("bus: messages of a batch were not sent")
	// ErrPanic is matched by [*PanicError].
	ErrPanic = errors.New("bus: panic")
	// ErrInvalidMessage is returned by Send and Publish for a message they
	// cannot send: nil (or a nil pointer), or one whose MessageName
	// panics or is empty.
	ErrInvalidMessage = errors.New("bus: invalid message")
	// ErrInvalidOption is returned by Send and Publish for send options
	// that do not fit the call: [To] given to a publish, one
	// [WithMessageID] for a batch of several messages.
	ErrInvalidOption = errors.New("bus: invalid send option")
)

// NextMisuseError is returned by a next called when it may not run: a
// second time within one stage invocation, or after the invocation ended
// without the bus reusing its pooled state (it never does after a chain
// that failed, panicked or did not reach its terminal step, nor after one
// in which a next returned an error that a middleware caught). A next
// kept after a successful call reports a second call until the bus reuses
// the state for a later message, whose chain it may then run: next is
// valid only during the middleware's call.
type NextMisuseError struct {
	Stage      Stage
	Middleware string
	// AfterReturn tells the two misuses apart: true when a next reached
	// the stage's terminal step after the invocation ended (Middleware is
	// then the innermost middleware), false when a next was called a
	// second time.
	AfterReturn bool
}

// Error implements error.
func (e *NextMisuseError) Error() string {
	if e.AfterReturn {
		return fmt.Sprintf("bus: %s middleware %q called next after the invocation ended; next is valid only during the call", e.Stage, e.Middleware)
	}
	return fmt.Sprintf("bus: %s middleware %q called next twice; call it at most once", e.Stage, e.Middleware)
}

// Is reports whether target is ErrNextMisused.
func (e *NextMisuseError) Is(target error) bool { return target == ErrNextMisused }

// HeaderReservedError is returned by a transport refusing a header whose
// name it writes itself.
type HeaderReservedError struct {
	Transport string
	Header    string
}

// Error implements error.
func (e *HeaderReservedError) Error() string {
	return fmt.Sprintf("bus: header %q is reserved by the %s transport; choose another name", e.Header, e.Transport)
}

// Is reports whether target is ErrHeaderReserved.
func (e *HeaderReservedError) Is(target error) bool { return target == ErrHeaderReserved }

// MessageTooLargeError is returned by a transport's Send or Publish for a
// message larger than the transport accepts (its WithMaxMessageSize
// option, set to what the broker takes). Nothing was sent.
type MessageTooLargeError struct {
	// Transport names the transport: "rabbitmq", "sqs".
	Transport string
	// Message is the message name.
	Message string
	// Size is the message's size as the transport measures it against
	// Limit, in bytes: the body on RabbitMQ; on SQS the encoded body with
	// the names, types and values of its message attributes.
	Size int
	// Limit is the largest size the transport accepts, in bytes.
	Limit int
}

// Error implements error.
func (e *MessageTooLargeError) Error() string {
	return fmt.Sprintf("bus: message %s is %d bytes as the %s transport measures it, over its %d-byte limit; send large payloads by reference (store them elsewhere, for example in S3, and send their address), or raise the transport's WithMaxMessageSize as far as the broker accepts",
		e.Message, e.Size, e.Transport, e.Limit)
}

// Is reports whether target is ErrMessageTooLarge.
func (e *MessageTooLargeError) Is(target error) bool { return target == ErrMessageTooLarge }

// HandlerFailure is one handler's failure within a dispatch.
type HandlerFailure struct {
	Handler string
	Err     error
}

// HandlerDispatchRejectedError reports the handlers that failed for one
// message. The message is returned for retry; the handlers that succeeded
// already flushed their sends.
type HandlerDispatchRejectedError struct {
	Message  string // message name
	Failures []HandlerFailure
}

// Error implements error.
func (e *HandlerDispatchRejectedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "bus: %d handler(s) of %s failed:", len(e.Failures), e.Message)
	for i, f := range e.Failures {
		if i > 0 {
			b.WriteString(";")
		}
		fmt.Fprintf(&b, " %s: %v", f.Handler, f.Err)
	}
	return b.String()
}

// Is reports whether target is ErrHandlerDispatchRejected.
func (e *HandlerDispatchRejectedError) Is(target error) bool {
	return target == ErrHandlerDispatchRejected
}

// Unwrap returns the handlers' errors.
func (e *HandlerDispatchRejectedError) Unwrap() []error {
	errs := make([]error, len(e.Failures))
	for i, f := range e.Failures {
		errs[i] = f.Err
	}
	return errs
}

// DecodeError reports a received message whose body the serializer could
// not decode into a handler's type. Such a message is dead-lettered at once:
// retrying cannot help.
type DecodeError struct {
	Message string // message name, as received (Error quotes it)
	Type    string // Go type it was decoded into
	Err     error
}

// Error implements error.
func (e *DecodeError) Error() string {
	return fmt.Sprintf("bus: message %q cannot be decoded into %s: %v", e.Message, e.Type, e.Err)
}

// Is reports whether target is ErrDecode.
func (e *DecodeError) Is(target error) bool { return target == ErrDecode }

// Unwrap returns the serializer's error.
func (e *DecodeError) Unwrap() error { return e.Err }

// NoHandlerError reports a received message whose name no handler of the
// bus handles and that no incoming middleware handled either (a reply
// resolved by request/reply, a message a filter stopped). Like a
// [*DecodeError] it is permanent ([IsPermanent]): the message is
// dead-lettered at once, with this error as the reason — unless the bus
// discards such messages ([WithUnhandled]).
type NoHandlerError struct {
	// Message is the message's name as received. It may be any bytes,
	// including invalid UTF-8: Error quotes it.
	Message string
	// Endpoint is the bus's endpoint, empty on a bus without one (a
	// message that reached its instance queue).
	Endpoint string
}

// Error implements error.
func (e *NoHandlerError) Error() string {
	where := fmt.Sprintf("endpoint %q", e.Endpoint)
	if e.Endpoint == "" {
		where = "a bus without an endpoint (its instance queue)"
	}
	return fmt.Sprintf("bus: no handler for message %q on %s: register one with bus.WithHandler, stop sending it here, or discard such messages with bus.WithUnhandled(bus.UnhandledDiscard)", e.Message, where)
}

// Is reports whether target is ErrNoHandler.
func (e *NoHandlerError) Is(target error) bool { return target == ErrNoHandler }

// PanicError is a recovered panic from a handler or a middleware, treated
// like a returned error.
type PanicError struct {
	Value any
	Stack []byte
}

// Error implements error.
func (e *PanicError) Error() string { return fmt.Sprintf("bus: panic: %v", e.Value) }

// Is reports whether target is ErrPanic.
func (e *PanicError) Is(target error) bool { return target == ErrPanic }

// Unwrap returns the panic value when it is an error.
func (e *PanicError) Unwrap() error {
	if err, ok := e.Value.(error); ok {
		return err
	}
	return nil
}

// DelayTooLongError is returned by Send and Publish for a message whose
// due time ([Delay], [At], [Outgoing.SetDue]) lies further ahead than the
// transport carries ([Delayer.MaxDelay]), or that has a due time on a
// transport that cannot delay at all (Max is then 0). Nothing was sent.
type DelayTooLongError struct {
	// Message is the message name.
	Message string
	// Transport is the transport's Go type, for example "*rabbitmq.Transport".
	Transport string
	// Delay is how far ahead the due time lay when the message was sent.
	Delay time.Duration
	// Max is the longest delay the transport carries; 0 when it cannot
	// delay a message.
	Max time.Duration
}

// Error implements error.
func (e *DelayTooLongError) Error() string {
	if e.Max <= 0 {
		return fmt.Sprintf("bus: %s is due in %s, but the transport %s cannot delay a message (it does not implement bus.Delayer)", e.Message, e.Delay, e.Transport)
	}
	return fmt.Sprintf("bus: %s is due in %s, beyond the %s the transport %s carries (its MaxDelay): schedule it nearer, or keep it in a store and send it later", e.Message, e.Delay, e.Max, e.Transport)
}

// Is reports whether target is ErrDelayTooLong.
func (e *DelayTooLongError) Is(target error) bool { return target == ErrDelayTooLong }

// BatchFailure is one message of a batch that was not sent: its index in
// the batch and why.
type BatchFailure struct {
	Index int
	Err   error
}

// BatchError is returned by [Bus.SendBatch], [Bus.PublishBatch],
// [Bus.DispatchBatch] and a [Batcher] when some messages of a batch were
// not sent. Failures lists them by index, in order; every message of the
// batch it does not name was confirmed by the broker (or, on the bus,
// dropped by an outgoing middleware that did not call next, as [Bus.Send]
// reports nil for one). errors.Is and errors.As see each failure's error
// through it (for example [ErrClosed]).
type BatchError struct {
	// Len is the number of messages in the batch.
	Len      int
	Failures []BatchFailure
}

// Error implements error.
func (e *BatchError) Error() string {
	var s strings.Builder
	fmt.Fprintf(&s, "bus: %d of %d messages of the batch were not sent", len(e.Failures), e.Len)
	for i, f := range e.Failures {
		if i == 3 {
			fmt.Fprintf(&s, "; and %d more", len(e.Failures)-i)
			break
		}
		fmt.Fprintf(&s, "; message %d: %v", f.Index, f.Err)
	}
	return s.String()
}

// Is reports whether target is ErrBatchIncomplete.
func (e *BatchError) Is(target error) bool { return target == ErrBatchIncomplete }

// Unwrap returns the failures' errors.
func (e *BatchError) Unwrap() []error {
	errs := make([]error, len(e.Failures))
	for i, f := range e.Failures {
		errs[i] = f.Err
	}
	return errs
}

// Failed reports whether the message at index i of the batch was not sent.
func (e *BatchError) Failed(i int) bool {
	_, found := slices.BinarySearchFunc(e.Failures, i, func(f BatchFailure, i int) int { return f.Index - i })
	return found
}

// BatchResult returns the result of a batch whose message i ended with
// errs[i] (nil: confirmed): nil when every one is nil, else a
// [*BatchError] naming the others. A [Batcher] returns it.
func BatchResult(errs []error) error {
	var failures []BatchFailure
	for i, err := range errs {
		if err != nil {
			failures = append(failures, BatchFailure{Index: i, Err: err})
		}
	}
	if failures == nil {
		return nil
	}
	return &BatchError{Len: len(errs), Failures: failures}
}
