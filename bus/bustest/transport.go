package bustest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/memory"
)

// Transport is an in-memory [bus.Transport] for tests that records what
// its bus does with it: every message the bus sent or published through
// it, and how the bus settled each delivery it received (deleted,
// returned for retry, dead-lettered). [Transport.WaitIdle] waits until
// the bus has nothing left to do, so that a test can check what must not
// have happened without sleeping. It is safe for concurrent use.
//
// It keeps what it is given, so it is not a [bus.EnvelopeCopier]: the bus
// hands it envelopes of their own. It has the memory transport's instance
// queues ([bus.InstanceQueuer], [bus.InstanceReceiver]).
type Transport struct {
	memory *memory.Transport
	broker *memory.Broker

	// acting is held from a send, publish or settlement on the memory
	// transport until it is recorded, so that what the act puts on a queue
	// is not received, handled and settled (or its handler's sends made)
	// by another worker, and recorded first.
	acting sync.Mutex

	mu       sync.Mutex
	sent     []Sent
	settled  []Settlement
	changed  chan struct{} // closed, and replaced, when anything above or inFlight changes
	inFlight int           // deliveries received and not yet settled
	endpoint string        // set up by Setup; empty on a send-only bus
	instance string        // the instance queue's address, once set up
	closed   bool

	// A check for idleness pauses receiving: it cancels the receives in
	// progress (a receive that took a message from the queue but has not
	// returned it yet is neither waiting nor in flight) and holds new
	// ones until it is done.
	checking    sync.Mutex                    // one check at a time
	receiving   map[uint64]context.CancelFunc // receives in progress, by number
	lastReceive uint64                        // the number of the last receive
	paused      chan struct{}                 // closed when the check ends; nil when none runs
	drained     chan struct{}                 // closed when the last receive in progress returned during a check
}

// Sent is a message the bus handed to its transport.
type Sent struct {
	// Kind tells a sent message from a published one.
	Kind bus.Kind
	// Destination is the endpoint a sent message went to; empty for a
	// published one.
	Destination string
	// Envelope is the finished message: its name, encoded body,
	// attributes and native headers.
	Envelope bus.Envelope
}

// Outcome is how the bus settled a delivery.
type Outcome uint8

const (
	// Deleted: the message was handled (or handled by incoming
	// middleware, or discarded) and acknowledged.
	Deleted Outcome = iota + 1
	// Returned: the message failed and was returned for retry.
	Returned
	// DeadLettered: the message was moved to the dead-letter queue, after
	// its last attempt or at once (it can never be processed).
	DeadLettered
)

// String implements fmt.Stringer.
func (o Outcome) String() string {
	switch o {
	case Deleted:
		return "deleted"
	case Returned:
		return "returned"
	case DeadLettered:
		return "dead-lettered"
	}
	return fmt.Sprintf("Outcome(%d)", uint8(o))
}

// Settlement is how the bus settled one delivery.
type Settlement struct {
	Outcome Outcome
	// Envelope is the message received.
	Envelope bus.Envelope
	// Attempt is the delivery's attempt, 1 the first time.
	Attempt int
	// Cause is the error the message failed with; set when it was Returned.
	Cause error
	// Delay is how long a Returned message waits before it is delivered
	// again: zero for an immediate retry, the delay the bus asked for a
	// delayed one ([bus.Delayer]).
	Delay time.Duration
	// Failure is what the dead letter was stored with; set when it was
	// DeadLettered.
	Failure bus.Failure
}

// NewTransport returns a recording transport over a memory transport made
// with opts: give it [memory.WithBroker] to exchange messages with other
// buses of the test.
func NewTransport(opts ...memory.Option) *Transport {
	m := memory.New(opts...)
	return &Transport{memory: m, broker: m.Broker(), changed: make(chan struct{}), receiving: make(map[uint64]context.CancelFunc)}
}

// Sent returns the messages sent and published through the transport, in
// the order the memory transport accepted them.
func (t *Transport) Sent() []Sent {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.sent)
}

// Settled returns the settlements of the deliveries the bus received, in
// the order it settled them.
func (t *Transport) Settled() []Settlement {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.settled)
}

