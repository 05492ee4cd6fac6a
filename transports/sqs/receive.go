package sqs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/plugbus/plugbus/bus"
)

// maxBatch is the most messages one SQS batch request carries.
const maxBatch = 10

// entry is one received message, tracked until it is settled.
type entry struct {
	queue    string // URL of the queue it came from
	lane     int    // laneEndpoint or laneInstance
	msg      sqstypes.Message
	handle   string
	deadline time.Time // when its visibility timeout ends; guarded by Transport.mu
	received time.Time // when it was received: SQS keeps it invisible 12 hours from then at most
	given    bool      // handed out by Receive
}

type deleteReq struct {
	e    *entry
	done chan error // buffered: the flusher never blocks on it
}

// The endpoint's queue and the instance queue are received in separate
// lanes, each holding at most the bus's concurrency of messages, so that
// a busy endpoint never keeps replies waiting in the instance queue.
const (
	laneEndpoint = iota
	laneInstance
	lanes
)

// start starts the pollers, the heartbeat and the delete flushers once.
// Called with t.mu held.
func (t *Transport) start() {
	if t.running {
		return
	}
	t.running = true
	for lane := range t.buf {
		t.buf[lane] = make(chan *entry, t.capacity)
	}
	t.pollCtx, t.pollCancel = context.WithCancel(context.Background())
	t.hbStop = make(chan struct{})
	t.deletes = make(chan *deleteReq, lanes*t.capacity)
	if t.queueURL != "" {
		pollers := min(max((t.capacity+maxBatch-1)/maxBatch, 1), 8)
		for range pollers {
			t.pollers.Go(func() { t.poll(t.queueURL, laneEndpoint) })
		}
	}
	if t.instURL != "" {
		t.pollers.Go(func() { t.poll(t.instURL, laneInstance) })
	}
	t.workers.Go(t.heartbeat)
	for range t.o.deleteFlushers {
		t.workers.Go(t.flushDeletes)
	}
}

// Receive returns the next message of the endpoint's queue or of the
// instance queue. Messages are fetched by long polling in batches of up to
// 10; each queue's lane holds no more at once (buffered or being handled)
// than the bus's concurrency. A message the transport cannot read comes
// back with Delivery.Err set.
func (t *Transport) Receive(ctx context.Context) (*bus.Delivery, error) {
	bufs, err := t.buffers(ctx, false)
	if err != nil {
		return nil, err
	}
	return t.take(ctx, bufs[laneEndpoint], bufs[laneInstance])
}

// ReceiveInstance returns the next message of the instance queue alone
// (bus.InstanceReceiver): the bus reads it with a receive loop of its own
// beside its handler workers, so a handler waiting for a reply never keeps
// that reply from being received. Receive may return messages of the
// instance queue too.
func (t *Transport) ReceiveInstance(ctx context.Context) (*bus.Delivery, error) {
	bufs, err := t.buffers(ctx, true)
	if err != nil {
		return nil, err
	}
	return t.take(ctx, nil, bufs[laneInstance])
}

// buffers starts the pollers once and returns the lanes' buffers.
func (t *Transport) buffers(ctx context.Context, instance bool) ([lanes]chan *entry, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.closed:
		return [lanes]chan *entry{}, bus.ErrClosed
	case instance && t.instURL == "":
		return [lanes]chan *entry{}, errors.New("sqs: ReceiveInstance without an instance queue: Setup with Topology.Instance first")
	case t.queueURL == "" && t.instURL == "":
		return [lanes]chan *entry{}, ErrNotSetUp
	}
	t.start()
	return t.buf, ctx.Err()
}

// take hands out the next entry of endpoint or instance (a nil channel is
// never ready). A re-sent copy that is not due yet is sent on for the
// rest of its delay instead (delay.go).
func (t *Transport) take(ctx context.Context, endpoint, instance chan *entry) (*bus.Delivery, error) {
	for {
		var e *entry
		select {
		case e = <-endpoint:
		case e = <-instance:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.closedCh:
			return nil, bus.ErrClosed
		}
		d := &bus.Delivery{Token: e}
		due := t.carry(ctx, d, decodeCarried(ctx, t.log, e.msg, d))
		t.mu.Lock()
		if t.closed { // Close gives it back with everything else it tracks
			t.mu.Unlock()
			return nil, bus.ErrClosed
		}
		if due.IsZero() {
			e.given = true
			t.mu.Unlock()
			return d, nil
		}
		t.untrack(e)
		t.mu.Unlock()
		t.hop(ctx, e, d, due)
	}
}

