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
)

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
