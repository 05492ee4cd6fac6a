package rabbitmq

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/plugbus/plugbus/bus"
)

// ReservedPrefix starts every header name the transport writes itself (bus
// attributes, attempt count, failure metadata). Names with this prefix,
// compared without regard to case, are reserved in both directions:
// outgoing middleware cannot set one, and a received one is never an
// ordinary header; the transport reads only its own spelling (the
// constants below) and ignores any other with a warning.
const ReservedPrefix = "plugbus-"

// Header names written by the transport.
const (
	// HeaderSentAt holds the attribute SentAt in nanoseconds since the Unix
	// epoch (an AMQP long-long). An RFC 3339 string is read too.
	HeaderSentAt = ReservedPrefix + "sent-at"
	// HeaderAttempt holds the delivery attempt of a returned message (absent means 1).
	HeaderAttempt = ReservedPrefix + "attempt"
	// HeaderAttributePrefix prefixes each one-hop attribute.
	HeaderAttributePrefix = ReservedPrefix + "attr-"
	// HeaderStickyPrefix prefixes each sticky attribute.
	HeaderStickyPrefix = ReservedPrefix + "sticky-"
	// HeaderFailureReason holds the error text of a dead-lettered message.
	HeaderFailureReason = ReservedPrefix + "failure-reason"
	// HeaderFailureAttempts holds how many times a dead-lettered message was delivered.
	HeaderFailureAttempts = ReservedPrefix + "failure-attempts"
	// HeaderFailureEndpoint holds the endpoint that dead-lettered the message.
	HeaderFailureEndpoint = ReservedPrefix + "failure-endpoint"
	// HeaderFailureTime holds when the message was dead-lettered, RFC 3339.
	HeaderFailureTime = ReservedPrefix + "failure-time"
	// HeaderUserID holds the user-id property of a returned or
	// dead-lettered message that another user published: RabbitMQ accepts
	// only the publishing connection's own user in user-id.
	HeaderUserID = ReservedPrefix + "user-id"
	// HeaderOriginalCC holds the CC header of a received message on the
	// copies Return and Fail make of it: under its own name the broker
	// would route each copy to the queues it names again.
	HeaderOriginalCC = ReservedPrefix + "original-cc"
	// HeaderOriginalBCC is [HeaderOriginalCC] for BCC, which RabbitMQ
	// removes before delivery, so that a received message has it only
	// when another path put it back.
	HeaderOriginalBCC = ReservedPrefix + "original-bcc"
)

// The headers RabbitMQ routes a published message on besides its routing
// key (sender-selected distribution). The broker compares these names
// with regard to case: "cc" is an ordinary header.
const (
	headerCC  = "CC"
	headerBCC = "BCC"
)

// headerDeliveryCount is the header in which quorum queues count the
// redeliveries of a message (absent on its first delivery).
const headerDeliveryCount = "x-delivery-count"

// ClockSkewAllowance is how far in the future a received message's sent
// time may lie: a later one (from the plugbus-sent-at header, a UUIDv7
// message id or the timestamp property) is ignored with a warning and the
// next source is used, or none.
const ClockSkewAllowance = 5 * time.Minute

// maxShortString is the longest AMQP short string: header names, queue
// names, routing keys.
const maxShortString = 255

// reservedPrefixed reports whether name starts with [ReservedPrefix],
// compared without regard to case.
func reservedPrefixed(name string) bool {
	return len(name) >= len(ReservedPrefix) && strings.EqualFold(name[:len(ReservedPrefix)], ReservedPrefix)
}

// reserved reports whether name is a header the transport keeps for
// itself, in both directions: outgoing middleware cannot set it and
// handlers do not see it among the headers of a received message.
func reserved(name string) bool {
	return reservedPrefixed(name) || name == headerCC || name == headerBCC
}

// ValidateHeaders refuses a header name the transport reserves with a
// *bus.HeaderReservedError, and a name AMQP cannot carry (empty or longer
// than 255 bytes). The bus calls it when a message is sent.
func (t *Transport) ValidateHeaders(h bus.Headers) error { return validateHeaders(h) }

func validateHeaders(h bus.Headers) error {
	for k := range h {
		if reserved(k) {
			return &bus.HeaderReservedError{Transport: "rabbitmq", Header: k}
		}
		if k == "" || len(k) > maxShortString {
			return fmt.Errorf("rabbitmq: header name %.40q is %d bytes; AMQP header names are 1 to %d bytes", k, len(k), maxShortString)
		}
	}
	return nil
}

