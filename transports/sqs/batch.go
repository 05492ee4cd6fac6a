package sqs

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	awssns "github.com/aws/aws-sdk-go-v2/service/sns"
	snstypes "github.com/aws/aws-sdk-go-v2/service/sns/types"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/plugbus/plugbus/bus"
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
// or connection error); an entry its answer names as failed is not tried
// again, even one that failed on the service's side ([EntryError]
// SenderFault false): the caller sends it again. A message to an
// instance queue that no longer exists is dropped with a warning, as by
// Send.
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
	out, err := t.sqs.SendMessageBatch(ctx, &awssqs.SendMessageBatchInput{QueueUrl: &c.queued[0].url, Entries: entries})
	if err != nil {
		for j, i := range c.index {
			errs[i] = t.sendError(ctx, batch[i].Envelope, batch[i].Destination, c.queued[j], err)
		}
		return
	}
	ok := make([]*string, len(out.Successful))
	for k, e := range out.Successful {
		ok[k] = e.Id
	}
	failed := make([]entryFailure, len(out.Failed))
	for k, f := range out.Failed {
		failed[k] = entryFailure{f.Id, &EntryError{Code: deref(f.Code), Message: deref(f.Message), SenderFault: f.SenderFault}}
	}
	c.answer(ok, failed, errs, func(i int, err error) error {
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
	out, err := t.sns.PublishBatch(ctx, &awssns.PublishBatchInput{TopicArn: &arn, PublishBatchRequestEntries: entries})
	if err != nil {
		for _, i := range c.index {
			errs[i] = fmt.Errorf("sqs: publish %s to topic %s: %w", batch[i].Envelope.Name, arn, err)
		}
		return
	}
	ok := make([]*string, len(out.Successful))
	for k, e := range out.Successful {
		ok[k] = e.Id
	}
	failed := make([]entryFailure, len(out.Failed))
	for k, f := range out.Failed {
		failed[k] = entryFailure{f.Id, &EntryError{Code: deref(f.Code), Message: deref(f.Message), SenderFault: f.SenderFault}}
	}
	c.answer(ok, failed, errs, func(i int, err error) error {
		return fmt.Errorf("sqs: publish %s to topic %s: %w", batch[i].Envelope.Name, arn, err)
	})
}

// entryFailure is an entry a batch call's answer names as failed.
type entryFailure struct {
	id  *string
	err *EntryError
}

// answer sets errs of the entries of c from the call's answer: ok names
// the entries sent, failed those refused (wrapped by wrap with their
// index in the batch), and an entry the answer does not name fails too:
// nothing is reported as sent that was not confirmed.
func (c *batchCall) answer(ok []*string, failed []entryFailure, errs []error, wrap func(i int, err error) error) {
	answered := make([]bool, len(c.index))
	for _, id := range ok {
		if j, in := entryIndex(id, len(c.index)); in {
			answered[j] = true
		}
	}
	for _, f := range failed {
		if j, in := entryIndex(f.id, len(c.index)); in {
			answered[j] = true
			errs[c.index[j]] = wrap(c.index[j], f.err)
		}
	}
	for j, done := range answered {
		if !done {
			errs[c.index[j]] = fmt.Errorf("sqs: the batch call to %s did not answer for entry %d: it may or may not have been sent", c.target, j)
		}
	}
}

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
