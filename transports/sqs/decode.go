package sqs

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/plugbus/plugbus/bus"
)

// ClockSkewAllowance is how far in the future the sent-at time of a
// received message may lie. One further ahead cannot be true (the sender's
// clock is wrong, or the attribute is forged): the transport ignores it,
// with a warning, rather than hand it to middleware that might act on it.
const ClockSkewAllowance = 5 * time.Minute

// receiveCountAttribute is the system attribute in which SQS counts the
// receives of a message.
const receiveCountAttribute = string(sqstypes.MessageSystemAttributeNameApproximateReceiveCount)

// attributeText returns the text of a received attribute value: the string
// value, or the base64 of a binary value.
func attributeText(v sqstypes.MessageAttributeValue) string {
	if v.StringValue != nil {
		return *v.StringValue
	}
	if v.BinaryValue != nil {
		return base64.StdEncoding.EncodeToString(v.BinaryValue)
	}
	return ""
}

// decode reads a received SQS message into d. An unreadable message gets
// d.Err and keeps what could be read; d.Raw is always the message.
//
// Foreign input never shortens a message's life: the attempt is SQS's own
// receive count, never an attribute of the message; an attribute under a
// name the transport reserves (any case) other than AttributeName itself
// is neither read nor passed on as a header; a sent-at time that is not a
// time, or lies more than ClockSkewAllowance ahead, is ignored. Each is
// logged at WARN on log (nil: not logged).
//
// What a copy re-sent to delay it carries beyond the envelope (delay.go)
// is not read: the poller reads it with decodeCarried.
func decode(ctx context.Context, log *slog.Logger, msg sqstypes.Message, d *bus.Delivery) {
	decodeCarried(ctx, log, msg, d)
}

// decodeCarried is decode, and returns what a copy re-sent by the
// transport carries beyond the envelope, unchecked: the receiver checks
// it against its maximum attempts ([Transport.carry]).
func decodeCarried(ctx context.Context, log *slog.Logger, msg sqstypes.Message, d *bus.Delivery) (c carried) {
	d.Raw = msg
	attempt, badCount := receiveCount(msg.Attributes)
	d.Attempt = attempt
	d.Body = []byte(aws.ToString(msg.Body))
	foreign := false
	for k, v := range msg.MessageAttributes {
		if reserved(k) {
			foreign = foreign || k != AttributeName
			continue
		}
		if d.Headers == nil {
			d.Headers = make(bus.Headers, len(msg.MessageAttributes))
		}
		d.Headers[k] = attributeText(v)
	}
	var ignored string // why the sent-at time was ignored
	if pack, ok := msg.MessageAttributes[AttributeName]; ok {
		ignored, d.Err = unpack(pack, d, &c)
	} else {
		d.Err = unpacked(msg)
	}
	if log == nil || !foreign && ignored == "" && badCount == "" {
		return c
	}
	about := func(attrs ...slog.Attr) []any {
		out := make([]any, 0, len(attrs)+3)
		for _, a := range attrs {
			out = append(out, a)
		}
		return append(out, slog.String("sqs_message_id", aws.ToString(msg.MessageId)),
			slog.String("message_id", d.Attributes.MessageID), slog.String("message_name", d.Name))
	}
	if foreign {
		for _, k := range reservedNames(msg.MessageAttributes) {
			v := msg.MessageAttributes[k]
			log.WarnContext(ctx, "received message: reserved attribute ignored",
				about(slog.String("attribute", k), slog.String("data_type", aws.ToString(v.DataType)), slog.String("value", cut(attributeText(v))),
					slog.String("reason", "the transport reserves the name (any case): it is not passed on as a header"))...)
		}
	}
	if ignored != "" {
		log.WarnContext(ctx, "received message: sent-at time ignored",
			about(slog.String("attribute", AttributeName), slog.String("field", "sent"), slog.String("reason", ignored))...)
	}
	if badCount != "" {
		log.WarnContext(ctx, "received message: receive count ignored; this delivery counts as attempt 1",
			about(slog.String("attribute", receiveCountAttribute), slog.String("reason", badCount))...)
	}
	return c
}

// receiveCount returns the attempt SQS counted (ApproximateReceiveCount;
// 1 when absent) and, when that count is not a positive integer, why it
// was ignored.
func receiveCount(attrs map[string]string) (int, string) {
	s, ok := attrs[receiveCountAttribute]
	if !ok {
		return 1, ""
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return 1, fmt.Sprintf("%q is not a positive integer", cut(s))
	}
	return n, ""
}