// WaitSettled waits until the bus settled at least n deliveries and
// returns every settlement so far, or ctx's error (with the settlements
// so far) when ctx ends first.
func (t *Transport) WaitSettled(ctx context.Context, n int) ([]Settlement, error) {
	for {
		t.mu.Lock()
		settled, changed := slices.Clone(t.settled), t.changed
		t.mu.Unlock()
		if len(settled) >= n {
			return settled, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return settled, fmt.Errorf("bustest: %d of %d deliveries settled: %w", len(settled), n, ctx.Err())
		}
	}
}

// WaitIdle waits until the bus is idle: no message waits in its
// endpoint's queue or its instance queue, none waits for a delayed retry
// on the broker, and every delivery it received
// is settled (so whatever its handlers sent was handed to the transport
// too). A message sent while WaitIdle runs may make it wait for that
// message as well. It returns ctx's error, saying what was left, when
// ctx ends first. A closed transport is idle. Before the bus started the
// transport knows no queue of its own, and WaitIdle fails: start the bus
// first (a bus without an endpoint receives nothing; it is always idle).
// Messages given to [bus.Bus.Deliver] are not the transport's: Deliver
// returns once they are handled.
func (t *Transport) WaitIdle(ctx context.Context) error {
	t.checking.Lock()
	defer t.checking.Unlock()
	for {
		t.mu.Lock()
		changed, setUp, closed := t.changed, t.endpoint != "" || t.instance != "", t.closed
		t.mu.Unlock()
		if !setUp && !closed {
			return errors.New("bustest: WaitIdle on a transport that was not set up: start the bus first (a bus without an endpoint receives nothing and is always idle)")
		}
		inFlight, waiting := t.pauseAndCount()
		if inFlight == 0 && waiting == 0 {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("bustest: the bus is not idle: %d deliveries in flight, %d messages waiting: %w", inFlight, waiting, ctx.Err())
		}
	}
}

// pauseAndCount stops the receives in progress, counts the deliveries in
// flight and the messages waiting, and lets receiving go on.
func (t *Transport) pauseAndCount() (inFlight, waiting int) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return 0, 0
	}
	paused := make(chan struct{})
	t.paused = paused
	var drained chan struct{}
	if len(t.receiving) > 0 {
		drained = make(chan struct{})
		t.drained = drained
		for _, cancel := range t.receiving {
			cancel()
		}
	}
	t.mu.Unlock()
	if drained != nil {
		<-drained // a cancelled receive returns at once, with or without a message
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	inFlight = t.inFlight
	waiting = t.broker.Delayed() // first: a due message leaves the heap for its queue, not back
	if t.endpoint != "" {
		waiting += t.broker.Depth(t.endpoint)
	}
	if t.instance != "" {
		waiting += t.broker.Depth(t.instance)
	}
	t.paused = nil
	close(paused)
	return inFlight, waiting
}

// changedLocked wakes the waits. t.mu is held.
func (t *Transport) changedLocked() {
	close(t.changed)
	t.changed = make(chan struct{})
}

// Setup sets up the memory transport.
func (t *Transport) Setup(ctx context.Context, topo bus.Topology) error {
	if err := t.memory.Setup(ctx, topo); err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if topo.Endpoint != "" {
		t.endpoint = topo.Endpoint
	}
	if topo.Instance {
		t.instance = t.memory.InstanceAddress()
	}
	return nil
}

// Send hands env to the memory transport and records it.
func (t *Transport) Send(ctx context.Context, env *bus.Envelope, to string) error {
	t.acting.Lock()
	defer t.acting.Unlock()
	if err := t.memory.Send(ctx, env, to); err != nil {
		return err
	}
	t.record(Sent{Kind: bus.KindSend, Destination: to, Envelope: *env})
	return nil
}

// Publish hands env to the memory transport and records it.
func (t *Transport) Publish(ctx context.Context, env *bus.Envelope) error {
	t.acting.Lock()
	defer t.acting.Unlock()
	if err := t.memory.Publish(ctx, env); err != nil {
		return err
	}
	t.record(Sent{Kind: bus.KindPublish, Envelope: *env})
	return nil
}