// reserve waits for free slots of lane and reserves up to maxBatch of
// them. It returns 0 when the transport closes.
func (t *Transport) reserve(lane int) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	for !t.closed && t.capacity-t.held[lane]-t.reserved[lane] <= 0 {
		t.cond.Wait()
	}
	if t.closed {
		return 0
	}
	n := min(t.capacity-t.held[lane]-t.reserved[lane], maxBatch)
	t.reserved[lane] += n
	return n
}

// poll receives messages of the queue at url while the transport is open.
func (t *Transport) poll(url string, lane int) {
	failures := 0 // receives failed in a row
	for {
		n := t.reserve(lane)
		if n == 0 {
			return
		}
		out, err := t.sqs.ReceiveMessage(t.pollCtx, &awssqs.ReceiveMessageInput{
			QueueUrl:                    &url,
			MaxNumberOfMessages:         int32(n),
			WaitTimeSeconds:             int32(t.o.wait / time.Second),
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll},
		})
		now := time.Now()
		t.mu.Lock()
		t.reserved[lane] -= n
		if err == nil {
			for _, m := range out.Messages {
				e := &entry{queue: url, lane: lane, msg: m, handle: aws.ToString(m.ReceiptHandle), deadline: now.Add(t.o.visibility), received: now}
				t.tracked[e] = struct{}{}
				t.held[lane]++
				t.buf[lane] <- e // never blocks: a lane's tracked messages never exceed its buffer's capacity
			}
		}
		t.cond.Broadcast()
		closed := t.closed
		t.mu.Unlock()
		if err == nil {
			failures = 0
			continue
		}
		if closed || t.pollCtx.Err() != nil {
			return
		}
		failures++
		backoff := bus.Backoff{Initial: 100 * time.Millisecond, Max: 5 * time.Second}.Delay(failures)
		t.log.Warn("receiving from SQS failed; retrying", slog.String("queue_url", url), slog.Any("error", err), slog.Duration("backoff", backoff),
			slog.Time("retry_at", time.Now().Add(backoff)))
		timer := time.NewTimer(backoff)
		select {
		case <-timer.C:
		case <-t.closedCh:
			timer.Stop()
		}
	}
}

// heartbeat extends the visibility timeout of the messages still tracked
// before it ends, so that a message being handled is not delivered again.
func (t *Transport) heartbeat() {
	tick := max(t.o.visibility/4, 200*time.Millisecond)
	ticker := time.NewTicker(tick)
	defer ticker.Stop()
	for {
		select {
		case <-t.hbStop:
			return
		case <-ticker.C:
		}
		t.extend()
	}
}

// extend runs one heartbeat round.
func (t *Transport) extend() {
	t.hbMu.Lock()
	defer t.hbMu.Unlock()
	now := time.Now()
	var due []*entry
	t.mu.Lock()
	for e := range t.tracked {
		if e.deadline.Sub(now) < t.o.visibility/2 {
			due = append(due, e)
		}
	}
	t.mu.Unlock()
	secs := int32(t.o.visibility / time.Second)
	for _, due := range byQueue(due, func(e *entry) string { return e.queue }) {
		t.extendQueue(due, now, secs)
	}
}

// byQueue splits items by the queue URL key returns, keeping their order.
func byQueue[T any](items []T, key func(T) string) [][]T {
	if len(items) == 0 {
		return nil
	}
	first := key(items[0])
	same := true
	for _, it := range items[1:] {
		if key(it) != first {
			same = false
			break
		}
	}
	if same {
		return [][]T{items}
	}
	var order []string
	groups := map[string][]T{}
	for _, it := range items {
		k := key(it)
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], it)
	}
	out := make([][]T, len(order))
	for i, k := range order {
		out[i] = groups[k]
	}
	return out
}

