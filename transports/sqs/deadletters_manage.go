package sqs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/plugbus/plugbus/bus"
)

// This file is the transport's bus.DeadLetterManager. SQS reads a queue
// only by receiving from it, so each call receives the whole dead-letter
// queue, hiding each message for manageVisibility, acts on those the filter
// selects (oldest failure first) and makes the others visible again at
// once. While a call runs, the messages it holds are invisible to another.

// manageVisibility is how long a dead-letter operation hides the messages
// it read: a message comes back by itself after it even if the process
// dies midway.
const manageVisibility = 5 * time.Minute

// replayTimeout bounds the send and delete of the dead letter in hand,
// which a cancelled context does not interrupt (so that it is never both
// replayed and left).
const replayTimeout = 30 * time.Second

// heldDead is a dead letter read from the queue, with its receipt handle.
type heldDead struct {
	dl     bus.DeadLetter
	handle string
	sent   int64 // SentTimestamp, in milliseconds: the order of the queue
}

// ListDeadLetters implements bus.DeadLetterManager: the dead letters of
// f.Endpoint's queue [Transport.DeadLetterQueueName] that f selects, oldest
// failure first. Their ID is the SQS message id of the dead letter.
func (t *Transport) ListDeadLetters(ctx context.Context, f bus.DeadLetterFilter) ([]bus.DeadLetter, error) {
	var out []bus.DeadLetter
	_, err := t.eachDead(ctx, f, func(_ context.Context, dl bus.DeadLetter) (bool, error) {
		out = append(out, dl)
		return false, nil
	}, nil)
	return out, err
}

// CountDeadLetters implements bus.DeadLetterManager: SQS's approximate
// number of visible messages of the dead-letter queue (0 when only the
// endpoint's queue exists).
func (t *Transport) CountDeadLetters(ctx context.Context, endpoint string) (int, error) {
	return t.queueMessages(ctx, endpoint, t.DeadLetterQueueName(endpoint), t.QueueName(endpoint))
}

// QueueDepth implements bus.DeadLetterManager: SQS's approximate number of
// visible messages of the endpoint's queue (0 when only its dead-letter
// queue exists).
func (t *Transport) QueueDepth(ctx context.Context, endpoint string) (int, error) {
	return t.queueMessages(ctx, endpoint, t.QueueName(endpoint), t.DeadLetterQueueName(endpoint))
}

// unknownEndpoint is the error for an endpoint without either queue.
func (t *Transport) unknownEndpoint(endpoint string) error {
	return fmt.Errorf("sqs: neither queue %s nor %s exists%s: %w",
		t.QueueName(endpoint), t.DeadLetterQueueName(endpoint), t.prefixNote(), &bus.UnknownEndpointError{Endpoint: endpoint})
}

// noDestination is the error for a replay to the endpoint (or queue URL)
// to, whose queue does not exist.
func (t *Transport) noDestination(to string) error {
	if isQueueURL(to) {
		return fmt.Errorf("sqs: queue %s does not exist: %w", to, &bus.UnknownEndpointError{Endpoint: to, Destination: true})
	}
	return fmt.Errorf("sqs: queue %s does not exist%s: %w", t.QueueName(to), t.prefixNote(), &bus.UnknownEndpointError{Endpoint: to, Destination: true})
}

// prefixNote names the transport's prefix, a part of every queue name,
// for an error about a queue that does not exist.
func (t *Transport) prefixNote() string {
	if t.o.prefix == "" {
		return ""
	}
	return fmt.Sprintf(" (the transport's prefix is %q)", t.o.prefix)
}

// checkKnown is for an endpoint one of whose two queues does not exist:
// it returns a [*bus.UnknownEndpointError] when the other one, other, does
// not exist either, and nil when it does.
func (t *Transport) checkKnown(ctx context.Context, endpoint, other string) error {
	url, err := t.existingQueue(ctx, other)
	if err != nil {
		return err
	}
	if url == "" {
		return t.unknownEndpoint(endpoint)
	}
	return nil
}

// CheckDestination implements bus.DestinationChecker: a
// [*bus.UnknownEndpointError] for a replay to an endpoint (or a queue URL)
// whose queue does not exist, which [Transport.ReplayDeadLetters] refuses;
// nil when the queue exists.
func (t *Transport) CheckDestination(ctx context.Context, to string) error {
	if err := t.checkOpen(ctx); err != nil {
		return err
	}
	return t.checkDestination(ctx, to)
}

// checkDestination returns a [*bus.UnknownEndpointError] for a replay to
// an endpoint (or a queue URL) without a queue, and nil when it exists.
func (t *Transport) checkDestination(ctx context.Context, to string) error {
	if !isQueueURL(to) {
		url, err := t.existingQueue(ctx, t.QueueName(to))
		switch {
		case err != nil:
			return err
		case url == "":
			return t.noDestination(to)
		}
		return nil
	}
	_, err := t.sqs.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{QueueUrl: &to,
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn}})
	var nq *sqstypes.QueueDoesNotExist
	switch {
	case errors.As(err, &nq):
		return t.noDestination(to)
	case err != nil:
		return fmt.Errorf("sqs: looking up queue %s: %w", to, err)
	}
	return nil
}

