package bus

import (
	"cmp"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/plugbus/plugbus/internal/memorybackend"
)

// This file is the in-process transport. Its public home, with its
// documentation, is package transports/memory, which reaches it through
// internal/memorybackend; it lives here, unexported, so that it can be the
// default transport of [New] (bus cannot import transports/memory, which
// imports bus).

func init() {
	memorybackend.NewBroker = func() any { return newMemBroker() }
	memorybackend.NewTransport = func(broker any) any { return newMemTransport(broker.(*memBroker)) }
}

// memBroker holds the endpoint queues, the subscriptions of endpoints to
// message names, and the dead-letter queues of the transports made from it.
type memBroker struct {
	mu     sync.Mutex
	queues map[string]*memQueue
	subs   map[string]map[string]struct{} // message name → endpoints
	dead   map[string][]*DeadLetter
	gone   map[string]struct{} // instance queues of closed transports
	// instance marks the instance queues, which Endpoints leaves out.
	instance map[string]bool
	deadSeq  uint64 // numbers the dead letters: their IDs

	// Delayed items wait in a heap by due time; one timer, set for the
	// earliest, puts the due ones back into their queues. No goroutine
	// waits while nothing is due.
	delayMu sync.Mutex
	delayed memDelayHeap
	timer   *time.Timer
}

func newMemBroker() *memBroker {
	return &memBroker{queues: map[string]*memQueue{}, subs: map[string]map[string]struct{}{}, dead: map[string][]*DeadLetter{}, gone: map[string]struct{}{}, instance: map[string]bool{}}
}

func (br *memBroker) queue(endpoint string) *memQueue {
	br.mu.Lock()
	defer br.mu.Unlock()
	return br.queueLocked(endpoint)
}

// sendQueue is queue for a send: gone reports (with no queue) the instance
// queue of a closed transport, whose messages are dropped.
func (br *memBroker) sendQueue(endpoint string) (q *memQueue, gone bool) {
	br.mu.Lock()
	defer br.mu.Unlock()
	if _, gone := br.gone[endpoint]; gone {
		return nil, true
	}
	return br.queueLocked(endpoint), false
}

// existingQueue is endpoint's queue, nil when it has none: reading a
// figure of an endpoint does not make it one.
func (br *memBroker) existingQueue(endpoint string) *memQueue {
	br.mu.Lock()
	defer br.mu.Unlock()
	return br.queues[endpoint]
}

func (br *memBroker) queueLocked(endpoint string) *memQueue {
	q := br.queues[endpoint]
	if q == nil {
		q = &memQueue{signal: make(chan struct{}, 1)}
		br.queues[endpoint] = q
	}
	return q
}

// DeadLetters returns the messages dead-lettered by endpoint, oldest first.
func (br *memBroker) DeadLetters(endpoint string) []DeadLetter {
	br.mu.Lock()
	defer br.mu.Unlock()
	dead := br.dead[endpoint]
	out := make([]DeadLetter, len(dead))
	for i, dl := range dead {
		out[i] = *dl
	}
	return out
}

// Depth returns how many messages wait in endpoint's queue, not counting
// those in flight.
func (br *memBroker) Depth(endpoint string) int {
	q := br.existingQueue(endpoint)
	if q == nil {
		return 0
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items) - q.head
}

type memItem struct {
	env     Envelope
	attempt int
	retries *RetryHistory // nil until the message failed: most never do
	q       *memQueue     // where it came from
	seq     uint64        // receive order, to put in-flight items back in order
}

// memQueue is an unbounded FIFO with a one-token wake-up signal passed on
// from receiver to receiver while items remain.
type memQueue struct {
	mu     sync.Mutex
	items  []*memItem
	head   int
	signal chan struct{}
	popped uint64 // messages delivered from the queue, ever
}

func (q *memQueue) push(it *memItem, front bool) {
	q.mu.Lock()
	if front && q.head > 0 {
		q.head--
		q.items[q.head] = it
	} else if front {
		q.items = slices.Insert(q.items, 0, it)
	} else {
		q.items = append(q.items, it)
	}
	q.mu.Unlock()
	q.wake()
}

