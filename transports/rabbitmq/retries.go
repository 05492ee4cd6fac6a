package rabbitmq

import (
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/plugbus/plugbus/bus"
)

// HeaderRetries holds the retry history of a returned or dead-lettered
// message ([bus.RetryHistory] as its MarshalText writes it, a string): the
// copies Return, ReturnAfter and Fail make carry the history the bus gave
// them, and Receive reads it back into Delivery.Retries. One that cannot
// be read is ignored with a warning; the bus checks the rest against its
// retry policy.
const HeaderRetries = ReservedPrefix + "retries"

// whyNotHistory is why a HeaderRetries value was ignored.
const whyNotHistory = "not a retry history"

// readRetries reads the retry history of m, or says why its header was
// ignored (nil when it is absent or read).
func readRetries(m *amqp.Delivery) (bus.RetryHistory, *ignoredHeader) {
	var h bus.RetryHistory
	v, ok := m.Headers[HeaderRetries]
	if !ok {
		return h, nil
	}
	var text []byte
	switch v := v.(type) {
	case string:
		text = []byte(v)
	case []byte:
		text = v
	default:
		return h, &ignoredHeader{HeaderRetries, v, whyNotHistory}
	}
	if err := h.UnmarshalText(text); err != nil {
		return bus.RetryHistory{}, &ignoredHeader{HeaderRetries, v, whyNotHistory + ": " + err.Error()}
	}
	return h, nil
}

// writeRetries sets the retry history r in the headers h of a copy, or
// removes the one the original carried when r is empty (the bus cleared
// a history it did not trust).
func writeRetries(h amqp.Table, r bus.RetryHistory) {
	if r.IsZero() {
		delete(h, HeaderRetries)
		return
	}
	text, err := r.MarshalText()
	if err != nil { // a RetryHistory always encodes; keep the copy going without it
		delete(h, HeaderRetries)
		return
	}
	h[HeaderRetries] = string(text)
}