// existingQueue returns the URL of the queue name; "" when it does not exist.
func (t *Transport) existingQueue(ctx context.Context, name string) (string, error) {
	url, err := t.lookupQueue(ctx, name)
	var nq *sqstypes.QueueDoesNotExist
	if errors.As(err, &nq) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("sqs: looking up queue %s: %w", name, err)
	}
	return url, nil
}

// queueMessages returns the visible messages of the queue name, one of
// endpoint's two queues: 0 when it does not exist but the other one,
// other, does; a [*bus.UnknownEndpointError] when neither does.
func (t *Transport) queueMessages(ctx context.Context, endpoint, name, other string) (int, error) {
	url, err := t.existingQueue(ctx, name)
	if err != nil {
		return 0, err
	}
	if url == "" {
		return 0, t.checkKnown(ctx, endpoint, other)
	}
	out, err := t.sqs.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{QueueUrl: &url,
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameApproximateNumberOfMessages}})
	if err != nil {
		return 0, fmt.Errorf("sqs: reading the depth of queue %s: %w", name, err)
	}
	n, err := strconv.Atoi(out.Attributes[string(sqstypes.QueueAttributeNameApproximateNumberOfMessages)])
	if err != nil {
		return 0, fmt.Errorf("sqs: the depth of queue %s: %w", name, err)
	}
	return n, nil
}

// ReplayDeadLetters implements bus.DeadLetterManager: each dead letter f
// selects is sent (bus.ReplayEnvelope's copy) to r.To or the endpoint that
// failed it and, once SQS accepted the copy, deleted from the dead-letter
// queue. A destination whose queue does not exist is a
// [*bus.UnknownEndpointError], before the dead-letter queue is read for
// r.To, before the dead letter is copied for its own endpoint: it stays in
// the dead-letter queue.
func (t *Transport) ReplayDeadLetters(ctx context.Context, f bus.DeadLetterFilter, r bus.Replay, done func(bus.DeadLetter)) (int, error) {
	if err := f.Check(); err != nil {
		return 0, err
	}
	if r.To != "" {
		if err := t.checkOpen(ctx); err != nil {
			return 0, err
		}
		if err := t.checkDestination(ctx, r.To); err != nil {
			return 0, fmt.Errorf("sqs: replay to %s: %w; nothing was replayed", r.To, err)
		}
	}
	return t.eachDead(ctx, f, func(ctx context.Context, dl bus.DeadLetter) (bool, error) {
		env, to, err := bus.ReplayEnvelope(dl, f.Endpoint, r)
		if err != nil {
			return false, err
		}
		if err := t.replaySend(ctx, env, to); err != nil {
			return false, fmt.Errorf("sqs: replaying dead letter %s to %s: %w (it stays in the dead-letter queue)", dl.ID, to, err)
		}
		return true, nil
	}, done)
}

// replaySend sends a replayed copy as Send does, except that a queue that
// does not exist, an instance queue's included (which Send drops a
// message to), is a [*bus.UnknownEndpointError]: the dead letter stays.
func (t *Transport) replaySend(ctx context.Context, env *bus.Envelope, to string) error {
	q, err := t.prepareSend(ctx, env, to, env.Due)
	if errors.Is(err, ErrNoQueue) {
		return t.noDestination(to)
	}
	if err != nil {
		return err
	}
	_, err = t.sqs.SendMessage(ctx, &awssqs.SendMessageInput{QueueUrl: &q.url, MessageBody: &q.e.body, MessageAttributes: q.e.sqsAttributes(), DelaySeconds: q.delaySeconds})
	var nq *sqstypes.QueueDoesNotExist
	if errors.As(err, &nq) {
		if !q.byURL {
			t.forgetQueue(to) // deleted since it was looked up
		}
		return t.noDestination(to)
	}
	return t.sendError(ctx, env, to, q, err)
}

// DeleteDeadLetters implements bus.DeadLetterManager: each dead letter f
// selects is deleted from the dead-letter queue.
func (t *Transport) DeleteDeadLetters(ctx context.Context, f bus.DeadLetterFilter, done func(bus.DeadLetter)) (int, error) {
	return t.eachDead(ctx, f, func(context.Context, bus.DeadLetter) (bool, error) { return true, nil }, done)
}