// publishing encodes env as an AMQP message.
func publishing(env *bus.Envelope) (amqp.Publishing, error) {
	a := env.Attributes
	nv, ns := a.Len()
	// The sent-at of a message whose id is a UUIDv7 stamped at that very
	// millisecond (what the bus sends) is read back from the id: no header.
	sentAtInID := !a.SentAt.IsZero() && sentAtFromID(a.MessageID).Equal(a.SentAt)
	var h amqp.Table
	if n := nv + ns + len(env.Headers); n > 0 || !sentAtInID {
		h = make(amqp.Table, 1+n)
	}
	for k, v := range env.Headers {
		h[k] = v
	}
	if !a.SentAt.IsZero() && !sentAtInID {
		h[HeaderSentAt] = a.SentAt.UnixNano()
	}
	for k, v := range a.Values() {
		if len(k)+len(HeaderAttributePrefix) > maxShortString {
			return amqp.Publishing{}, fmt.Errorf("rabbitmq: attribute name %.40q is too long: at most %d bytes", k, maxShortString-len(HeaderAttributePrefix))
		}
		h[HeaderAttributePrefix+k] = v
	}
	for k, v := range a.StickyValues() {
		if len(k)+len(HeaderStickyPrefix) > maxShortString {
			return amqp.Publishing{}, fmt.Errorf("rabbitmq: sticky attribute name %.40q is too long: at most %d bytes", k, maxShortString-len(HeaderStickyPrefix))
		}
		h[HeaderStickyPrefix+k] = v
	}
	corr := a.CorrelationID
	if corr == a.MessageID {
		corr = "" // the first message of a conversation: read back as the message id
	}
	return amqp.Publishing{
		Headers:       h,
		ContentType:   env.ContentType,
		DeliveryMode:  amqp.Persistent,
		MessageId:     a.MessageID,
		CorrelationId: corr,
		Type:          env.Name,
		Body:          env.Body,
	}, nil
}

// republishing copies a received message for Return and Fail: same
// properties and body, headers copied with extra set on top, except three
// that must not travel on a copy:
//   - CC and BCC, on which the broker would route the copy to the queues
//     they name once more (into the endpoint's own queue: a loop), move to
//     [HeaderOriginalCC] and [HeaderOriginalBCC];
//   - a user-id property other than the publishing connection's user,
//     which RabbitMQ refuses (it closes the channel with
//     PRECONDITION_FAILED), moves to [HeaderUserID];
//   - the broker's x-delivery-count of the original is dropped: the copy
//     is a new message, its attempt travels in [HeaderAttempt].
func (t *Transport) republishing(m *amqp.Delivery, extra int) (amqp.Publishing, amqp.Table) {
	h := make(amqp.Table, len(m.Headers)+extra+1)
	for k, v := range m.Headers {
		h[k] = v
	}
	delete(h, headerDeliveryCount)
	if v, ok := h[headerCC]; ok {
		h[HeaderOriginalCC] = v
		delete(h, headerCC)
	}
	if v, ok := h[headerBCC]; ok {
		h[HeaderOriginalBCC] = v
		delete(h, headerBCC)
	}
	userID := m.UserId
	if userID != "" && userID != t.user {
		h[HeaderUserID] = userID
		userID = ""
	}
	return amqp.Publishing{
		Headers:         h,
		ContentType:     m.ContentType,
		ContentEncoding: m.ContentEncoding,
		DeliveryMode:    amqp.Persistent,
		Priority:        m.Priority,
		CorrelationId:   m.CorrelationId,
		ReplyTo:         m.ReplyTo,
		Expiration:      m.Expiration, // Fail and ReturnAfter clear it
		MessageId:       m.MessageId,
		Timestamp:       m.Timestamp,
		Type:            m.Type,
		UserId:          userID,
		AppId:           m.AppId,
		Body:            m.Body,
	}, h
}

// decodeLimits is what envelope checks a received message's reserved
// headers against.
type decodeLimits struct {
	// maxAttempts is the endpoint's maximum attempts (Topology.MaxAttempts);
	// 0 sets no upper bound.
	maxAttempts int
	// clock tells a sent time too far in the future.
	clock *skewClock
}

// skewClock tells whether a time lies more than [ClockSkewAllowance] in
// the future. Reading the clock costs more than decoding a message, so it
// keeps the bound it last computed (a time that was in the future then)
// and reads the clock again only for a time past it: in steady traffic,
// about once every ClockSkewAllowance. (A wall clock stepped back keeps
// the bound it had until a time passes it: the check is that much looser
// meanwhile, never stricter.)
type skewClock struct {
	now   func() time.Time
	bound atomic.Pointer[time.Time]
}

func newSkewClock(now func() time.Time) *skewClock { return &skewClock{now: now} }

