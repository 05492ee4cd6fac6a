package sqs

import (
	"context"
	"fmt"
	"math/bits"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awssns "github.com/aws/aws-sdk-go-v2/service/sns"
	snstypes "github.com/aws/aws-sdk-go-v2/service/sns/types"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/wait"
)

// The limits of one SendMessageBatch and one PublishBatch call.
const (
	batchEntries = 10
	batchBytes   = 256 << 10 // the sum of the entries' sizes
	// batchCalls bounds the calls of one SendBatch in flight at once.
	batchCalls = 8
)

// SendBatch implements bus.Batcher: it sends the sends of batch with
// SendMessageBatch, per queue, and publishes the publishes with SNS
// PublishBatch, per topic, at most 10 messages and 256 KiB (the sizes as
// [bus.MessageTooLargeError] counts them) a call, several calls at once.
// Each message is encoded, delayed (DelaySeconds, hops) and refused as
// Send and Publish would; an entry SQS or SNS fails, and every entry of a
// call that fails, is named by its index in the *bus.BatchError. A call
// is tried again by the SDK's retryer as a Send is (a throttle, a server
// or connection error). The entries a call's answer names as failed on
// the service's side ([EntryError] SenderFault false: an internal error,
// a throttle) are sent again, without the others, in another call after
// the back-off of the client's retryer (its RetryDelay), up to its
// MaxAttempts calls in all (3 by default); an entry the answer names as
// sent, or does not name, is never sent again. A retried entry is the
// same message, with the same message id. An entry still failing then
// fails with its last [*EntryError]; one refused (SenderFault true) fails
// at once; when ctx ends during a back-off, the entries waiting fail with
// ctx's error, not sent. The entries of a call that may have reached the
// service before it failed (ctx ended while it was in flight, the
// connection was lost) fail with an error saying that the message may
// have been sent, as Send's does. A message to an instance queue that no
// longer exists is dropped with a warning, as by Send.
func (t *Transport) SendBatch(ctx context.Context, batch []bus.Outbound) error {
	if err := t.checkOpen(ctx); err != nil {
		return err
	}
	errs := make([]error, len(batch))
	var calls []batchCall
	open := map[string]int{} // queue URL or topic ARN → its last call in calls
	add := func(target string, publish bool, i, size int, q queued) {
		if k, ok := open[target]; ok && len(calls[k].index) < batchEntries && calls[k].size+size <= batchBytes {
			c := &calls[k]
			c.index, c.queued, c.size = append(c.index, i), append(c.queued, q), c.size+size
			return
		}
		open[target] = len(calls)
		calls = append(calls, batchCall{target: target, publish: publish, index: []int{i}, queued: []queued{q}, size: size})
	}
	for i, m := range batch {
		env := m.Envelope
		if m.Kind == bus.KindPublish {
			arn, e, err := t.preparePublish(ctx, env, env.Due)
			if err != nil {
				errs[i] = err
				continue
			}
			add("sns "+arn, true, i, e.size, queued{url: arn, e: e})
			continue
		}
		q, err := t.prepareSend(ctx, env, m.Destination, env.Due)
		if err != nil {
			errs[i] = err
			continue
		}
		add("sqs "+q.url, false, i, q.e.size, q)
	}
	var wg sync.WaitGroup
	limit := make(chan struct{}, batchCalls)
	for k := range calls {
		c := &calls[k]
		limit <- struct{}{}
		wg.Go(func() {
			defer func() { <-limit }()
			if c.publish {
				t.publishBatch(ctx, batch, c, errs)
			} else {
				t.sendBatch(ctx, batch, c, errs)
			}
		})
	}
	wg.Wait()
	return bus.BatchResult(errs)
}

// batchCall is one SendMessageBatch (to the queue URL of queued) or
// PublishBatch (to the topic ARN) call: the indexes in the batch of its
// entries and their encodings.
type batchCall struct {
	target  string
	publish bool
	index   []int
	queued  []queued
	size    int
}