// eachDead reads f.Endpoint's whole dead-letter queue and calls act for
// each dead letter f selects, oldest failure first, up to f.Limit: when
// act reports true, the message is deleted and done called. It stops
// between two when ctx ends, returning ctx's error; the message in hand is
// finished with a context of its own. What it did not delete is made
// visible again.
func (t *Transport) eachDead(ctx context.Context, f bus.DeadLetterFilter, act func(context.Context, bus.DeadLetter) (bool, error), done func(bus.DeadLetter)) (n int, err error) {
	if err := f.Check(); err != nil {
		return 0, err
	}
	if err := t.checkOpen(ctx); err != nil {
		return 0, err
	}
	url, err := t.existingQueue(ctx, t.DeadLetterQueueName(f.Endpoint))
	if err != nil {
		return 0, err
	}
	if url == "" {
		return 0, t.checkKnown(ctx, f.Endpoint, t.QueueName(f.Endpoint))
	}
	held, err := t.receiveAll(ctx, url)
	defer func() {
		// Reported also when ctx ended: a dead letter left hidden comes
		// back only after manageVisibility.
		if rerr := t.releaseHandles(context.WithoutCancel(ctx), url, held); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}()
	if err != nil {
		return 0, err
	}
	var sel []int
	match := f.Matcher()
	for i := range held {
		if match(&held[i].dl) {
			sel = append(sel, i)
		}
	}
	slices.SortStableFunc(sel, func(a, b int) int {
		return cmp.Or(held[a].dl.Failure.Time.Compare(held[b].dl.Failure.Time), cmp.Compare(held[a].sent, held[b].sent))
	})
	if f.Limit > 0 && len(sel) > f.Limit {
		sel = sel[:f.Limit]
	}
	for _, i := range sel {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		h := &held[i]
		remove, err := t.actOn(ctx, url, h, act)
		if err != nil {
			return n, err
		}
		if remove {
			n++
			if done != nil {
				done(h.dl)
			}
		}
	}
	return n, nil
}

// actOn runs act on h and deletes it when act says so, on a context that
// the caller's cancellation does not interrupt.
func (t *Transport) actOn(ctx context.Context, url string, h *heldDead, act func(context.Context, bus.DeadLetter) (bool, error)) (bool, error) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), replayTimeout)
	defer cancel()
	remove, err := act(actx, h.dl)
	if err != nil || !remove {
		return false, err
	}
	if _, err := t.sqs.DeleteMessage(actx, &awssqs.DeleteMessageInput{QueueUrl: &url, ReceiptHandle: &h.handle}); err != nil {
		return false, fmt.Errorf("sqs: deleting dead letter %s: %w", h.dl.ID, err)
	}
	h.handle = "" // deleted: nothing to release
	return true, nil
}

// receiveAll receives every message of the queue at url, hiding each for
// manageVisibility, until two receives in a row return nothing.
func (t *Transport) receiveAll(ctx context.Context, url string) ([]heldDead, error) {
	var held []heldDead
	seen := map[string]bool{}
	for empty := 0; empty < 2; {
		out, err := t.sqs.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{
			QueueUrl: &url, MaxNumberOfMessages: 10, WaitTimeSeconds: 0,
			VisibilityTimeout:           int32(manageVisibility / time.Second),
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameSentTimestamp},
		})
		if err != nil {
			return held, fmt.Errorf("sqs: reading dead-letter queue %s: %w", queueName(url), err)
		}
		if len(out.Messages) == 0 {
			empty++
			continue
		}
		empty = 0
		for _, m := range out.Messages {
			id := aws.ToString(m.MessageId)
			if seen[id] {
				continue
			}
			seen[id] = true
			dl, _ := DecodeDeadLetter(m) // what cannot be read is shown as it came
			dl.ID = id
			sent, _ := strconv.ParseInt(m.Attributes[string(sqstypes.MessageSystemAttributeNameSentTimestamp)], 10, 64)
			held = append(held, heldDead{dl: dl, handle: aws.ToString(m.ReceiptHandle), sent: sent})
		}
	}
	return held, nil
}

// releaseHandles makes the held messages not deleted visible again.
func (t *Transport) releaseHandles(ctx context.Context, url string, held []heldDead) error {
	var handles []string
	for _, h := range held {
		if h.handle != "" {
			handles = append(handles, h.handle)
		}
	}
	var errs []error
	for len(handles) > 0 {
		n := min(len(handles), maxBatch)
		entries := make([]sqstypes.ChangeMessageVisibilityBatchRequestEntry, n)
		for i, h := range handles[:n] {
			entries[i] = sqstypes.ChangeMessageVisibilityBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: aws.String(h), VisibilityTimeout: 0}
		}
		handles = handles[n:]
		out, err := t.sqs.ChangeMessageVisibilityBatch(ctx, &awssqs.ChangeMessageVisibilityBatchInput{QueueUrl: &url, Entries: entries})
		if err != nil {
			errs = append(errs, fmt.Errorf("sqs: making %d dead letters visible again failed; they come back after %v: %w", n, manageVisibility, err))
			continue
		}
		for _, f := range out.Failed {
			errs = append(errs, fmt.Errorf("sqs: making a dead letter visible again failed (%s: %s); it comes back after %v", aws.ToString(f.Code), aws.ToString(f.Message), manageVisibility))
		}
	}
	return errors.Join(errs...)
}

var (
	_ bus.DeadLetterManager  = (*Transport)(nil)
	_ bus.DestinationChecker = (*Transport)(nil)
)