// ahead reports whether t is more than ClockSkewAllowance after now.
func (c *skewClock) ahead(t time.Time) bool {
	if b := c.bound.Load(); b != nil && !t.After(*b) {
		return false // the bound was at most now + the allowance
	}
	b := c.now().Add(ClockSkewAllowance)
	c.bound.Store(&b)
	return t.After(b)
}

// ignoredHeader is a reserved header (or property) of a received message
// that envelope did not trust: the transport logs it at warn level.
type ignoredHeader struct {
	name  string
	value any
	why   string
}

// Reasons for ignoring a reserved header.
const (
	whyNotOurs     = "a reserved name (plugbus- prefix, compared without regard to case) that the transport does not write: not an ordinary header, not read"
	whyNotInteger  = "not an integer"
	whyAttemptLow  = "below 1"
	whyAttemptHigh = "above the endpoint's maximum attempts"
	whyNotTime     = "neither nanoseconds since the Unix epoch nor an RFC 3339 time"
	whyFuture      = "more than the clock-skew allowance in the future"
)

// envelope decodes a received AMQP message. A message it cannot read
// (no name, an attribute header that is not a string) gets err set and as
// much of the envelope as could be read. A reserved header it does not
// trust (a foreign spelling or name, a wrong type, a value out of range)
// is left out and returned in ignored, for a warning: it never makes a
// message unreadable, and never shortens its life.
func envelope(m *amqp.Delivery, lim decodeLimits) (env bus.Envelope, attempt int, ignored []ignoredHeader, err error) {
	env = bus.Envelope{Name: m.Type, ContentType: m.ContentType, Body: m.Body}
	attempt = 1
	var sentAtHeader time.Time
	var sentAtValue any
	var values, sticky map[string]string
	var errs []error
	for k, v := range m.Headers {
		if !reserved(k) {
			if env.Headers == nil {
				env.Headers = make(bus.Headers, len(m.Headers))
			}
			env.Headers[k] = headerText(v)
			continue
		}
		switch {
		case k == HeaderSentAt:
			t, ok := headerTime(v)
			if !ok {
				ignored = append(ignored, ignoredHeader{k, v, whyNotTime})
				continue
			}
			sentAtHeader, sentAtValue = t, v
		case k == HeaderAttempt:
			n, ok := headerInt(v)
			switch {
			case !ok:
				ignored = append(ignored, ignoredHeader{k, v, whyNotInteger})
			case n < 1:
				ignored = append(ignored, ignoredHeader{k, v, whyAttemptLow})
			case lim.maxAttempts > 0 && n > lim.maxAttempts:
				ignored = append(ignored, ignoredHeader{k, v, whyAttemptHigh})
			default:
				attempt = n
			}
		case strings.HasPrefix(k, HeaderAttributePrefix):
			s, ok := v.(string)
			if !ok {
				errs = append(errs, fmt.Errorf("attribute header %s holds an AMQP %s, want a string", k, amqpType(v)))
				continue
			}
			if values == nil {
				values = make(map[string]string, 4)
			}
			values[k[len(HeaderAttributePrefix):]] = s
		case strings.HasPrefix(k, HeaderStickyPrefix):
			s, ok := v.(string)
			if !ok {
				errs = append(errs, fmt.Errorf("sticky attribute header %s holds an AMQP %s, want a string", k, amqpType(v)))
				continue
			}
			if sticky == nil {
				sticky = make(map[string]string, 4)
			}
			sticky[k[len(HeaderStickyPrefix):]] = s
		case k == headerCC, k == headerBCC, k == HeaderOriginalCC, k == HeaderOriginalBCC, k == HeaderUserID,
			k == HeaderFailureReason, k == HeaderFailureAttempts, k == HeaderFailureEndpoint, k == HeaderFailureTime,
			k == HeaderRetries:
			// Routing instructions the broker carried out, and what the
			// transport writes on copies: not part of the envelope.
		default:
			ignored = append(ignored, ignoredHeader{k, v, whyNotOurs})
		}
	}
	// A quorum queue counts redeliveries, including those of a consumer
	// that crashed before settling: count them as attempts, so that a
	// message that crashes its consumer ends in the dead-letter queue. The
	// broker sets the count on redeliveries only; on a first delivery the
	// header is the publisher's, and not trusted. A classic queue leaves
	// a publisher's header as it is even on a redelivery, so a count
	// above the maximum attempts is ignored too, with a warning.
	if m.Redelivered {
		if v, ok := m.Headers[headerDeliveryCount]; ok {
			if n, ok := headerInt(v); ok && n > 0 && n < math.MaxInt32 {
				if lim.maxAttempts > 0 && n+1 > lim.maxAttempts {
					ignored = append(ignored, ignoredHeader{headerDeliveryCount, v, whyAttemptHigh})
				} else {
					attempt = max(attempt, n+1)
				}
			}
		}
	}
	// The sent time: the header, else the time of a UUIDv7 message id,
	// else the timestamp property; one in the future is not trusted.
	var sentAt time.Time
	if !sentAtHeader.IsZero() {
		if lim.clock.ahead(sentAtHeader) {
			ignored = append(ignored, ignoredHeader{HeaderSentAt, sentAtValue, whyFuture})
		} else {
			sentAt = sentAtHeader
		}
	}
	if sentAt.IsZero() {
		if t := sentAtFromID(m.MessageId); !t.IsZero() {
			if lim.clock.ahead(t) {
				ignored = append(ignored, ignoredHeader{"message-id (UUIDv7 time)", m.MessageId, whyFuture})
			} else {
				sentAt = t
			}
		}
	}
	if sentAt.IsZero() && !m.Timestamp.IsZero() {
		if lim.clock.ahead(m.Timestamp) {
			ignored = append(ignored, ignoredHeader{"timestamp", m.Timestamp, whyFuture})
		} else {
			sentAt = m.Timestamp
		}
	}
	if env.Name == "" {
		errs = append(errs, errors.New("the AMQP type property (the message name) is empty; plugbus producers set it to the message name"))
	}
	corr := m.CorrelationId
	if corr == "" {
		corr = m.MessageId
	}
	env.Attributes = bus.NewAttributes(m.MessageId, corr, sentAt, values, sticky)
	if errs != nil {
		return env, attempt, ignored, fmt.Errorf("rabbitmq: unreadable message: %w", errors.Join(errs...))
	}
	return env, attempt, ignored, nil
}