// sendBatch makes call c, setting errs of the entries that failed.
func (t *Transport) sendBatch(ctx context.Context, batch []bus.Outbound, c *batchCall, errs []error) {
	entries := make([]sqstypes.SendMessageBatchRequestEntry, len(c.index))
	for j, q := range c.queued {
		entries[j] = sqstypes.SendMessageBatchRequestEntry{Id: strPtr(strconv.Itoa(j)), MessageBody: &q.e.body,
			MessageAttributes: q.e.sqsAttributes(), DelaySeconds: q.delaySeconds}
	}
	in := &awssqs.SendMessageBatchInput{QueueUrl: &c.queued[0].url, Entries: entries}
	c.run(ctx, t.sqsRetryer, errs, func(pending uint16) (uint16, []entryFailure, error) {
		in.Entries = keepPending(in.Entries, pending, c, func(e *sqstypes.SendMessageBatchRequestEntry) *string { return e.Id })
		callCtx, o := trackSend(ctx)
		out, err := t.sqs.SendMessageBatch(callCtx, in)
		if err != nil {
			return 0, nil, o.err(err)
		}
		sent, failed := batchAnswer(c, out.Successful, out.Failed, func(e *sqstypes.SendMessageBatchResultEntry) *string { return e.Id },
			func(f *sqstypes.BatchResultErrorEntry) entryFailure {
				return entryFailure{f.Id, &EntryError{Code: deref(f.Code), Message: deref(f.Message), SenderFault: f.SenderFault}}
			})
		return sent, failed, nil
	}, func(i, j int, err error) error {
		return t.sendError(ctx, batch[i].Envelope, batch[i].Destination, c.queued[j], err)
	}, func(i int, err error) error {
		return fmt.Errorf("sqs: send %s to endpoint %s: %w", batch[i].Envelope.Name, batch[i].Destination, err)
	})
}

// publishBatch makes call c, setting errs of the entries that failed.
func (t *Transport) publishBatch(ctx context.Context, batch []bus.Outbound, c *batchCall, errs []error) {
	entries := make([]snstypes.PublishBatchRequestEntry, len(c.index))
	for j, q := range c.queued {
		entries[j] = snstypes.PublishBatchRequestEntry{Id: strPtr(strconv.Itoa(j)), Message: &q.e.body, MessageAttributes: q.e.snsAttributes()}
	}
	arn := c.queued[0].url
	in := &awssns.PublishBatchInput{TopicArn: &arn, PublishBatchRequestEntries: entries}
	wrap := func(i int, err error) error {
		return fmt.Errorf("sqs: publish %s to topic %s: %w", batch[i].Envelope.Name, arn, err)
	}
	c.run(ctx, t.snsRetryer, errs, func(pending uint16) (uint16, []entryFailure, error) {
		in.PublishBatchRequestEntries = keepPending(in.PublishBatchRequestEntries, pending, c, func(e *snstypes.PublishBatchRequestEntry) *string { return e.Id })
		callCtx, o := trackSend(ctx)
		out, err := t.sns.PublishBatch(callCtx, in)
		if err != nil {
			return 0, nil, o.err(err)
		}
		sent, failed := batchAnswer(c, out.Successful, out.Failed, func(e *snstypes.PublishBatchResultEntry) *string { return e.Id },
			func(f *snstypes.BatchResultErrorEntry) entryFailure {
				return entryFailure{f.Id, &EntryError{Code: deref(f.Code), Message: deref(f.Message), SenderFault: f.SenderFault}}
			})
		return sent, failed, nil
	}, func(i, _ int, err error) error { return wrap(i, err) }, wrap)
}

// batchAnswer reads the answer of a call of c (SQS's or SNS's types): the
// entries it names as sent, as bits, and those it names as failed.
func batchAnswer[S, F any](c *batchCall, successful []S, failed []F, id func(*S) *string, failure func(*F) entryFailure) (uint16, []entryFailure) {
	var sent uint16
	for k := range successful {
		if j, in := entryIndex(id(&successful[k]), len(c.index)); in {
			sent |= 1 << j
		}
	}
	fs := make([]entryFailure, len(failed))
	for k := range failed {
		fs[k] = failure(&failed[k])
	}
	return sent, fs
}

// keepPending returns entries without those not in pending (a bit per
// entry of c, by the index its id holds), in their order and in place.
func keepPending[E any](entries []E, pending uint16, c *batchCall, id func(*E) *string) []E {
	kept := entries[:0]
	for k := range entries {
		if j, in := entryIndex(id(&entries[k]), len(c.index)); in && pending&(1<<j) != 0 {
			kept = append(kept, entries[k])
		}
	}
	return kept
}

// entryFailure is an entry a batch call's answer names as failed.
type entryFailure struct {
	id  *string
	err *EntryError
}

// The entries of a call are the bits of a uint16 (bit j for entry j).
const _ = uint16(1<<batchEntries - 1)

