package sqs

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/plugbus/plugbus/bus"
)

// How a delay is carried
//
// ReturnAfter re-sends the received message to the queue it came from
// (same body, same attributes) with DelaySeconds, then deletes the one
// received. The copy's "plugbus" attribute carries:
//
//   - "prior": the attempts made before it. SQS restarts the receive count
//     of a new message, so the copy's Attempt is prior plus its receive
//     count; a prior out of range (below 1, or not below the maximum
//     attempts) is ignored, with a warning, and never shortens a message's
//     life;
//   - "due": when it may be delivered, for a delay longer than one hop
//     (15 minutes, SQS's longest DelaySeconds). A transport that receives
//     a copy before it is due re-sends it for the rest of its delay, at
//     most one hop at a time, and deletes the one received, without
//     handing it to the bus: a hop counts no attempt;
//   - "hist": the bus's retry history (bus.Delivery.Retries, as its
//     MarshalText writes it), read back into the copy's Delivery.Retries.
//
// Why a re-send and not the received message's visibility timeout, which
// would keep SQS's own receive count: a message hidden by its visibility
// timeout is in flight, and SQS holds about 120,000 messages in flight
// per queue (then a long poll returns nothing: the whole endpoint
// stalls); a visibility timeout reaches at most 12 hours from the
// receipt; and it cannot change the message, so no history can travel
// with it. The queue's redrive policy stays a backstop: each copy's
// receive count starts at 0 and never exceeds its Attempt, so SQS never
// dead-letters a copy before the bus's own count would, and a copy whose
// consumer keeps crashing reaches the dead-letter queue after
// maxReceiveCount receives. docs/transports/sqs.md tells the whole story.

const (
	// hopDelay is the longest delay of one SQS message: DelaySeconds is at
	// most 15 minutes. A longer delay is carried in hops.
	hopDelay = 15 * time.Minute
	// maxDelay is the longest delay ReturnAfter and the scheduled sends
	// carry: 14 days, as long as a dead letter is kept. Each hop of 15
	// minutes costs a send, a receive and a delete.
	maxDelay = 14 * 24 * time.Hour
	// maxInvisible is how long a received message may stay invisible,
	// counted from its receipt: SQS refuses a visibility timeout beyond it.
	maxInvisible = 12 * time.Hour
	// invisibleMargin is kept from maxInvisible, for the time between
	// SQS's receipt and ours.
	invisibleMargin = time.Minute
)

// The keys of the "plugbus" attribute that a re-sent copy carries beyond
// the envelope.
const (
	priorKey   = "prior"
	dueKey     = "due"
	historyKey = "hist"
)

// carried is what a copy re-sent by the transport carries beyond the
// envelope, as read from its "plugbus" attribute: raw JSON, unchecked,
// so that a value of the wrong type never makes the rest unreadable.
type carried struct {
	prior, due, history json.RawMessage
}

// readCarried reads what the "plugbus" attribute text of a received
// message carries beyond the envelope. Most messages carry nothing: they
// cost a search for the keys, not a second parse.
func readCarried(text string) carried {
	if !strings.Contains(text, `"`+priorKey+`"`) && !strings.Contains(text, `"`+dueKey+`"`) && !strings.Contains(text, `"`+historyKey+`"`) {
		return carried{}
	}
	var fields struct {
		Prior   json.RawMessage `json:"prior"`
		Due     json.RawMessage `json:"due"`
		History json.RawMessage `json:"hist"`
	}
	if json.Unmarshal([]byte(text), &fields) != nil {
		return carried{} // the envelope's own reading reports why
	}
	return carried{prior: fields.Prior, due: fields.Due, history: fields.History}
}

// MaxDelay returns the longest delay [Transport.ReturnAfter] carries: 14
// days. A delay longer than 15 minutes, SQS's longest DelaySeconds, is
// carried in hops of 15 minutes, each a send, a receive and a delete.
func (t *Transport) MaxDelay() time.Duration { return maxDelay }

