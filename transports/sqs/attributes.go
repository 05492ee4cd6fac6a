package sqs

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"iter"
	"strings"
	"time"
	"unicode/utf8"

	snstypes "github.com/aws/aws-sdk-go-v2/service/sns/types"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/plugbus/plugbus/bus"
)

const (
	// AttributeName is the one message attribute the transport writes
	// itself: a JSON object holding the message name, content type, body
	// encoding, bus attributes (id, correlation id, sent-at, one-hop and
	// sticky attributes) and, in a dead-letter queue, the failure. It is
	// reserved, in any case, and so is every name starting with "plugbus.":
	// a header of such a name is refused with a *bus.HeaderReservedError,
	// and a received attribute of such a name other than "plugbus" itself
	// is ignored (logged at WARN), never passed on as a header.
	AttributeName = "plugbus"

	// MaxAttributes is the number of message attributes AWS carries on one
	// message (SQS, and SNS raw delivery to SQS).
	MaxAttributes = 10
	// ReservedAttributes is how many of MaxAttributes the transport uses.
	ReservedAttributes = 1
	// MaxHeaders is how many headers one message may carry.
	MaxHeaders = MaxAttributes - ReservedAttributes

	// DefaultMaxMessageSize is the size limit of a message, body and
	// attributes together, that both SQS and SNS accept: 256 KiB.
	DefaultMaxMessageSize = 256 * 1024

	maxAttributeName = 256
	stringType       = "String"
	wireVersion      = 1
	encodingBase64   = "base64"
	transportName    = "sqs"
)

// meta is the JSON carried in the AttributeName attribute.
type meta struct {
	V           int               `json:"v"`
	Name        string            `json:"name,omitempty"`
	ContentType string            `json:"ct,omitempty"`
	Encoding    string            `json:"enc,omitempty"`
	ID          string            `json:"id,omitempty"`
	Correlation string            `json:"corr,omitempty"`
	SentAt      string            `json:"sent,omitempty"`
	Values      map[string]string `json:"attrs,omitempty"`
	Sticky      map[string]string `json:"sticky,omitempty"`
	Failure     *failureMeta      `json:"failure,omitempty"`
	// A copy the transport re-sends to delay it carries more fields,
	// read apart (delay.go): a dead letter, written from meta, drops them.
	// Original keeps a "plugbus" attribute that was not valid JSON, when a
	// message that could not be read is dead-lettered.
	Original string `json:"original,omitempty"`
}

type failureMeta struct {
	Reason   string `json:"reason"`
	Attempts int    `json:"attempts"`
	Endpoint string `json:"endpoint"`
	Time     string `json:"time"`
	History  string `json:"history,omitempty"` // bus.RetryHistory.MarshalText
}

// reserved reports whether a header name is the transport's own.
func reserved(name string) bool {
	return strings.EqualFold(name, AttributeName) ||
		len(name) > len(AttributeName) && strings.EqualFold(name[:len(AttributeName)+1], AttributeName+".")
}

// validateHeaders checks h against the transport's reserved names and the
// rules AWS applies to message attributes.
func validateHeaders(h bus.Headers) error {
	for name, value := range h {
		if reserved(name) {
			return &bus.HeaderReservedError{Transport: transportName, Header: name}
		}
		if reason := checkAttributeName(name); reason != "" {
			return &HeaderError{Header: name, Reason: reason}
		}
		if value == "" {
			return &HeaderError{Header: name, Reason: "the value is empty; AWS refuses empty attribute values"}
		}
		if reason := checkText(value); reason != "" {
			return &HeaderError{Header: name, Reason: "the value " + reason}
		}
	}
	if len(h) > MaxHeaders {
		return &TooManyAttributesError{Headers: len(h), Reserved: ReservedAttributes, Max: MaxAttributes}
	}
	return nil
}