// pushAll appends items under one lock.
func (q *memQueue) pushAll(items []*memItem) {
	q.mu.Lock()
	q.items = append(q.items, items...)
	q.mu.Unlock()
	q.wake()
}

func (q *memQueue) popOrNil() *memItem {
	if q == nil {
		return nil
	}
	return q.pop()
}

func (q *memQueue) pop() *memItem {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.head == len(q.items) {
		return nil
	}
	it := q.items[q.head]
	q.items[q.head] = nil
	q.head++
	q.popped++
	switch {
	case q.head == len(q.items):
		q.items, q.head = q.items[:0], 0
	case q.head >= 1024 && q.head > len(q.items)/2: // a backlog that never drains: compact
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items, q.head = q.items[:n], 0
		q.wake()
	default:
		q.wake()
	}
	return it
}

// wakeIfWaiting passes the wake-up token on when items wait, for a receiver
// that took it but leaves without popping.
func (q *memQueue) wakeIfWaiting() {
	if q == nil {
		return
	}
	q.mu.Lock()
	waiting := q.head < len(q.items)
	q.mu.Unlock()
	if waiting {
		q.wake()
	}
}

func (q *memQueue) wake() {
	select {
	case q.signal <- struct{}{}:
	default:
	}
}

// memTransport is a [Transport] over a memBroker; transports/memory
// documents its behaviour.
type memTransport struct {
	broker *memBroker

	mu       sync.Mutex
	endpoint string
	q        *memQueue // the endpoint's queue
	iq       *memQueue // this instance's queue
	iaddr    string
	inflight map[*memItem]struct{}
	seq      uint64
	closed   chan struct{}
	isClosed bool
}

func newMemTransport(broker *memBroker) *memTransport {
	return &memTransport{broker: broker, inflight: map[*memItem]struct{}{}, closed: make(chan struct{})}
}

// Setup binds the transport to the endpoint's queue and subscribes it to
// the published messages it handles.
func (t *memTransport) Setup(_ context.Context, topo Topology) error {
	if topo.Endpoint == "" && !topo.Instance {
		return errors.New("memory: Setup: empty endpoint")
	}
	if topo.Instance {
		t.mu.Lock()
		if t.iq == nil {
			t.iaddr = "instance." + newID()
			if topo.Endpoint != "" {
				t.iaddr = topo.Endpoint + "." + t.iaddr
			}
			t.iq = t.broker.queue(t.iaddr)
			t.broker.mu.Lock()
			t.broker.instance[t.iaddr] = true
			t.broker.mu.Unlock()
		}
		t.mu.Unlock()
	}
	if topo.Endpoint == "" {
		return nil
	}
	q := t.broker.queue(topo.Endpoint)
	t.broker.mu.Lock()
	for _, name := range topo.Handles {
		s := t.broker.subs[name]
		if s == nil {
			s = map[string]struct{}{}
			t.broker.subs[name] = s
		}
		s[topo.Endpoint] = struct{}{}
	}
	t.broker.mu.Unlock()
	t.mu.Lock()
	t.endpoint, t.q = topo.Endpoint, q
	t.mu.Unlock()
	return nil
}

func (t *memTransport) check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.isClosed {
		return ErrClosed
	}
	return nil
}

func copyEnvelope(env *Envelope) Envelope {
	c := *env
	if len(env.Headers) > 0 {
		c.Headers = maps.Clone(env.Headers)
	}
	return c
}

// CopiesEnvelopes implements [EnvelopeCopier]: Send and Publish queue a
// copy of the envelope.
func (t *memTransport) CopiesEnvelopes() bool { return true }

// Send puts env on the queue of the endpoint named to; an env.Due ahead
// waits in the broker's delay heap until then.
func (t *memTransport) Send(ctx context.Context, env *Envelope, to string) error {
	if err := t.check(ctx); err != nil {
		return err
	}
	if to == "" {
		return fmt.Errorf("memory: send %s: %w: no destination", env.Name, ErrNoRoute)
	}
	q, gone := t.broker.sendQueue(to)
	if gone {
		return nil // the instance that asked is gone: like RabbitMQ and SQS, drop it
	}
	t.broker.enqueue(&memItem{env: copyEnvelope(env), attempt: 1, q: q}, env.Due)
	return nil
}