// instanceHopDelay is the longest delay of one message on an instance
// queue, which SQS keeps for 60 s from when it was sent, delay included:
// a longer delay is carried in hops of this length, each a message of its
// own, so that none outlives the queue's retention.
const instanceHopDelay = 45 * time.Second

// hopTo returns the longest delay of one message to the queue of url.
func (t *Transport) hopTo(url string) time.Duration {
	if isInstanceQueueURL(url) {
		return min(t.o.hop, t.o.instanceHop)
	}
	return t.o.hop
}

// ReturnAfter gives d back to its queue for redelivery with Attempt+1, no
// earlier than delay from now (none for a delay of 0 or less; a delay
// longer than [Transport.MaxDelay] is cut to it, with a warning).
//
// It sends a copy of d (same body and attributes, its attempts so far and
// its due time added to the "plugbus" attribute) with DelaySeconds, then
// deletes d. The copy waits in SQS, durable, not in flight: no consumer
// holds it, and a consumer that stops or crashes meanwhile loses nothing.
// A delay longer than 15 minutes is carried in hops: whichever consumer
// receives the copy before it is due sends it on, without running a
// handler. When SQS refuses the copy (a message grown past the queue's
// size limit), d's visibility timeout is set to the delay instead, cut to
// what SQS allows (12 hours from its receipt). When deleting d fails, d
// is delivered again after its visibility timeout, beside the copy.
func (t *Transport) ReturnAfter(ctx context.Context, d *bus.Delivery, cause error, delay time.Duration) error {
	e, err := t.settle(d, "return")
	if err != nil {
		return err
	}
	if delay > maxDelay {
		t.log.WarnContext(ctx, "message returned with a delay longer than the transport carries: cut to its maximum",
			slog.String("message_id", d.Attributes.MessageID), slog.Duration("delay", delay), slog.Duration("max_delay", maxDelay))
		delay = maxDelay
	}
	delay = max(delay, 0)
	hop := t.hopTo(e.queue)
	now := time.Now()
	var due time.Time
	if delay > hop {
		due = now.Add(delay)
	}
	prior := min(d.Attempt, t.maxAttempts-1)
	attrs, err := withCarried(e.msg.MessageAttributes, prior, due, d.Retries)
	if err == nil {
		err = t.resend(ctx, e, attrs, min(delay, hop))
	}
	if err != nil {
		return t.delayVisible(ctx, e, d, now, delay, err)
	}
	if err := t.deleteEntry(context.WithoutCancel(ctx), e); err != nil {
		return fmt.Errorf("sqs: return %s (id %s): its delayed copy was sent but deleting the message failed, so it will also be delivered again after its visibility timeout: %w",
			d.Name, d.Attributes.MessageID, err)
	}
	if t.log.Enabled(ctx, slog.LevelDebug) {
		t.log.DebugContext(ctx, "message returned with a delay", slog.String("message_id", d.Attributes.MessageID), slog.Int("attempt", d.Attempt),
			slog.Duration("delay", delay), slog.Any("cause", cause))
	}
	return nil
}

// delayVisible delays d, a settled entry e whose copy could not be sent
// (because of sendErr), by its visibility timeout: delay, cut to what
// remains of the 12 hours SQS lets a received message stay invisible.
// Its receive count goes on, so its next Attempt is one higher all the
// same.
func (t *Transport) delayVisible(ctx context.Context, e *entry, d *bus.Delivery, now time.Time, delay time.Duration, sendErr error) error {
	defer t.ops.Done()
	visible := min(delay, e.received.Add(maxInvisible-invisibleMargin).Sub(now))
	secs := ceilSeconds(max(visible, 0))
	t.log.WarnContext(ctx, "sending the delayed copy of a returned message failed: it is delayed by its visibility timeout instead",
		slog.String("message_id", d.Attributes.MessageID), slog.Duration("delay", delay), slog.Duration("visibility", time.Duration(secs)*time.Second),
		slog.Any("error", sendErr))
	t.hbMu.RLock()
	_, err := t.sqs.ChangeMessageVisibility(context.WithoutCancel(ctx), &awssqs.ChangeMessageVisibilityInput{
		QueueUrl: &e.queue, ReceiptHandle: &e.handle, VisibilityTimeout: secs,
	})
	t.hbMu.RUnlock()
	if err != nil {
		return fmt.Errorf("sqs: return %s (id %s) with a delay: sending its copy failed (%w), and changing its visibility too, so it will be delivered again after its visibility timeout: %w",
			d.Name, d.Attributes.MessageID, sendErr, err)
	}
	return nil
}