// reservedNames returns, sorted, the names of attrs that the transport
// reserves other than AttributeName.
func reservedNames(attrs map[string]sqstypes.MessageAttributeValue) []string {
	var names []string
	for k := range attrs {
		if k != AttributeName && reserved(k) {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	return names
}

// unpacked returns why a message without the AttributeName attribute
// cannot be read.
func unpacked(msg sqstypes.Message) error {
	const none = `sqs: the message has no "plugbus" attribute, so it was not sent by a plugbus transport`
	for _, k := range reservedNames(msg.MessageAttributes) {
		if strings.EqualFold(k, AttributeName) {
			return fmt.Errorf(`%s: it has one named %q, but attribute names are case-sensitive and plugbus writes %q`, none, k, AttributeName)
		}
	}
	if topic, ok := snsNotification(aws.ToString(msg.Body)); ok {
		return fmt.Errorf(`%s: it is an SNS notification envelope from topic %q, delivered by a subscription without raw message delivery: enable RawMessageDelivery on that subscription (Setup creates its own so)`, none, cut(topic))
	}
	return errors.New(none + ` (an SNS subscription without raw message delivery wraps messages in a JSON envelope: enable RawMessageDelivery)`)
}

// snsNotification reports whether body is the JSON envelope in which SNS
// delivers a notification when raw message delivery is off, and returns
// the topic it came from.
func snsNotification(body string) (topic string, ok bool) {
	if !strings.HasPrefix(strings.TrimLeft(body, " \t\r\n"), "{") {
		return "", false
	}
	var n struct {
		Type     string
		TopicArn string
	}
	if json.Unmarshal([]byte(body), &n) != nil || n.Type != "Notification" || n.TopicArn == "" {
		return "", false
	}
	return n.TopicArn, true
}

// unpack reads the AttributeName attribute v into d, decoding the body
// when needed, and what a re-sent copy carries into c. It returns why the
// sent-at time was ignored ("" when it was not), and an error when the
// message cannot be read.
func unpack(v sqstypes.MessageAttributeValue, d *bus.Delivery, c *carried) (ignored string, err error) {
	text, err := packText(v)
	if err != nil {
		return "", err
	}
	var m meta
	jerr := json.Unmarshal([]byte(text), &m)
	var typeErr *json.UnmarshalTypeError
	if jerr != nil && !errors.As(jerr, &typeErr) {
		return "", fmt.Errorf("sqs: the %q attribute is not valid JSON: %w", AttributeName, jerr)
	}
	switch {
	case m.V != wireVersion && m.V != 0:
		// A later version may give its fields other types: judge none.
		return "", fmt.Errorf("sqs: the %q attribute has version %d; this transport reads version %d: upgrade plugbus", AttributeName, m.V, wireVersion)
	case jerr != nil:
		// Unmarshal skipped the fields of the wrong type and read the rest.
		if ignored, err = checkFields(text); err != nil {
			return "", err
		}
	}
	if m.V == 0 {
		return "", fmt.Errorf(`sqs: the %q attribute has no version ("v"), so it was not written by a plugbus transport`, AttributeName)
	}
	sent, why := sentAt(m.SentAt)
	if ignored == "" {
		ignored = why
	}
	*c = readCarried(text)
	d.Name, d.ContentType = m.Name, m.ContentType
	d.Attributes = bus.NewAttributes(m.ID, m.Correlation, sent, m.Values, m.Sticky)
	switch m.Encoding {
	case "":
	case encodingBase64:
		raw := string(d.Body)
		if raw == "=" {
			raw = ""
		}
		b, err := base64.StdEncoding.DecodeString(raw)
		if err != nil {
			return ignored, fmt.Errorf("sqs: the body of %s is marked base64 but does not decode: %w", m.Name, err)
		}
		d.Body = b
	default:
		return ignored, fmt.Errorf("sqs: the body of %s has the unknown encoding %q: upgrade plugbus", m.Name, m.Encoding)
	}
	if m.Name == "" {
		return ignored, fmt.Errorf("sqs: the %q attribute names no message", AttributeName)
	}
	return ignored, nil
}

// packText returns the JSON text of the AttributeName attribute, which
// plugbus writes with the data type String.
func packText(v sqstypes.MessageAttributeValue) (string, error) {
	dataType := aws.ToString(v.DataType)
	base, _, _ := strings.Cut(dataType, ".") // a custom label may follow: "String.json"
	switch {
	case base != stringType && (dataType != "" || v.StringValue == nil):
		return "", fmt.Errorf("sqs: the %q message attribute has the data type %q, want %q (a JSON object, as plugbus transports write it): the message was not sent by a plugbus transport",
			AttributeName, dataType, stringType)
	case v.StringValue == nil:
		return "", fmt.Errorf("sqs: the %q message attribute of data type %q has no string value: the message was not sent by a plugbus transport", AttributeName, dataType)
	}
	return *v.StringValue, nil
}

// sentAt parses the sent-at time of a received message. It returns the
// zero time and why, when the text is not a time or lies more than
// ClockSkewAllowance ahead.
func sentAt(text string) (time.Time, string) {
	if text == "" {
		return time.Time{}, ""
	}
	sent, err := time.Parse(time.RFC3339Nano, text)
	if err != nil {
		return time.Time{}, fmt.Sprintf("%q is not an RFC 3339 time", cut(text))
	}
	if ahead := time.Until(sent); ahead > ClockSkewAllowance {
		return time.Time{}, fmt.Sprintf("%q lies %s in the future, more than the clock skew allowed (sqs.ClockSkewAllowance, %s)", text, ahead.Round(time.Second), ClockSkewAllowance)
	}
	return sent, ""
}

// wireField is a field of the AttributeName attribute's JSON and the
// value it holds.
type wireField struct {
	key  string
	want string // what the field holds, for the reason
	// wrong returns what the field holds when that is of the wrong type,
	// else "".
	wrong func(json.RawMessage) string
	// optional fields are ignored, with a warning, when they have the
	// wrong type; a message with any other field of the wrong type cannot
	// be read.
	optional bool
}

// wireFields are the fields of the AttributeName attribute a receiver
// reads. "failure" and "original" are the dead-letter queue's, not read
// on receive: their type does not matter there.
var wireFields = [...]wireField{
	{key: "v", want: "an integer", wrong: wrongInt},
	{key: "name", want: "a string", wrong: wrongString},
	{key: "ct", want: "a string", wrong: wrongString},
	{key: "enc", want: "a string", wrong: wrongString},
	{key: "id", want: "a string", wrong: wrongString},
	{key: "corr", want: "a string", wrong: wrongString},
	{key: "sent", want: "a string", wrong: wrongString, optional: true},
	{key: "attrs", want: "an object of strings", wrong: wrongStrings},
	{key: "sticky", want: "an object of strings", wrong: wrongStrings},
}

func wrongString(raw json.RawMessage) string {
	if k := jsonKind(string(raw)); k != "string" && k != "null" {
		return article(k)
	}
	return ""
}

func wrongInt(raw json.RawMessage) string {
	var n int
	if json.Unmarshal(raw, &n) == nil {
		return ""
	}
	if k := jsonKind(string(raw)); k != "number" {
		return article(k)
	}
	return "the number " + cut(string(raw))
}

func wrongStrings(raw json.RawMessage) string {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil {
		return article(jsonKind(string(raw)))
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if w := wrongString(m[k]); w != "" {
			return fmt.Sprintf("%s at %q", w, cut(k))
		}
	}
	return ""
}

// checkFields names the fields of the AttributeName attribute's JSON text
// that have the wrong type. It returns an error when one the receiver
// needs is among them, and otherwise why an optional field was ignored.
func checkFields(text string) (ignored string, err error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal([]byte(text), &fields); err != nil {
		return "", fmt.Errorf("sqs: the %q attribute holds a JSON %s, want an object: the message was not sent by a plugbus transport", AttributeName, jsonKind(text))
	}
	keys := slices.Sorted(maps.Keys(fields))
	var problems []string
	for _, f := range wireFields {
		for _, k := range keys {
			// encoding/json matches keys case-insensitively: so does this.
			if !strings.EqualFold(k, f.key) {
				continue
			}
			held := f.wrong(fields[k])
			if held == "" {
				continue
			}
			problem := fmt.Sprintf("field %q holds %s, want %s", k, held, f.want)
			if f.optional {
				ignored = problem
				continue
			}
			problems = append(problems, problem)
		}
	}
	if problems != nil {
		return "", fmt.Errorf("sqs: the %q attribute cannot be read: %s", AttributeName, strings.Join(problems, "; "))
	}
	return ignored, nil
}

// article puts "a" or "an" in front of a kind of JSON value.
func article(kind string) string {
	if kind != "" && strings.ContainsRune("aeiou", rune(kind[0])) {
		return "an " + kind
	}
	return "a " + kind
}

// jsonKind names the kind of the JSON value text.
func jsonKind(text string) string {
	text = strings.TrimLeft(text, " \t\r\n")
	if text == "" {
		return "nothing"
	}
	switch text[0] {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}

// cut shortens foreign text quoted in a reason or a log.
func cut(s string) string {
	const most = 128
	if len(s) <= most {
		return s
	}
	i := most
	for i > 0 && s[i]&0xC0 == 0x80 { // not in the middle of a UTF-8 sequence
		i--
	}
	return s[:i] + "…"
}
