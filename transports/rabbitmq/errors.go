package rabbitmq

import (
	"errors"
	"fmt"
)

var (
	// ErrUnroutable is matched by [*UnroutableError].
	ErrUnroutable = errors.New("rabbitmq: message unroutable")
	// ErrNacked is returned when the broker refused a message with a
	// negative confirmation (for example a queue at its length limit with
	// overflow=reject-publish). The message was not stored.
	ErrNacked = errors.New("rabbitmq: broker refused the message (negative confirmation); it was not stored, send it again later")
	// ErrConnectionLost is returned by Delete, Return and Fail for a
	// delivery whose connection was lost: the broker redelivers it.
	ErrConnectionLost = errors.New("rabbitmq: the connection this delivery came from was lost; the broker redelivers it")
	// ErrRefused is matched by [*RefusedError].
	ErrRefused = errors.New("rabbitmq: broker refused the message")
	// ErrHeadersTooLarge is matched by [*HeadersTooLargeError].
	ErrHeadersTooLarge = errors.New("rabbitmq: message properties and headers too large for an AMQP frame")
	// ErrUnreachable is matched by [*UnreachableError].
	ErrUnreachable = errors.New("rabbitmq: no connection to the broker")
)

// UnreachableError reports a call (Setup, and so bus Start; Send, Publish,
// Connect) whose context ended while the transport had no connection to
// the broker. The transport keeps trying to connect in the background
// until it is closed; a later call may succeed. It matches
// [ErrUnreachable] and the context's error with errors.Is.
type UnreachableError struct {
	// Op is what waited: "Setup(\"orders\")", "send of x to y", "Connect".
	Op string
	// Address is the broker URL with its password replaced by "xxxxx".
	Address string
	// Attempts is how many connection attempts failed in a row; 0 when
	// the connection was lost and the first attempt to replace it was
	// still under way.
	Attempts int
	// Last is why the last attempt failed, or why the connection was lost;
	// nil when the first attempt was still under way.
	Last error
	// Err is the context's error.
	Err error
}

// Error implements error.
func (e *UnreachableError) Error() string {
	switch {
	case e.Last == nil:
		return fmt.Sprintf("rabbitmq: %s: no connection to the broker at %s yet when waiting ended: %v; the first connection attempt had not finished (allow it more time)",
			e.Op, e.Address, e.Err)
	case e.Attempts == 0:
		return fmt.Sprintf("rabbitmq: %s: no connection to the broker at %s: %v; the connection was lost (%v) and the reconnection had not finished (allow it more time)",
			e.Op, e.Address, e.Err, e.Last)
	}
	return fmt.Sprintf("rabbitmq: %s: no connection to the broker at %s: %v after %d failed connection attempts, the last: %v; check the URL and that the broker runs and accepts connections from this host",
		e.Op, e.Address, e.Err, e.Attempts, e.Last)
}

// Unwrap returns the context's error and the last connection failure.
func (e *UnreachableError) Unwrap() []error {
	if e.Last == nil {
		return []error{e.Err}
	}
	return []error{e.Err, e.Last}
}

// Is reports whether target is ErrUnreachable.
func (e *UnreachableError) Is(target error) bool { return target == ErrUnreachable }

// RefusedError reports a message the broker refused by closing the
// channel it was published on with a channel-level error (for example 406
// PRECONDITION_FAILED for a body over the broker's max_message_size or a
// user-id of another user, 404 NOT_FOUND for an exchange that does not
// exist and could not be declared again, 403 ACCESS_REFUSED). The message
// was not stored; sending it again
// unchanged fails the same way. The transport replaced the channel: other
// messages are not affected.
type RefusedError struct {
	// Message is the message name.
	Message string
	// Exchange is the exchange it was published to ("" is the default exchange of sends).
	Exchange string
	// RoutingKey is the destination queue of a send, the message name of a publish.
	RoutingKey string
	// Code and Reason are the AMQP reply code and text of the channel close.
	Code   int
	Reason string
}

// Error implements error.
func (e *RefusedError) Error() string {
	return fmt.Sprintf("rabbitmq: the broker refused %s (exchange %q, routing key %q) and closed its channel: %d %s; the message was not stored and would be refused again: fix it (size within max_message_size and rabbitmq.WithMaxMessageSize, no user-id of another user) or the broker's topology and permissions",
		e.Message, e.Exchange, e.RoutingKey, e.Code, e.Reason)
}

// Is reports whether target is ErrRefused.
func (e *RefusedError) Is(target error) bool { return target == ErrRefused }

// UnroutableError reports a message no queue took: a send to an endpoint
// whose queue does not exist, or a publish of a message no endpoint
// subscribes to. The message was not stored.
type UnroutableError struct {
	// Message is the message name.
	Message string
	// Exchange is the exchange it was published to ("" is the default exchange of sends).
	Exchange string
	// RoutingKey is the destination queue of a send, the message name of a publish.
	RoutingKey string
}

// Error implements error.
func (e *UnroutableError) Error() string {
	if e.Exchange == "" {
		return fmt.Sprintf("rabbitmq: send of %s to endpoint %q is unroutable: the queue %q does not exist; start the endpoint's bus once (it declares its queue) or check the destination name",
			e.Message, e.RoutingKey, e.RoutingKey)
	}
	return fmt.Sprintf("rabbitmq: publish of %s on exchange %q is unroutable: no endpoint subscribes to it; start a bus that handles %s first, or allow it with rabbitmq.WithUnroutablePublish()",
		e.Message, e.Exchange, e.RoutingKey)
}

// Is reports whether target is ErrUnroutable.
func (e *UnroutableError) Is(target error) bool { return target == ErrUnroutable }