// resend sends the message of the settled entry e again to its queue,
// with attrs as its attributes, delivered no earlier than delay from now
// (at most one hop).
func (t *Transport) resend(ctx context.Context, e *entry, attrs map[string]sqstypes.MessageAttributeValue, delay time.Duration) error {
	body := aws.ToString(e.msg.Body)
	if body == "" {
		body = "=" // unreachable for a received message; SQS refuses empty bodies
	}
	_, err := t.sqs.SendMessage(context.WithoutCancel(ctx), &awssqs.SendMessageInput{
		QueueUrl: &e.queue, MessageBody: &body, MessageAttributes: attrs, DelaySeconds: ceilSeconds(delay),
	})
	return err
}

// withCarried returns a copy of attrs whose "plugbus" attribute says that
// prior attempts were made (none when prior < 1), unless due is zero when
// the message is due, and its retry history. The other fields are kept as
// they are.
func withCarried(attrs map[string]sqstypes.MessageAttributeValue, prior int, due time.Time, retries bus.RetryHistory) (map[string]sqstypes.MessageAttributeValue, error) {
	v, ok := attrs[AttributeName]
	if !ok || v.StringValue == nil {
		return nil, fmt.Errorf("the message has no %q attribute of type String to carry its attempts in", AttributeName)
	}
	history, err := historyJSON(retries)
	if err != nil {
		return nil, err
	}
	text, err := setCarried(*v.StringValue, map[string]json.RawMessage{
		priorKey:   priorJSON(prior),
		dueKey:     dueJSON(due),
		historyKey: history,
	})
	if err != nil {
		return nil, err
	}
	out := make(map[string]sqstypes.MessageAttributeValue, len(attrs))
	for k, a := range attrs {
		out[k] = a
	}
	out[AttributeName] = sqstypes.MessageAttributeValue{DataType: v.DataType, StringValue: &text} // a custom label ("String.json") kept
	return out, nil
}

func priorJSON(prior int) json.RawMessage {
	if prior < 1 {
		return nil
	}
	return strconv.AppendInt(nil, int64(prior), 10)
}

// historyJSON returns the retry history as a JSON string: the bus's text,
// opaque to the transport. A history with nothing in it is left out.
func historyJSON(h bus.RetryHistory) (json.RawMessage, error) {
	if h.IsZero() {
		return nil, nil
	}
	text, err := h.MarshalText()
	if err != nil {
		return nil, fmt.Errorf("encoding the retry history: %w", err)
	}
	return strconv.AppendQuote(nil, string(text)), nil
}

func dueJSON(due time.Time) json.RawMessage {
	if due.IsZero() {
		return nil
	}
	return strconv.AppendQuote(nil, due.UTC().Format(time.RFC3339Nano))
}

// setCarried returns the JSON object text with the fields of set set, a
// nil value removing its field. A key that differs from one of set only
// in case is removed too: encoding/json would read it into the same
// field. Every other field is kept as it is, in its place, duplicates
// included, so that the copy reads as the message did.
func setCarried(text string, set map[string]json.RawMessage) (string, error) {
	dec := json.NewDecoder(strings.NewReader(text))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return "", fmt.Errorf("the %q attribute is not a JSON object", AttributeName)
	}
	out := make([]byte, 0, len(text)+64)
	out = append(out, '{')
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return "", fmt.Errorf("reading the %q attribute: %w", AttributeName, err)
		}
		key, _ := tok.(string) // an object's keys are strings
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return "", fmt.Errorf("reading the %q attribute: %w", AttributeName, err)
		}
		if setsKey(set, key) {
			continue
		}
		out = appendField(out, key, value)
	}
	if _, err := dec.Token(); err != nil {
		return "", fmt.Errorf("reading the %q attribute: %w", AttributeName, err)
	}
	for _, key := range slices.Sorted(maps.Keys(set)) {
		if set[key] != nil {
			out = appendField(out, key, set[key])
		}
	}
	return string(append(out, '}')), nil
}

