package rabbitmq

import (
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/plugbus/plugbus/bus"
)

// DecodeDeadLetter reads a message received from a dead-letter queue: the
// envelope as it was received and the failure that dead-lettered it, which
// Fail recorded in headers ([HeaderFailureReason] and its siblings, and
// the retry history in [HeaderRetries]). A
// message without them was not dead-lettered by plugbus: the error says
// so, and the envelope is returned as far as it could be read.
func DecodeDeadLetter(m amqp.Delivery) (bus.DeadLetter, error) {
	// A poison message is dead-lettered as it came: keep what can be read.
	env, _, _, _ := envelope(&m, decodeLimits{clock: newSkewClock(time.Now)})
	dl := bus.DeadLetter{Envelope: env}
	var err error
	reason, ok := m.Headers[HeaderFailureReason].(string)
	if !ok {
		return dl, fmt.Errorf("rabbitmq: message %s (id %s) has no %s header: it was not dead-lettered by plugbus", m.Type, m.MessageId, HeaderFailureReason)
	}
	dl.Failure.Reason = reason
	dl.Failure.Attempts, _ = headerInt(m.Headers[HeaderFailureAttempts])
	dl.Failure.Endpoint, _ = m.Headers[HeaderFailureEndpoint].(string)
	if s, ok := m.Headers[HeaderFailureTime].(string); ok {
		if tm, perr := time.Parse(time.RFC3339Nano, s); perr == nil {
			dl.Failure.Time = tm
		} else {
			err = fmt.Errorf("rabbitmq: header %s = %q: %w", HeaderFailureTime, s, perr)
		}
	}
	history, bad := readRetries(&m)
	if bad != nil {
		err = errors.Join(err, fmt.Errorf("rabbitmq: header %s = %.200q: %s", HeaderRetries, headerText(bad.value), bad.why))
	}
	dl.Failure.History = history
	return dl, err
}