// extendQueue extends the visibility of due, entries of one queue.
func (t *Transport) extendQueue(due []*entry, now time.Time, secs int32) {
	url := due[0].queue
	for len(due) > 0 {
		n := min(len(due), maxBatch)
		batch := due[:n]
		due = due[n:]
		entries := make([]sqstypes.ChangeMessageVisibilityBatchRequestEntry, n)
		for i, e := range batch {
			entries[i] = sqstypes.ChangeMessageVisibilityBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: aws.String(e.handle), VisibilityTimeout: secs}
		}
		ctx, cancel := context.WithTimeout(context.Background(), t.o.visibility/2)
		out, err := t.sqs.ChangeMessageVisibilityBatch(ctx, &awssqs.ChangeMessageVisibilityBatchInput{QueueUrl: &url, Entries: entries})
		cancel()
		if err != nil {
			t.log.Warn("extending the visibility of messages being handled failed; they may be delivered again", slog.Int("messages", n), slog.Any("error", err))
			continue
		}
		failed := make(map[string]sqstypes.BatchResultErrorEntry, len(out.Failed))
		for _, f := range out.Failed {
			failed[aws.ToString(f.Id)] = f
		}
		t.mu.Lock()
		for i, e := range batch {
			f, bad := failed[strconv.Itoa(i)]
			_, held := t.tracked[e]
			switch {
			case !bad:
				e.deadline = now.Add(t.o.visibility)
			case held: // a message settled meanwhile needs no extension
				t.log.Warn("extending the visibility of a message being handled failed; it may be delivered again",
					slog.String("code", aws.ToString(f.Code)), slog.String("reason", aws.ToString(f.Message)))
			}
		}
		t.mu.Unlock()
	}
}

// settle stops tracking the entry of d. Settlement of a delivery not
// tracked (settled twice) fails, and so does any settlement once Close
// began (with an error wrapping bus.ErrClosed).
func (t *Transport) settle(d *bus.Delivery, op string) (*entry, error) {
	e, _ := d.Token.(*entry)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		// Close waits for the settlements that began before it, then
		// stops the delete flushers and gives every unsettled message back:
		// one beginning now would wait for them forever.
		return nil, fmt.Errorf("sqs: %s %s (id %s): %w: the transport gives the message back to the queue as it closes", op, d.Name, d.Attributes.MessageID, bus.ErrClosed)
	}
	if _, ok := t.tracked[e]; !ok || e == nil || !e.given {
		return nil, fmt.Errorf("sqs: %s %s (id %s): the delivery is not in flight on this transport (settled twice?)", op, d.Name, d.Attributes.MessageID)
	}
	t.untrack(e)
	return e, nil
}

// untrack stops tracking e, whose settlement begins. Called with t.mu held.
func (t *Transport) untrack(e *entry) {
	delete(t.tracked, e)
	t.held[e.lane]--
	t.ops.Add(1)
	t.cond.Broadcast()
}

// Delete deletes d from the queue. Deletes are sent in batches of up to
// 10: a delete joins the batch being gathered while an earlier one is in
// flight, so a lone delete goes out at once and busy consumers share
// requests. Delete returns when its batch is answered.
func (t *Transport) Delete(ctx context.Context, d *bus.Delivery) error {
	e, err := t.settle(d, "delete")
	if err != nil {
		return err
	}
	if err := t.deleteEntry(ctx, e); err != nil {
		return fmt.Errorf("sqs: delete %s (id %s): %w", d.Name, d.Attributes.MessageID, err)
	}
	return nil
}