// enqueue puts it into its queue, or into the delay heap when due lies
// ahead.
func (br *memBroker) enqueue(it *memItem, due time.Time) {
	if !due.IsZero() && time.Until(due) > 0 {
		br.delay(it, due)
		return
	}
	it.q.push(it, false)
}

// Publish puts env on the queue of every endpoint subscribed to env.Name
// (subscribed now, when a due time lies ahead: each copy then waits in the
// broker's delay heap).
func (t *memTransport) Publish(ctx context.Context, env *Envelope) error {
	if err := t.check(ctx); err != nil {
		return err
	}
	t.broker.mu.Lock()
	var endpoints [8]string
	dests := endpoints[:0]
	for e := range t.broker.subs[env.Name] {
		dests = append(dests, e)
	}
	t.broker.mu.Unlock()
	for _, e := range dests {
		q := t.broker.queue(e)
		t.broker.enqueue(&memItem{env: copyEnvelope(env), attempt: 1, q: q}, env.Due)
	}
	return nil
}

// SendBatch implements [Batcher]: it resolves every message's queues
// under one lock of the broker and puts each queue's share of the batch
// on it under one lock of that queue, in batch order. A message with no
// destination fails alone; an Envelope.Due ahead waits in the delay heap.
func (t *memTransport) SendBatch(ctx context.Context, batch []Outbound) error {
	if err := t.check(ctx); err != nil {
		return err
	}
	var failures []BatchFailure
	items := make([]memItem, 0, len(batch)) // one allocation for the batch's sends
	var pushes []memPush
	t.broker.mu.Lock()
	for i, m := range batch {
		if m.Kind == KindPublish {
			for e := range t.broker.subs[m.Envelope.Name] {
				pushes = appendPush(pushes, &memItem{env: copyEnvelope(m.Envelope), attempt: 1, q: t.broker.queueLocked(e)}, m.Envelope.Due)
			}
			continue
		}
		if m.Destination == "" {
			failures = append(failures, BatchFailure{Index: i, Err: fmt.Errorf("memory: send %s: %w: no destination", m.Envelope.Name, ErrNoRoute)})
			continue
		}
		if _, gone := t.broker.gone[m.Destination]; gone {
			continue // as Send: the instance that asked is gone
		}
		items = append(items, memItem{env: copyEnvelope(m.Envelope), attempt: 1, q: t.broker.queueLocked(m.Destination)})
		pushes = appendPush(pushes, &items[len(items)-1], m.Envelope.Due)
	}
	t.broker.mu.Unlock()
	for i := range pushes {
		p := &pushes[i]
		if p.due {
			for _, it := range p.items {
				t.broker.enqueue(it.it, it.due)
			}
			continue
		}
		p.q.pushAll(p.now)
	}
	if failures != nil {
		return &BatchError{Len: len(batch), Failures: failures}
	}
	return nil
}

// memPush is the share of a batch for one queue (now), or the batch's
// delayed items (due).
type memPush struct {
	q     *memQueue
	now   []*memItem
	due   bool
	items []memDelayed
}

// appendPush adds it to the share of its queue in pushes, or to the
// delayed share when due lies ahead. Batches go to few queues: a linear
// search beats a map.
func appendPush(pushes []memPush, it *memItem, due time.Time) []memPush {
	if !due.IsZero() && time.Until(due) > 0 {
		for i := range pushes {
			if pushes[i].due {
				pushes[i].items = append(pushes[i].items, memDelayed{it: it, due: due})
				return pushes
			}
		}
		return append(pushes, memPush{due: true, items: []memDelayed{{it: it, due: due}}})
	}
	for i := range pushes {
		if !pushes[i].due && pushes[i].q == it.q {
			pushes[i].now = append(pushes[i].now, it)
			return pushes
		}
	}
	return append(pushes, memPush{q: it.q, now: []*memItem{it}})
}

// InstanceAddress returns the destination of this transport's own queue,
// made by Setup with Topology.Instance.
func (t *memTransport) InstanceAddress() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.iaddr
}

// Receive takes the next message of the endpoint's queue or of the
// instance's queue.
func (t *memTransport) Receive(ctx context.Context) (*Delivery, error) {
	t.mu.Lock()
	q, iq := t.q, t.iq
	t.mu.Unlock()
	return t.receive(ctx, q, iq)
}