// amqpType names the AMQP field type a header value was read from.
func amqpType(v any) string {
	switch v.(type) {
	case nil:
		return "void"
	case bool:
		return "boolean"
	case int8, uint8, int16, uint16, int32, uint32, int64, int:
		return "integer"
	case float32, float64:
		return "float"
	case amqp.Decimal:
		return "decimal"
	case []byte:
		return "byte array"
	case time.Time:
		return "timestamp"
	case amqp.Table:
		return "table"
	case []any:
		return "array"
	}
	return fmt.Sprintf("%T", v)
}

func headerTime(v any) (time.Time, bool) {
	switch x := v.(type) {
	case int64:
		return time.Unix(0, x).UTC(), true
	case string:
		t, err := time.Parse(time.RFC3339Nano, x)
		return t, err == nil
	case time.Time:
		return x, true
	}
	return time.Time{}, false
}

func headerInt(v any) (int, bool) {
	switch n := v.(type) {
	case int:
		return n, true
	case int8:
		return int(n), true
	case int16:
		return int(n), true
	case int32:
		return int(n), true
	case int64:
		return int(n), true
	case uint8:
		return int(n), true
	case uint16:
		return int(n), true
	case uint32:
		return int(n), true
	case string:
		i, err := strconv.Atoi(n)
		return i, err == nil
	}
	return 0, false
}

// headerText turns an AMQP header value of any type into text: numbers and
// booleans in their Go form, times in RFC 3339, tables and arrays (x-death)
// as JSON.
func headerText(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case []byte:
		return string(x)
	case nil:
		return ""
	case bool:
		return strconv.FormatBool(x)
	case time.Time:
		return x.UTC().Format(time.RFC3339)
	case float32:
		return strconv.FormatFloat(float64(x), 'g', -1, 32)
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	case amqp.Table, []any:
		if b, err := json.Marshal(x); err == nil {
			return string(b)
		}
	}
	if n, ok := headerInt(v); ok {
		return strconv.Itoa(n)
	}
	return fmt.Sprint(v)
}

// sentAtFromID returns the timestamp of a UUIDv7 id (RFC 9562: Unix
// milliseconds in the first 48 bits), or the zero time for another id.
func sentAtFromID(id string) time.Time {
	if len(id) != 36 || id[8] != '-' || id[13] != '-' || id[14] != '7' || id[18] != '-' || id[23] != '-' {
		return time.Time{}
	}
	var ms int64
	for i := 0; i < 13; i++ { // 8 hex digits, '-', 4 hex digits
		c := id[i]
		if i == 8 {
			continue
		}
		var d byte
		switch {
		case '0' <= c && c <= '9':
			d = c - '0'
		case 'a' <= c && c <= 'f':
			d = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			d = c - 'A' + 10
		default:
			return time.Time{}
		}
		ms = ms<<4 | int64(d)
	}
	return time.UnixMilli(ms).UTC()
}