// deleteEntry queues the delete of a settled entry and waits for its
// batch, or for ctx to end (the delete is still sent).
func (t *Transport) deleteEntry(ctx context.Context, e *entry) error {
	req := &deleteReq{e: e, done: make(chan error, 1)}
	t.deletes <- req // the flushers run until every settlement ended
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// flushDeletes sends the queued deletes in batches.
func (t *Transport) flushDeletes() {
	batch := make([]*deleteReq, 0, maxBatch)
	for {
		select {
		case req := <-t.deletes:
			batch = append(batch[:0], req)
		case <-t.hbStop:
			return
		}
	gather:
		for len(batch) < maxBatch {
			select {
			case req := <-t.deletes:
				batch = append(batch, req)
			default:
				break gather
			}
		}
		t.deleteBatch(batch)
	}
}

func (t *Transport) deleteBatch(batch []*deleteReq) {
	for _, b := range byQueue(batch, func(r *deleteReq) string { return r.e.queue }) {
		t.deleteQueueBatch(b)
	}
}

// deleteQueueBatch deletes a batch of messages of one queue.
func (t *Transport) deleteQueueBatch(batch []*deleteReq) {
	defer t.ops.Add(-len(batch))
	url := batch[0].e.queue
	entries := make([]sqstypes.DeleteMessageBatchRequestEntry, len(batch))
	for i, r := range batch {
		entries[i] = sqstypes.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: aws.String(r.e.handle)}
	}
	// A message whose visibility timeout ended before its delete (the
	// heartbeat could not extend it) may have been received again, by
	// this or another consumer: SQS then answers a delete with the receipt
	// handle of the earlier receive with success, and removes nothing.
	now := time.Now()
	lapsed := make([]bool, len(batch))
	t.mu.Lock()
	for i, r := range batch {
		lapsed[i] = !r.e.deadline.After(now)
	}
	t.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := t.sqs.DeleteMessageBatch(ctx, &awssqs.DeleteMessageBatchInput{QueueUrl: &url, Entries: entries})
	if err != nil {
		for _, r := range batch {
			r.done <- err
		}
		return
	}
	failed := make(map[string]error, len(out.Failed))
	for _, f := range out.Failed {
		failed[aws.ToString(f.Id)] = fmt.Errorf("SQS refused the delete: %s: %s (the message will be delivered again)", aws.ToString(f.Code), aws.ToString(f.Message))
	}
	for i, r := range batch {
		err := failed[strconv.Itoa(i)]
		if err == nil && lapsed[i] {
			err = fmt.Errorf("its visibility timeout ended %v before the delete (extending it had failed): SQS may have delivered it again, to this or another consumer, and then a delete with the receipt handle of this receive does not remove it",
				now.Sub(r.e.deadline).Round(time.Millisecond))
		}
		r.done <- err
	}
}

// Return gives d back to the queue at once (its visibility timeout set to
// zero), and its next delivery has the attempt count SQS keeps
// (ApproximateReceiveCount). A retry after a delay is [Transport.ReturnAfter]:
// the bus's retry policy decides which (bus.RetryPolicy).
func (t *Transport) Return(ctx context.Context, d *bus.Delivery, cause error) error {
	e, err := t.settle(d, "return")
	if err != nil {
		return err
	}
	defer t.ops.Done()
	t.hbMu.RLock()
	_, err = t.sqs.ChangeMessageVisibility(context.WithoutCancel(ctx), &awssqs.ChangeMessageVisibilityInput{
		QueueUrl: &e.queue, ReceiptHandle: &e.handle, VisibilityTimeout: 0,
	})
	t.hbMu.RUnlock()
	if err != nil {
		return fmt.Errorf("sqs: return %s (id %s): changing its visibility failed; it will be delivered again after the visibility timeout: %w", d.Name, d.Attributes.MessageID, err)
	}
	if t.log.Enabled(ctx, slog.LevelDebug) {
		t.log.DebugContext(ctx, "message returned", slog.String("message_id", d.Attributes.MessageID), slog.Int("attempt", d.Attempt), slog.Any("cause", cause))
	}
	return nil
}