// ReceiveInstance takes the next message of the instance's queue.
func (t *memTransport) ReceiveInstance(ctx context.Context) (*Delivery, error) {
	t.mu.Lock()
	iq := t.iq
	t.mu.Unlock()
	if iq == nil {
		return nil, errors.New("memory: ReceiveInstance without an instance queue: Setup with Topology.Instance first")
	}
	return t.receive(ctx, nil, iq)
}

func (t *memTransport) receive(ctx context.Context, q, iq *memQueue) (*Delivery, error) {
	if q == nil && iq == nil {
		return nil, errors.New("memory: Receive before Setup")
	}
	var qsig, isig chan struct{} // nil: never ready
	if q != nil {
		qsig = q.signal
	}
	if iq != nil {
		isig = iq.signal
	}
	// leave passes the wake-up this receiver may hold to another one.
	leave := func(err error) (*Delivery, error) {
		q.wakeIfWaiting()
		iq.wakeIfWaiting()
		return nil, err
	}
	for {
		if err := t.check(ctx); err != nil {
			return leave(err)
		}
		it := iq.popOrNil()
		if it != nil {
			// The wake-up that brought this receiver here may have been
			// the endpoint queue's: pass it on, or a message there waits
			// while other receivers sleep.
			q.wakeIfWaiting()
		} else {
			it = q.popOrNil()
		}
		if it != nil {
			t.mu.Lock()
			if t.isClosed {
				t.mu.Unlock()
				it.q.push(it, true)
				return nil, ErrClosed
			}
			t.seq++
			it.seq = t.seq
			t.inflight[it] = struct{}{}
			t.mu.Unlock()
			d := &Delivery{Envelope: it.env, Attempt: it.attempt, Raw: it, Token: it}
			if it.retries != nil {
				d.Retries = *it.retries
			}
			return d, nil
		}
		select {
		case <-qsig:
		case <-isig:
		case <-ctx.Done():
			return leave(ctx.Err())
		case <-t.closed:
			return leave(ErrClosed)
		}
	}
}

// settle removes d from the in-flight set.
func (t *memTransport) settle(d *Delivery) (*memItem, error) {
	it, _ := d.Token.(*memItem)
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.inflight[it]; !ok || it == nil {
		if t.isClosed {
			return nil, fmt.Errorf("memory: settling %s (id %s): %w; the message was put back and will be delivered again", d.Name, d.Attributes.MessageID, ErrClosed)
		}
		return nil, fmt.Errorf("memory: delivery of %s (id %s) is not in flight on this transport", d.Name, d.Attributes.MessageID)
	}
	delete(t.inflight, it)
	return it, nil
}

// Delete acknowledges d.
func (t *memTransport) Delete(_ context.Context, d *Delivery) error {
	_, err := t.settle(d)
	return err
}

// Return puts d back at the tail of the queue with its attempt raised.
func (t *memTransport) Return(_ context.Context, d *Delivery, _ error) error {
	it, err := t.settle(d)
	if err != nil {
		return err
	}
	it.q.push(&memItem{env: it.env, attempt: it.attempt + 1, retries: retriesOf(d), q: it.q}, false)
	return nil
}

// ReturnAfter gives d back to its queue with its attempt raised, no
// earlier than delay from now. The delay is a timer of the broker: it
// does not survive the process.
func (t *memTransport) ReturnAfter(_ context.Context, d *Delivery, _ error, delay time.Duration) error {
	it, err := t.settle(d)
	if err != nil {
		return err
	}
	next := &memItem{env: it.env, attempt: it.attempt + 1, retries: retriesOf(d), q: it.q}
	if delay <= 0 {
		it.q.push(next, false)
		return nil
	}
	t.broker.delay(next, time.Now().Add(delay))
	return nil
}

// retriesOf returns d's retry history to keep with its next delivery, nil
// when it is empty.
func retriesOf(d *Delivery) *RetryHistory {
	if d.Retries.IsZero() {
		return nil
	}
	h := d.Retries
	return &h
}

// MaxDelay is the longest time.Duration: a timer carries any delay.
func (t *memTransport) MaxDelay() time.Duration { return math.MaxInt64 }

