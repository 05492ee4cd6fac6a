package sqs

import (
	"errors"
	"fmt"

	"github.com/plugbus/plugbus/bus"
)

var (
	// ErrInvalidHeader is matched by [*HeaderError].
	ErrInvalidHeader = errors.New("sqs: header cannot be a message attribute")
	// ErrTooManyAttributes is matched by [*TooManyAttributesError].
	ErrTooManyAttributes = errors.New("sqs: too many message attributes")
	// ErrInvalidAttribute is matched by [*AttributeError].
	ErrInvalidAttribute = errors.New("sqs: bus attribute cannot be carried")
	// ErrNoQueue is matched by [*NoQueueError].
	ErrNoQueue = errors.New("sqs: queue does not exist")
	// ErrInvalidOption is matched by [*OptionError].
	ErrInvalidOption = errors.New("sqs: invalid option")
	// ErrNotSetUp is returned by Receive on a transport whose Setup was not called.
	ErrNotSetUp = errors.New("sqs: Receive before Setup: the bus calls Setup from Start; call it first when using the transport directly")
)

// OptionError reports an option [New] refuses: a value outside what SQS
// accepts, or one the transport cannot work with. No transport was built.
type OptionError struct {
	// Option is the option's name: "WithWaitTime".
	Option string
	// Value is the value refused, as the option was given it: "30s".
	Value string
	// Reason says what the option accepts.
	Reason string
}

// Error implements error.
func (e *OptionError) Error() string {
	return fmt.Sprintf("sqs: %s(%s): %s", e.Option, e.Value, e.Reason)
}

// Is reports whether target is ErrInvalidOption.
func (e *OptionError) Is(target error) bool { return target == ErrInvalidOption }

// HeaderError reports a header that SQS or SNS would reject as a message
// attribute: a name with characters outside A-Z a-z 0-9 _ - ., a name
// starting with "AWS." or "Amazon.", an empty value, or a value with
// characters SQS does not accept. Nothing was sent.
type HeaderError struct {
	Header string
	Reason string
}

// Error implements error.
func (e *HeaderError) Error() string {
	return fmt.Sprintf("sqs: header %q cannot be sent as an SQS/SNS message attribute: %s", e.Header, e.Reason)
}

// Is reports whether target is ErrInvalidHeader.
func (e *HeaderError) Is(target error) bool { return target == ErrInvalidHeader }

// TooManyAttributesError reports a message whose headers, with the
// attribute the transport adds itself, exceed what SQS and SNS carry on one
// message. Nothing was sent, and no header was dropped.
type TooManyAttributesError struct {
	// Headers is the number of headers of the message.
	Headers int
	// Reserved is the number of attributes the transport adds itself (1).
	Reserved int
	// Max is the number of message attributes AWS allows on one message (10).
	Max int
}

// Error implements error.
func (e *TooManyAttributesError) Error() string {
	return fmt.Sprintf("sqs: message has %d headers; with the %d attribute(s) the transport adds, that exceeds the %d message attributes AWS allows: send at most %d headers, or carry the rest as bus attributes (bus.WithAttribute), which travel packed in one attribute",
		e.Headers, e.Reserved, e.Max, e.Max-e.Reserved)
}

// Is reports whether target is ErrTooManyAttributes.
func (e *TooManyAttributesError) Is(target error) bool { return target == ErrTooManyAttributes }

// AttributeError reports a bus attribute the transport cannot carry
// unchanged (its key or value is not valid UTF-8). Nothing was sent.
type AttributeError struct {
	Key    string
	Reason string
}

// Error implements error.
func (e *AttributeError) Error() string {
	return fmt.Sprintf("sqs: bus attribute %q cannot be carried: %s", e.Key, e.Reason)
}

// Is reports whether target is ErrInvalidAttribute.
func (e *AttributeError) Is(target error) bool { return target == ErrInvalidAttribute }

// NoQueueError reports a send to an endpoint whose queue does not exist.
// It also matches bus.ErrNoRoute.
type NoQueueError struct {
	Endpoint string
	Queue    string
	Err      error
}

// Error implements error.
func (e *NoQueueError) Error() string {
	return fmt.Sprintf("sqs: endpoint %q has no queue %q: start that endpoint once (its Setup declares the queue) or check the destination and the transport's prefix: %v", e.Endpoint, e.Queue, e.Err)
}

// Is reports whether target is ErrNoQueue or bus.ErrNoRoute.
func (e *NoQueueError) Is(target error) bool { return target == ErrNoQueue || target == bus.ErrNoRoute }

// Unwrap returns the AWS error.
func (e *NoQueueError) Unwrap() error { return e.Err }

// EntryError is an entry of a SendMessageBatch or PublishBatch call that
// SQS or SNS refused while it accepted the others ([Transport.SendBatch]):
// the code and message it gave. SenderFault is false for a failure on the
// service's side, which a later try may not meet.
type EntryError struct {
	Code        string
	Message     string
	SenderFault bool
}

// Error implements error.
func (e *EntryError) Error() string {
	if e.SenderFault {
		return fmt.Sprintf("sqs: entry refused: %s: %s; the message was not sent, correct it before sending again", e.Code, e.Message)
	}
	return fmt.Sprintf("sqs: entry failed on the service's side: %s: %s; the message was not sent, send it again", e.Code, e.Message)
}