// Fail moves d to the endpoint's dead-letter queue: the same body and
// attributes, with f added to the "plugbus" attribute, then deletes it
// from the queue. A message of the instance queue goes to the endpoint's
// dead-letter queue too; on a transport without an endpoint (an instance
// queue alone, no dead-letter queue) it is logged at error level with its
// failure and body, and deleted. When the dead-letter queue refuses it, d
// stays on its queue and comes back after its visibility timeout; the
// endpoint queue's redrive policy dead-letters it after MaxAttempts
// receives in any case.
func (t *Transport) Fail(ctx context.Context, d *bus.Delivery, f bus.Failure) error {
	e, err := t.settle(d, "fail")
	if err != nil {
		return err
	}
	if t.dlqURL == "" {
		t.log.ErrorContext(ctx, "message of the instance queue failed and there is no endpoint dead-letter queue: dropped",
			slog.String("queue_url", e.queue), slog.String("message_name", d.Name), slog.String("message_id", d.Attributes.MessageID),
			slog.String("reason", f.Reason), slog.Int("attempts", f.Attempts), slog.String("body", aws.ToString(e.msg.Body)))
		if err := t.deleteEntry(ctx, e); err != nil {
			return fmt.Errorf("sqs: fail %s (id %s): deleting it failed, so it will be delivered again: %w", d.Name, d.Attributes.MessageID, err)
		}
		return nil
	}
	if err := t.deadLetter(context.WithoutCancel(ctx), t.dlqURL, e.msg, f); err != nil {
		t.ops.Done()
		return fmt.Errorf("sqs: fail %s (id %s): %w", d.Name, d.Attributes.MessageID, err)
	}
	if err := t.deleteEntry(ctx, e); err != nil {
		return fmt.Errorf("sqs: fail %s (id %s): the message is in the dead-letter queue but deleting it from its queue failed, so it will be delivered again: %w", d.Name, d.Attributes.MessageID, err)
	}
	return nil
}

// Close stops receiving. It waits for the receive requests in progress to
// end (at most the wait time, or until ctx ends, when they are cancelled)
// and for settlements in progress, then gives every message received and
// not settled back to the queue at once (visibility timeout 0). Receive
// returns bus.ErrClosed afterwards.
func (t *Transport) Close(ctx context.Context) error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	close(t.closedCh)
	t.cond.Broadcast()
	running := t.running
	inst := t.instURL
	t.mu.Unlock()
	var errs []error
	if inst != "" {
		defer func() {
			if err := t.deleteQueue(context.WithoutCancel(ctx), inst); err != nil {
				t.log.Warn("deleting the instance queue failed", slog.Any("error", err))
			}
		}()
	}
	if !running {
		return nil
	}
	if !waitCtx(ctx, &t.pollers) {
		t.pollCancel()
		t.pollers.Wait()
		errs = append(errs, fmt.Errorf("sqs: close: receive requests cancelled; messages they received stay invisible until their visibility timeout: %w", ctx.Err()))
	}
	t.pollCancel()
	t.ops.Wait() // settlements end on their own: their requests do not depend on ctx
	close(t.hbStop)
	t.workers.Wait()

	t.mu.Lock()
	var back []*entry
	for e := range t.tracked {
		if e.queue != inst { // the instance queue is about to go
			back = append(back, e)
		}
	}
	clear(t.tracked)
	t.held = [lanes]int{}
	t.mu.Unlock()
	if err := t.release(context.WithoutCancel(ctx), back); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// release makes entries visible again at once.
func (t *Transport) release(ctx context.Context, back []*entry) error {
	var errs []error
	for len(back) > 0 {
		n := min(len(back), maxBatch)
		entries := make([]sqstypes.ChangeMessageVisibilityBatchRequestEntry, n)
		for i, e := range back[:n] {
			entries[i] = sqstypes.ChangeMessageVisibilityBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: aws.String(e.handle), VisibilityTimeout: 0}
		}
		back = back[n:]
		out, err := t.sqs.ChangeMessageVisibilityBatch(ctx, &awssqs.ChangeMessageVisibilityBatchInput{QueueUrl: &t.queueURL, Entries: entries})
		if err != nil {
			errs = append(errs, fmt.Errorf("sqs: close: giving %d unsettled messages back failed; they come back after their visibility timeout: %w", n, err))
			continue
		}
		for _, f := range out.Failed {
			errs = append(errs, fmt.Errorf("sqs: close: giving a message back failed (%s: %s); it comes back after its visibility timeout", aws.ToString(f.Code), aws.ToString(f.Message)))
		}
	}
	return errors.Join(errs...)
}

// waitCtx waits for wg, or for ctx to end. It reports whether wg finished.
func waitCtx(ctx context.Context, wg interface{ Wait() }) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}