// checkAttributeName returns why AWS would refuse name, or "".
func checkAttributeName(name string) string {
	switch {
	case name == "":
		return "the name is empty"
	case len(name) > maxAttributeName:
		return fmt.Sprintf("the name is %d bytes long, more than %d", len(name), maxAttributeName)
	case name[0] == '.' || name[len(name)-1] == '.':
		return "the name starts or ends with a period"
	case strings.Contains(name, ".."):
		return "the name has two periods in a row"
	case hasPrefixFold(name, "aws.") || hasPrefixFold(name, "amazon."):
		return `names starting with "AWS." or "Amazon." are reserved by AWS`
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !validNameChar(c) && c != '.' {
			return fmt.Sprintf("the name has the character %q; use only A-Z a-z 0-9 _ - .", rune(c))
		}
	}
	return ""
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// checkText returns why SQS would refuse s as a body or string value, or "".
// SQS accepts #x9 #xA #xD #x20-#xD7FF #xE000-#xFFFD #x10000-#x10FFFF.
func checkText(s string) string {
	for i, r := range s {
		if r == utf8.RuneError {
			if _, n := utf8.DecodeRuneInString(s[i:]); n <= 1 {
				return fmt.Sprintf("is not valid UTF-8 (at byte %d)", i)
			}
		}
		if !allowedRune(r) {
			return fmt.Sprintf("has the character %U at byte %d, which SQS does not accept", r, i)
		}
	}
	return ""
}

func allowedRune(r rune) bool {
	return r == 0x9 || r == 0xA || r == 0xD || r >= 0x20 && r <= 0xD7FF || r >= 0xE000 && r <= 0xFFFD || r >= 0x10000 && r <= 0x10FFFF
}

// encoded is an envelope ready for SQS or SNS.
type encoded struct {
	body  string
	attrs map[string]string // name → String value, including AttributeName
	size  int
}

// encode turns env into a body and string message attributes.
func encode(env *bus.Envelope, maxSize int) (*encoded, error) {
	if err := validateHeaders(env.Headers); err != nil {
		return nil, err
	}
	m := meta{
		V: wireVersion, Name: env.Name, ContentType: env.ContentType,
		ID: env.Attributes.MessageID, Correlation: env.Attributes.CorrelationID,
	}
	if !env.Attributes.SentAt.IsZero() {
		m.SentAt = env.Attributes.SentAt.UTC().Format(time.RFC3339Nano)
	}
	var err error
	if m.Values, err = collect(env.Attributes.Values()); err != nil {
		return nil, err
	}
	if m.Sticky, err = collect(env.Attributes.StickyValues()); err != nil {
		return nil, err
	}
	for _, s := range []string{env.Name, env.ContentType, env.Attributes.MessageID, env.Attributes.CorrelationID} {
		if why := checkText(s); why != "" {
			return nil, &AttributeError{Key: "(envelope)", Reason: fmt.Sprintf("%q %s", s, why)}
		}
	}
	body := string(env.Body)
	if body == "" || checkText(body) != "" {
		// SQS refuses empty bodies and bodies with bytes outside its
		// character set: carry them base64-encoded.
		body = base64.StdEncoding.EncodeToString(env.Body)
		m.Encoding = encodingBase64
		if body == "" {
			body = "=" // SQS refuses an empty body; "=" is not valid base64, so it cannot mean anything else
		}
	}
	js, err := json.Marshal(&m)
	if err != nil {
		return nil, fmt.Errorf("sqs: encoding the %s attribute of %s: %w", AttributeName, env.Name, err)
	}
	e := &encoded{body: body, attrs: make(map[string]string, len(env.Headers)+1)}
	e.attrs[AttributeName] = string(js)
	for k, v := range env.Headers {
		e.attrs[k] = v
	}
	e.size = len(body)
	for k, v := range e.attrs {
		e.size += len(k) + len(stringType) + len(v)
	}
	if e.size > maxSize {
		return nil, &bus.MessageTooLargeError{Transport: transportName, Message: env.Name, Size: e.size, Limit: maxSize}
	}
	return e, nil
}

func collect(seq iter.Seq2[string, string]) (map[string]string, error) {
	var m map[string]string
	for k, v := range seq {
		// The attributes travel in the JSON of the "plugbus" message
		// attribute, whose characters SQS checks like any other.
		if why := checkText(k); why != "" {
			return nil, &AttributeError{Key: k, Reason: "the key " + why}
		}
		if why := checkText(v); why != "" {
			return nil, &AttributeError{Key: k, Reason: "the value " + why}
		}
		if m == nil {
			m = make(map[string]string)
		}
		m[k] = v
	}
	return m, nil
}

func (e *encoded) sqsAttributes() map[string]sqstypes.MessageAttributeValue {
	out := make(map[string]sqstypes.MessageAttributeValue, len(e.attrs))
	for k, v := range e.attrs {
		out[k] = sqstypes.MessageAttributeValue{DataType: strPtr(stringType), StringValue: strPtr(v)}
	}
	return out
}

func (e *encoded) snsAttributes() map[string]snstypes.MessageAttributeValue {
	out := make(map[string]snstypes.MessageAttributeValue, len(e.attrs))
	for k, v := range e.attrs {
		out[k] = snstypes.MessageAttributeValue{DataType: strPtr(stringType), StringValue: strPtr(v)}
	}
	return out
}

func strPtr(s string) *string { return &s }