// run makes call c, trying again the entries that failed on the service's
// side, and sets errs of the entries that failed in the end. call makes
// one call with the entries of pending, keeping their ids, and returns
// those its answer names as sent and as failed, or the call's error.
// callErr gives the error of entry j of c (index i in the batch) in a
// call that failed, wrap that of an entry that failed alone.
//
// An entry the answer names as failed with SenderFault false is sent
// again, with the others that did and no other, after the back-off of r
// (RetryDelay, given the number of calls made and the entry's code), in
// up to r's MaxAttempts calls in all; one with SenderFault true would be
// refused again and fails at once. An entry the answer names as sent is
// never sent again, nor one it does not name (it may have been sent).
// When ctx ends during a back-off, the entries waiting fail with its
// error.
func (c *batchCall) run(ctx context.Context, r aws.Retryer, errs []error,
	call func(pending uint16) (sent uint16, failed []entryFailure, err error),
	callErr func(i, j int, err error) error, wrap func(i int, err error) error) {
	pending := uint16(1)<<len(c.index) - 1
	for attempt := 1; ; attempt++ {
		sent, failed, err := call(pending)
		if err != nil {
			c.fail(pending, errs, func(i, j int) error { return callErr(i, j, err) })
			return
		}
		var last [batchEntries]*EntryError // the failures of the entries to send again
		resend := c.answer(pending, sent, failed, &last, errs, wrap)
		if resend == 0 {
			return
		}
		delay, again := retryDelay(r, attempt, last[bits.TrailingZeros16(resend)])
		if !again {
			c.fail(resend, errs, func(i, j int) error { return wrap(i, tried(attempt, last[j])) })
			return
		}
		if !wait.Sleep(ctx, delay) {
			c.fail(resend, errs, func(i, j int) error {
				return wrap(i, fmt.Errorf("the message was not accepted (%w), and the wait before sending it again ended: %w", last[j], ctx.Err()))
			})
			return
		}
		pending = resend
	}
}

// fail sets errs of the entries of c in set to failure(i, j), for entry j
// of c and index i in the batch.
func (c *batchCall) fail(set uint16, errs []error, failure func(i, j int) error) {
	for j, i := range c.index {
		if set&(1<<j) != 0 {
			errs[i] = failure(i, j)
		}
	}
}

// answer sets errs of the entries of c in pending from the answer of a
// call: sent has the entries sent, failed those refused (wrapped by wrap
// with their index in the batch), and an entry the answer does not name
// fails too: nothing is reported as sent that was not confirmed. It
// returns the entries that failed on the service's side, whose errs it
// leaves to the caller, with their failures in last.
func (c *batchCall) answer(pending, sent uint16, failed []entryFailure, last *[batchEntries]*EntryError, errs []error, wrap func(i int, err error) error) (resend uint16) {
	answered := ^pending | sent // an entry not in this call needs no answer
	for _, f := range failed {
		j, in := entryIndex(f.id, len(c.index))
		if !in || answered&(1<<j) != 0 {
			continue
		}
		answered |= 1 << j
		if !f.err.SenderFault {
			resend |= 1 << j
			last[j] = f.err
			continue
		}
		errs[c.index[j]] = wrap(c.index[j], f.err)
	}
	for j, i := range c.index {
		if answered&(1<<j) == 0 {
			errs[i] = fmt.Errorf("sqs: the batch call to %s did not answer for entry %d: it may or may not have been sent", c.target, j)
		}
	}
	return resend
}

// entryAttempts returns the number of calls in which an entry that fails
// on the service's side is sent at most: r's MaxAttempts, the SDK's
// default (3) for a retryer without a bound, 1 without a retryer.
func entryAttempts(r aws.Retryer) int {
	switch {
	case r == nil:
		return 1
	case r.MaxAttempts() <= 0:
		return retry.DefaultMaxAttempts
	}
	return r.MaxAttempts()
}

// retryDelay returns the back-off of r before sending again an entry
// that failed with err in the call numbered attempt, or false when r
// gives it no more calls.
func retryDelay(r aws.Retryer, attempt int, err *EntryError) (time.Duration, bool) {
	if attempt >= entryAttempts(r) {
		return 0, false
	}
	d, derr := r.RetryDelay(attempt, entryCode{err})
	return d, derr == nil
}

// tried returns the failure err of an entry sent in n calls.
func tried(n int, err *EntryError) error {
	if n == 1 {
		return err
	}
	return fmt.Errorf("tried %d times: %w", n, err)
}

// entryCode gives a retryer the code of an entry's failure as an AWS
// error carries it, so that the SDK's retryer waits longer after a
// throttle code it knows.
type entryCode struct{ err *EntryError }

func (e entryCode) Error() string     { return e.err.Error() }
func (e entryCode) ErrorCode() string { return e.err.Code }
func (e entryCode) Unwrap() error     { return e.err }

// entryIndex reads an entry id of a call of n entries.
func entryIndex(id *string, n int) (int, bool) {
	if id == nil {
		return 0, false
	}
	j, err := strconv.Atoi(*id)
	return j, err == nil && j >= 0 && j < n
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

var _ bus.Batcher = (*Transport)(nil)