func (t *Transport) record(s Sent) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sent = append(t.sent, s)
	t.changedLocked()
}

// Receive receives from the memory transport.
func (t *Transport) Receive(ctx context.Context) (*bus.Delivery, error) {
	return t.receive(ctx, t.memory.Receive)
}

// ReceiveInstance receives from the memory transport's instance queue.
func (t *Transport) ReceiveInstance(ctx context.Context) (*bus.Delivery, error) {
	return t.receive(ctx, t.memory.ReceiveInstance)
}

// receive calls receive, counting the delivery in flight; a receive
// cancelled by a check for idleness is made again once the check is done.
func (t *Transport) receive(ctx context.Context, receive func(context.Context) (*bus.Delivery, error)) (*bus.Delivery, error) {
	for {
		t.mu.Lock()
		for t.paused != nil {
			paused := t.paused
			t.mu.Unlock()
			select {
			case <-paused:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			t.mu.Lock()
		}
		rctx, cancel := context.WithCancel(ctx)
		t.lastReceive++
		number := t.lastReceive
		t.receiving[number] = cancel
		t.mu.Unlock()

		d, err := receive(rctx)

		t.mu.Lock()
		delete(t.receiving, number)
		if len(t.receiving) == 0 && t.drained != nil {
			close(t.drained)
			t.drained = nil
		}
		if d != nil {
			t.inFlight++
			t.changedLocked()
		}
		t.mu.Unlock()
		paused := rctx.Err() != nil && ctx.Err() == nil
		cancel()
		if d == nil && err != nil && paused {
			continue
		}
		return d, err
	}
}

// Delete acknowledges d with the memory transport and records it.
func (t *Transport) Delete(ctx context.Context, d *bus.Delivery) error {
	return t.settle(func() error { return t.memory.Delete(ctx, d) }, Settlement{Outcome: Deleted, Envelope: d.Envelope, Attempt: d.Attempt})
}

// Return returns d to the memory transport and records it.
func (t *Transport) Return(ctx context.Context, d *bus.Delivery, cause error) error {
	return t.settle(func() error { return t.memory.Return(ctx, d, cause) }, Settlement{Outcome: Returned, Envelope: d.Envelope, Attempt: d.Attempt, Cause: cause})
}

// ReturnAfter returns d to the memory transport, to be delivered again
// after delay, and records it.
func (t *Transport) ReturnAfter(ctx context.Context, d *bus.Delivery, cause error, delay time.Duration) error {
	return t.settle(func() error { return t.memory.ReturnAfter(ctx, d, cause, delay) }, Settlement{Outcome: Returned, Envelope: d.Envelope, Attempt: d.Attempt, Cause: cause, Delay: delay})
}

// MaxDelay is the memory transport's.
func (t *Transport) MaxDelay() time.Duration { return t.memory.MaxDelay() }

// Fail dead-letters d with the memory transport and records it.
func (t *Transport) Fail(ctx context.Context, d *bus.Delivery, f bus.Failure) error {
	return t.settle(func() error { return t.memory.Fail(ctx, d, f) }, Settlement{Outcome: DeadLettered, Envelope: d.Envelope, Attempt: d.Attempt, Failure: f})
}

// settle makes the settlement with act and records s, in the order of the
// acts.
func (t *Transport) settle(act func() error, s Settlement) error {
	t.acting.Lock()
	defer t.acting.Unlock()
	err := act()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.settled = append(t.settled, s)
	t.inFlight--
	t.changedLocked()
	return err
}

// InstanceAddress returns the address of the memory transport's instance queue.
func (t *Transport) InstanceAddress() string { return t.memory.InstanceAddress() }

// Close closes the memory transport.
func (t *Transport) Close(ctx context.Context) error {
	t.mu.Lock()
	if !t.closed {
		t.closed = true // no check for idleness looks at the queues from now on
		t.changedLocked()
	}
	t.mu.Unlock()
	return t.memory.Close(ctx)
}

var (
	_ bus.Transport        = (*Transport)(nil)
	_ bus.InstanceQueuer   = (*Transport)(nil)
	_ bus.InstanceReceiver = (*Transport)(nil)
	_ bus.Delayer          = (*Transport)(nil)
)