// setsKey reports whether key is one of set's keys, in any case.
func setsKey(set map[string]json.RawMessage, key string) bool {
	for k := range set {
		if strings.EqualFold(k, key) {
			return true
		}
	}
	return false
}

// appendField appends "key":value to the JSON object being written in out.
func appendField(out []byte, key string, value json.RawMessage) []byte {
	if len(out) > 1 {
		out = append(out, ',')
	}
	quoted, _ := json.Marshal(key) // a string always marshals
	return append(append(append(out, quoted...), ':'), value...)
}

// ceilSeconds returns d in whole seconds, rounded up: a delay is never
// shorter than asked.
func ceilSeconds(d time.Duration) int32 {
	if d <= 0 {
		return 0
	}
	return int32((d + time.Second - 1) / time.Second)
}

// carry applies what a received copy carries to d: its prior attempts to
// d.Attempt, its retry history to d.Retries. It returns when d is due,
// zero when it is due now: no due time, one that has passed, or one that
// cannot be trusted. What it cannot trust it ignores, with a warning: a
// prior that is not an integer from 1 to the maximum attempts less one, a
// history the bus cannot read, a due time that is not an RFC 3339 time or
// lies further ahead than MaxDelay and the clock skew allowed.
func (t *Transport) carry(ctx context.Context, d *bus.Delivery, c carried) (due time.Time) {
	if d.Err != nil {
		return time.Time{}
	}
	if isSet(c.prior) {
		prior, why := t.checkPrior(c.prior)
		if why != "" {
			t.ignoreCarried(ctx, d, priorKey, why)
		}
		d.Attempt += prior
	}
	if isSet(c.history) {
		if why := readHistory(c.history, &d.Retries); why != "" {
			t.ignoreCarried(ctx, d, historyKey, why)
		}
	}
	if !isSet(c.due) {
		return time.Time{}
	}
	due, why := checkDue(c.due, time.Now())
	if why != "" {
		t.ignoreCarried(ctx, d, dueKey, why)
	}
	return due
}

// isSet reports whether a carried field is present.
func isSet(raw json.RawMessage) bool { return len(raw) > 0 && string(raw) != "null" }

// checkPrior returns the prior attempts raw holds, or 0 and why they
// cannot be trusted.
func (t *Transport) checkPrior(raw json.RawMessage) (int, string) {
	var prior int
	if err := json.Unmarshal(raw, &prior); err != nil {
		return 0, fmt.Sprintf("%s is not an integer", cut(string(raw)))
	}
	if most := t.maxAttempts - 1; prior < 1 || prior > most {
		return 0, fmt.Sprintf("%d is out of range: a copy carries from 1 to %d prior attempts (the maximum attempts less one)", prior, max(most, 0))
	}
	return prior, ""
}

// readHistory reads the retry history raw holds into h, or returns why it
// cannot (h is then left as it was).
func readHistory(raw json.RawMessage, h *bus.RetryHistory) string {
	var text string
	if err := json.Unmarshal(raw, &text); err != nil {
		return fmt.Sprintf("%s is not a string", cut(string(raw)))
	}
	if err := h.UnmarshalText([]byte(text)); err != nil {
		return err.Error()
	}
	return ""
}