// delay puts it into the heap until due, setting the timer when it is
// the earliest.
func (br *memBroker) delay(it *memItem, due time.Time) {
	br.delayMu.Lock()
	defer br.delayMu.Unlock()
	heap.Push(&br.delayed, memDelayed{it: it, due: due})
	if br.delayed[0].it != it {
		return // the timer is set for an earlier item
	}
	if br.timer == nil {
		br.timer = time.AfterFunc(time.Until(due), br.releaseDue)
	} else {
		br.timer.Reset(time.Until(due))
	}
}

// releaseDue puts every due item back into its queue and sets the timer
// for the next.
func (br *memBroker) releaseDue() {
	br.delayMu.Lock()
	now := time.Now()
	var due []*memItem
	for len(br.delayed) > 0 && !br.delayed[0].due.After(now) {
		due = append(due, heap.Pop(&br.delayed).(memDelayed).it)
	}
	if len(br.delayed) > 0 {
		br.timer.Reset(time.Until(br.delayed[0].due))
	}
	// Into their queues before the lock is let go: a message is always in
	// the heap or in a queue, never between (bustest's WaitIdle counts both).
	for _, it := range due {
		it.q.push(it, false)
	}
	br.delayMu.Unlock()
}

// Delayed returns how many delayed messages wait in the broker.
func (br *memBroker) Delayed() int {
	br.delayMu.Lock()
	defer br.delayMu.Unlock()
	return len(br.delayed)
}

// memDelayed is a delayed item and when it is due.
type memDelayed struct {
	it  *memItem
	due time.Time
}

// memDelayHeap orders delayed items by due time (container/heap).
type memDelayHeap []memDelayed

func (h memDelayHeap) Len() int           { return len(h) }
func (h memDelayHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h memDelayHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *memDelayHeap) Push(x any)        { *h = append(*h, x.(memDelayed)) }
func (h *memDelayHeap) Pop() any {
	old := *h
	d := old[len(old)-1]
	old[len(old)-1] = memDelayed{}
	*h = old[:len(old)-1]
	return d
}

// Fail moves d to the endpoint's dead-letter queue.
func (t *memTransport) Fail(_ context.Context, d *Delivery, f Failure) error {
	it, err := t.settle(d)
	if err != nil {
		return err
	}
	if f.Time.IsZero() {
		f.Time = time.Now().UTC()
	}
	key := t.endpoint
	if key == "" {
		key = t.iaddr // a bus without an endpoint: under the instance's address
	}
	t.broker.mu.Lock()
	t.broker.dead[key] = append(t.broker.dead[key], &DeadLetter{ID: t.broker.deadLetterID(), Envelope: it.env, Failure: f})
	t.broker.mu.Unlock()
	return nil
}

// Close stops receiving and puts deliveries still in flight back at the
// head of the queue.
func (t *memTransport) Close(context.Context) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.isClosed {
		return nil
	}
	t.isClosed = true
	close(t.closed)
	// Put what is in flight back at the head, newest first, so the queue
	// keeps its order. What was in flight from the instance queue goes with
	// it: nobody can receive it any more.
	back := make([]*memItem, 0, len(t.inflight))
	for it := range t.inflight {
		if it.q != t.iq { // every item has its queue: with no instance queue, all go back
			back = append(back, it)
		}
	}
	slices.SortFunc(back, func(a, b *memItem) int { return cmp.Compare(b.seq, a.seq) })
	for _, it := range back {
		it.q.push(it, true)
	}
	clear(t.inflight)
	if t.q != nil {
		t.q.wake()
	}
	if t.iq != nil {
		t.broker.mu.Lock()
		delete(t.broker.queues, t.iaddr)
		delete(t.broker.instance, t.iaddr)
		t.broker.gone[t.iaddr] = struct{}{}
		t.broker.mu.Unlock()
	}
	return nil
}

var (
	_ Transport        = (*memTransport)(nil)
	_ InstanceQueuer   = (*memTransport)(nil)
	_ InstanceReceiver = (*memTransport)(nil)
	_ EnvelopeCopier   = (*memTransport)(nil)
	_ Batcher          = (*memTransport)(nil)
)
