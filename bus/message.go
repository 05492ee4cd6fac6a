package bus

import (
	"iter"
	"maps"
	"time"
)

// Message is a value sent over the bus. Its wire name must be stable: it
// routes the message, selects handlers and is what other services see.
// Prefer value receivers so that the zero value of the type names it.
type Message interface {
	MessageName() string
}

// Attributes travel with every message beside its body.
//
// Attributes is an immutable value: the maps it holds are never changed in
// place, so a copy can be shared between handlers and middleware without
// cloning. With and WithSticky return a changed copy. Outgoing middleware
// changes the attributes of a message being sent through [Outgoing].
type Attributes struct {
	// MessageID identifies the message. It is generated at send time and
	// stays the same across retries and outbox dispatch; deduplication
	// (the inbox plugin) relies on it.
	MessageID string
	// CorrelationID ties together every message of one conversation. It is
	// generated when absent and inherited by messages sent while handling.
	CorrelationID string
	// SentAt is when Send or Publish was called, to the millisecond (the
	// timestamp of a generated message id is the same instant).
	SentAt time.Time

	values map[string]string // one-hop attributes
	sticky map[string]string // copied onto every message sent while handling
}

// NewAttributes returns attributes holding values (one-hop) and sticky
// attributes. It takes ownership of both maps: the caller must not change
// them afterwards. Transports use it to rebuild received attributes.
func NewAttributes(messageID, correlationID string, sentAt time.Time, values, sticky map[string]string) Attributes {
	return Attributes{MessageID: messageID, CorrelationID: correlationID, SentAt: sentAt, values: values, sticky: sticky}
}

// Value returns the one-hop attribute named key.
func (a Attributes) Value(key string) (string, bool) {
	v, ok := a.values[key]
	return v, ok
}

// StickyValue returns the sticky attribute named key.
func (a Attributes) StickyValue(key string) (string, bool) {
	v, ok := a.sticky[key]
	return v, ok
}

// Values iterates over the one-hop attributes. One-hop attributes travel
// with this message only.
func (a Attributes) Values() iter.Seq2[string, string] { return maps.All(a.values) }

// StickyValues iterates over the sticky attributes. Sticky attributes are
// copied onto every message sent while this one is handled.
func (a Attributes) StickyValues() iter.Seq2[string, string] { return maps.All(a.sticky) }

// Len reports how many one-hop and sticky attributes there are.
func (a Attributes) Len() (values, sticky int) { return len(a.values), len(a.sticky) }

// With returns a copy of a with the one-hop attribute key set to value.
func (a Attributes) With(key, value string) Attributes {
	a.values = withKey(a.values, key, value)
	return a
}

// WithSticky returns a copy of a with the sticky attribute key set to value.
func (a Attributes) WithSticky(key, value string) Attributes {
	a.sticky = withKey(a.sticky, key, value)
	return a
}

func withKey(m map[string]string, key, value string) map[string]string {
	c := make(map[string]string, len(m)+1)
	maps.Copy(c, m)
	c[key] = value
	return c
}

// Headers is the bag of transport-native headers of one message: AMQP
// message headers on RabbitMQ, message attributes on SQS and SNS. Outgoing
// middleware sets them; a transport refuses a name it reserves for itself
// with a [*HeaderReservedError].
type Headers map[string]string

// Kind tells a point-to-point send from a publish.
type Kind uint8

const (
	// KindSend is a command sent to one endpoint.
	KindSend Kind = iota + 1
	// KindPublish is an event delivered to every endpoint subscribed to its name.
	KindPublish
)

// String implements fmt.Stringer.
func (k Kind) String() string {
	switch k {
	case KindSend:
		return "send"
	case KindPublish:
		return "publish"
	}
	return "unknown"
}