// checkDue returns the due time raw holds when it lies after now, zero
// when it does not, and zero and why when it cannot be trusted.
func checkDue(raw json.RawMessage, now time.Time) (time.Time, string) {
	var text string
	if err := json.Unmarshal(raw, &text); err != nil {
		return time.Time{}, fmt.Sprintf("%s is not a string", cut(string(raw)))
	}
	due, err := time.Parse(time.RFC3339Nano, text)
	if err != nil {
		return time.Time{}, fmt.Sprintf("%q is not an RFC 3339 time", cut(text))
	}
	if ahead := due.Sub(now); ahead > maxDelay+ClockSkewAllowance {
		return time.Time{}, fmt.Sprintf("%q lies %s ahead, more than the longest delay (%s) and the clock skew allowed (sqs.ClockSkewAllowance, %s): the message is delivered now",
			text, ahead.Round(time.Second), maxDelay, ClockSkewAllowance)
	}
	if !due.After(now) {
		return time.Time{}, ""
	}
	return due, ""
}

func (t *Transport) ignoreCarried(ctx context.Context, d *bus.Delivery, field, why string) {
	msg, _ := d.Raw.(sqstypes.Message)
	t.log.WarnContext(ctx, "received message: carried field ignored", slog.String("attribute", AttributeName), slog.String("field", field),
		slog.String("reason", why), slog.String("sqs_message_id", aws.ToString(msg.MessageId)),
		slog.String("message_id", d.Attributes.MessageID), slog.String("message_name", d.Name))
}

// hop sends the message of e, a settled entry not due before due, on for
// the rest of its delay (at most one hop), and deletes it: it is not
// handed to the bus, and its copy carries the same attributes, so the
// hop counts no attempt. When SQS refuses the copy, e's visibility
// timeout is set to the rest of the delay instead, which costs the
// message one receive.
func (t *Transport) hop(ctx context.Context, e *entry, d *bus.Delivery, due time.Time) {
	ctx = context.WithoutCancel(ctx)
	rest := time.Until(due)
	hop := t.hopTo(e.queue)
	err := t.resend(ctx, e, e.msg.MessageAttributes, min(rest, hop))
	if err != nil {
		t.log.WarnContext(ctx, "sending on a message that is not due yet failed: it is hidden by its visibility timeout instead",
			slog.String("message_id", d.Attributes.MessageID), slog.Time("due", due), slog.Any("error", err))
		err = t.delayVisible(ctx, e, d, time.Now(), rest, err)
		if err != nil {
			t.log.ErrorContext(ctx, "delaying a message that is not due yet failed", slog.String("message_id", d.Attributes.MessageID), slog.Any("error", err))
		}
		return
	}
	if err := t.deleteEntry(ctx, e); err != nil {
		t.log.WarnContext(ctx, "a message not due yet was sent on but deleting it failed: it will be received again after its visibility timeout, and sent on again",
			slog.String("message_id", d.Attributes.MessageID), slog.Any("error", err))
		return
	}
	if t.log.Enabled(ctx, slog.LevelDebug) {
		t.log.DebugContext(ctx, "message not due yet sent on", slog.String("message_id", d.Attributes.MessageID), slog.Time("due", due),
			slog.Duration("delay", time.Duration(ceilSeconds(min(rest, hop)))*time.Second))
	}
}

// delayUntil returns how far due lies ahead of now: 0 when due is zero
// or has passed. It refuses a due time further ahead than MaxDelay.
func delayUntil(due, now time.Time) (time.Duration, error) {
	if due.IsZero() || !due.After(now) {
		return 0, nil
	}
	delay := due.Sub(now)
	if delay > maxDelay {
		return 0, fmt.Errorf("due in %s, further ahead than the transport carries (%s, Transport.MaxDelay): schedule it nearer, or keep it in a store and send it later",
			delay.Round(time.Second), maxDelay)
	}
	return delay, nil
}

// setDue adds due to the encoded message's "plugbus" attribute and checks
// its size again.
func (e *encoded) setDue(name string, due time.Time, maxSize int) error {
	text, err := setCarried(e.attrs[AttributeName], map[string]json.RawMessage{dueKey: dueJSON(due)})
	if err != nil {
		return err
	}
	e.size += len(text) - len(e.attrs[AttributeName])
	e.attrs[AttributeName] = text
	if e.size > maxSize {
		return &bus.MessageTooLargeError{Transport: transportName, Message: name, Size: e.size, Limit: maxSize}
	}
	return nil
}

var _ bus.Delayer = (*Transport)(nil)
