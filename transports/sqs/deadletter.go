package sqs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/plugbus/plugbus/bus"
)

// maxReason bounds the failure reason stored with a dead letter; a longer
// one is cut and says so.
const maxReason = 8 * 1024

// deadLetter sends msg to the dead-letter queue dlqURL with f added to its
// "plugbus" attribute. Body and other attributes are kept as received.
func (t *Transport) deadLetter(ctx context.Context, dlqURL string, msg sqstypes.Message, f bus.Failure) error {
	if dlqURL == "" {
		return errors.New("no dead-letter queue known: the transport was not set up")
	}
	attrs, err := withFailure(msg.MessageAttributes, f)
	if err != nil {
		return err
	}
	body := aws.ToString(msg.Body)
	if body == "" {
		body = "=" // unreachable for a received message; SQS refuses empty bodies
	}
	if _, err := t.sqs.SendMessage(ctx, &awssqs.SendMessageInput{QueueUrl: &dlqURL, MessageBody: &body, MessageAttributes: attrs}); err != nil {
		return fmt.Errorf("sending to the dead-letter queue failed: %w", err)
	}
	return nil
}

// withFailure returns a copy of attrs whose "plugbus" attribute holds f.
func withFailure(attrs map[string]sqstypes.MessageAttributeValue, f bus.Failure) (map[string]sqstypes.MessageAttributeValue, error) {
	var m meta
	if v, ok := attrs[AttributeName]; ok {
		text := attributeText(v)
		var typeErr *json.UnmarshalTypeError
		if err := json.Unmarshal([]byte(text), &m); errors.As(err, &typeErr) {
			// The fields of the right type were read: keep them for
			// DecodeDeadLetter, and the whole text as it came.
			m.Original = text
		} else if err != nil {
			m = meta{Original: text}
		}
	} else if len(attrs)+1 > MaxAttributes {
		return nil, fmt.Errorf("the message already has %d attributes, so the failure cannot be added; the queue's redrive policy dead-letters it without it after its maximum receives", len(attrs))
	}
	if m.V == 0 {
		m.V = wireVersion
	}
	if f.Time.IsZero() {
		f.Time = time.Now()
	}
	reason := f.Reason
	if len(reason) > maxReason {
		cut := maxReason
		for cut > 0 && !utf8.RuneStart(reason[cut]) {
			cut--
		}
		reason = reason[:cut] + fmt.Sprintf("… (cut: %d bytes in all)", len(f.Reason))
	}
	m.Failure = &failureMeta{Reason: reason, Attempts: f.Attempts, Endpoint: f.Endpoint, Time: f.Time.UTC().Format(time.RFC3339Nano)}
	js, err := json.Marshal(&m)
	if err != nil {
		return nil, fmt.Errorf("encoding the failure: %w", err)
	}
	out := maps.Clone(attrs)
	if out == nil {
		out = make(map[string]sqstypes.MessageAttributeValue, 1)
	}
	out[AttributeName] = sqstypes.MessageAttributeValue{DataType: aws.String(stringType), StringValue: aws.String(string(js))}
	return out, nil
}

// DecodeDeadLetter reads a message received from a dead-letter queue: the
// envelope as it was received and the failure that dead-lettered it, which
// Fail recorded in its [AttributeName] attribute. A message that reached
// the dead-letter queue through the redrive policy (the consumer never
// settled it) has no failure: the error says so, and the envelope is
// returned as far as it could be read.
func DecodeDeadLetter(msg sqstypes.Message) (bus.DeadLetter, error) {
	var d bus.Delivery
	decode(context.Background(), nil, msg, &d)
	dl := bus.DeadLetter{Envelope: d.Envelope}
	v, ok := msg.MessageAttributes[AttributeName]
	if !ok {
		return dl, errors.New(`sqs: the dead letter has no "plugbus" attribute, so no failure: it was moved by the redrive policy after its maximum receives, or was not sent by plugbus`)
	}
	var m meta
	if err := json.Unmarshal([]byte(attributeText(v)), &m); err != nil {
		return dl, fmt.Errorf("sqs: the %q attribute of the dead letter is not valid JSON: %w", AttributeName, err)
	}
	if m.Failure == nil {
		return dl, errors.New("sqs: the dead letter carries no failure: it was moved by the redrive policy after its maximum receives (the consumer never settled it: crash or timeout?)")
	}
	at, err := time.Parse(time.RFC3339Nano, m.Failure.Time)
	if err != nil {
		return dl, fmt.Errorf("sqs: the failure time %q of the dead letter: %w", m.Failure.Time, err)
	}
	dl.Failure = bus.Failure{Reason: m.Failure.Reason, Attempts: m.Failure.Attempts, Endpoint: m.Failure.Endpoint, Time: at}
	if d.Err != nil && m.Original == "" && m.Name != "" {
		return dl, d.Err
	}
	return dl, nil
}
