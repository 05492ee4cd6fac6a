package bustest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
	"github.com/plugbus/plugbus/transports/memory"
)

type chargeCard struct {
	OrderID string `json:"order_id"`
}

func (chargeCard) MessageName() string { return "billing.charge_card" }

// step is a message whose handler sends the next step to its own
// endpoint, up to the last.
type step struct {
	N, Last int
}

func (step) MessageName() string { return "test.step" }

func quiet() bus.Option { return bus.WithLogger(slog.New(slog.DiscardHandler)) }

func waitIdle(t *testing.T, tr *bustest.Transport) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := tr.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
}

// notIdle checks that WaitIdle does not return within a short while, and
// that its error says what is left.
func notIdle(t *testing.T, tr *bustest.Transport, want string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	err := tr.WaitIdle(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), want) {
		t.Fatalf("WaitIdle = %v, want the deadline's error saying %q", err, want)
	}
}

// The transport records each message the bus sent or published, and each
// settlement: deleted, returned with its cause, dead-lettered with its
// failure, with the delivery's attempt.
func TestTransportRecordsWhatTheBusSentAndHowItSettled(t *testing.T) {
	tr := bustest.NewTransport()
	b := bustest.Start(t, bus.WithEndpoint("orders"), bus.WithTransport(tr), quiet(), bus.WithMaxAttempts(2), bus.WithConcurrency(1),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, _ bus.Attributes) error {
			if m.ID == "bad" {
				return errors.New("card declined")
			}
			b, _, _ := bus.MessageContext(ctx)
			if err := b.Send(ctx, chargeCard{OrderID: m.ID}, bus.To("billing")); err != nil {
				return err
			}
			return b.Publish(ctx, chargeCard{OrderID: m.ID})
		}))
	ctx := t.Context()
	if err := b.Send(ctx, orderPlaced{ID: "good"}, bus.WithMessageID("good")); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(ctx, orderPlaced{ID: "bad"}, bus.WithMessageID("bad")); err != nil {
		t.Fatal(err)
	}
	waitIdle(t, tr)

	var sent []string
	for _, s := range tr.Sent() {
		sent = append(sent, fmt.Sprintf("%s %s to %q: %s", s.Kind, s.Envelope.Name, s.Destination, s.Envelope.Body))
	}
	want := map[string]bool{
		`send shop.order_placed to "orders": {"id":"good"}`:          true,
		`send shop.order_placed to "orders": {"id":"bad"}`:           true,
		`send billing.charge_card to "billing": {"order_id":"good"}`: true,
		`publish billing.charge_card to "": {"order_id":"good"}`:     true,
	}
	if len(sent) != len(want) {
		t.Fatalf("sent %q, want %d messages", sent, len(want))
	}
	for _, s := range sent {
		if !want[s] {
			t.Fatalf("sent %q, want the messages of %v", sent, want)
		}
	}

	var settled []string
	for _, s := range tr.Settled() {
		settled = append(settled, fmt.Sprintf("%s %s attempt %d", s.Envelope.Attributes.MessageID, s.Outcome, s.Attempt))
		switch s.Outcome {
		case bustest.Returned:
			if s.Cause == nil || !strings.Contains(s.Cause.Error(), "card declined") {
				t.Errorf("returned with cause %v", s.Cause)
			}
		case bustest.DeadLettered:
			if s.Failure.Attempts != 2 || s.Failure.Endpoint != "orders" || !strings.Contains(s.Failure.Reason, "card declined") {
				t.Errorf("dead-lettered with %+v", s.Failure)
			}
		}
	}
	if got, want := strings.Join(settled, ", "), "good deleted attempt 1, bad returned attempt 1, bad dead-lettered attempt 2"; got != want {
		t.Fatalf("settled %s, want %s", got, want)
	}
}

// The transport keeps what it records, so it must not let the bus lend it
// envelopes that the bus reuses, nor take deliveries back; it has the
// memory transport's instance queues.
func TestTransportKeepsItsEnvelopesAndHasInstanceQueues(t *testing.T) {
	var tr bus.Transport = bustest.NewTransport()
	if _, ok := tr.(bus.EnvelopeCopier); ok {
		t.Fatal("the recording transport is a bus.EnvelopeCopier: the bus would reuse the envelopes it records")
	}
	if _, ok := tr.(bus.DeliveryReleaser); ok {
		t.Fatal("the recording transport is a bus.DeliveryReleaser")
	}
	_, queuer := tr.(bus.InstanceQueuer)
	_, receiver := tr.(bus.InstanceReceiver)
	if !queuer || !receiver {
		t.Fatalf("instance queues: InstanceQueuer %v, InstanceReceiver %v", queuer, receiver)
	}

	rec := tr.(*bustest.Transport)
	b := bustest.Start(t, bus.WithTransport(rec), quiet(), bus.WithRoute("billing", chargeCard{}))
	for _, id := range []string{"first", "second", "third"} {
		if err := b.Send(t.Context(), chargeCard{OrderID: id}, bus.WithMessageID(id)); err != nil {
			t.Fatal(err)
		}
	}
	for i, id := range []string{"first", "second", "third"} {
		if got := rec.Sent()[i].Envelope.Attributes.MessageID; got != id {
			t.Fatalf("recorded message %d is %s, want %s", i+1, got, id)
		}
	}
}

// WaitIdle returns once the messages that handlers sent to their own
// endpoint were handled too.
func TestWaitIdleWaitsForWhatHandlersSent(t *testing.T) {
	tr := bustest.NewTransport()
	var handled atomic.Int32
	b := bustest.Start(t, bus.WithEndpoint("steps"), bus.WithTransport(tr), quiet(), bus.WithConcurrency(4),
		bus.WithHandler(func(ctx context.Context, m step, _ bus.Attributes) error {
			handled.Add(1)
			if m.N == m.Last {
				return nil
			}
			b, _, _ := bus.MessageContext(ctx)
			return b.Send(ctx, step{N: m.N + 1, Last: m.Last})
		}))
	if err := b.Send(t.Context(), step{N: 1, Last: 5}); err != nil {
		t.Fatal(err)
	}
	waitIdle(t, tr)
	if n := handled.Load(); n != 5 {
		t.Fatalf("handled %d steps when the bus was idle, want 5", n)
	}
	if n := len(tr.Settled()); n != 5 {
		t.Fatalf("%d settlements, want 5", n)
	}
}

// A message waiting in the endpoint's queue, and a delivery not yet
// settled, each keep the transport from being idle.
func TestWaitIdleWaitsForWaitingAndUnsettledMessages(t *testing.T) {
	broker := memory.NewBroker()
	tr := bustest.NewTransport(memory.WithBroker(broker))
	ctx := t.Context()
	if err := tr.WaitIdle(ctx); err == nil || !strings.Contains(err.Error(), "start the bus first") {
		t.Fatalf("WaitIdle before Setup = %v, want an error saying to start the bus", err)
	}
	if err := tr.Setup(ctx, bus.Topology{Endpoint: "orders", Handles: []string{"shop.order_placed"}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Close(context.Background()) })
	waitIdle(t, tr)

	// Sent by another bus on the broker: the transport sees it only in its queue.
	sender, err := bus.New(bus.WithTransport(memory.New(memory.WithBroker(broker))), quiet(), bus.WithRoute("orders", orderPlaced{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sender.Stop(context.Background()) })
	if err := sender.Send(ctx, orderPlaced{ID: "1"}); err != nil {
		t.Fatal(err)
	}
	notIdle(t, tr, "0 deliveries in flight, 1 messages waiting")
	d, err := tr.Receive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	notIdle(t, tr, "1 deliveries in flight, 0 messages waiting")
	if err := tr.Delete(ctx, d); err != nil {
		t.Fatal(err)
	}
	waitIdle(t, tr)
	if s := tr.Settled(); len(s) != 1 || s[0].Outcome != bustest.Deleted || s[0].Envelope.Name != "shop.order_placed" {
		t.Fatalf("settled %+v", s)
	}
	if err := tr.Close(ctx); err != nil {
		t.Fatal(err)
	}
	waitIdle(t, tr) // closed
}

// A handler still running keeps its bus from being idle.
func TestWaitIdleWaitsForARunningHandler(t *testing.T) {
	tr := bustest.NewTransport()
	entered, release := make(chan struct{}), make(chan struct{})
	b := bustest.Start(t, bus.WithEndpoint("orders"), bus.WithTransport(tr), quiet(), bus.WithConcurrency(1),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, _ bus.Attributes) error {
			if m.ID == "slow" {
				close(entered)
				<-release
			}
			return nil
		}))
	if err := b.Send(t.Context(), orderPlaced{ID: "slow"}); err != nil {
		t.Fatal(err)
	}
	<-entered
	if err := b.Send(t.Context(), orderPlaced{ID: "next"}); err != nil {
		t.Fatal(err)
	}
	notIdle(t, tr, "1 deliveries in flight, 1 messages waiting")
	close(release)
	waitIdle(t, tr)
	if n := len(tr.Settled()); n != 2 {
		t.Fatalf("%d settlements, want 2", n)
	}
}

// A message sent by another bus is never missed while a receiver is
// taking it from the queue (no longer waiting there, not yet in flight):
// once WaitIdle returns, its handler ran.
func TestWaitIdleSeesAMessageBeingReceived(t *testing.T) {
	broker := memory.NewBroker()
	tr := bustest.NewTransport(memory.WithBroker(broker))
	var handled atomic.Int32
	bustest.Start(t, bus.WithEndpoint("orders"), bus.WithTransport(tr), quiet(), bus.WithConcurrency(4),
		bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error { handled.Add(1); return nil }))
	sender, err := bus.New(bus.WithTransport(memory.New(memory.WithBroker(broker))), quiet(), bus.WithRoute("orders", orderPlaced{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sender.Stop(context.Background()) })
	for i := range 1000 {
		if err := sender.Send(t.Context(), orderPlaced{ID: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
		waitIdle(t, tr)
		if n := handled.Load(); n != int32(i+1) {
			t.Fatalf("message %d: idle after %d messages handled", i+1, n)
		}
	}
}

// WaitSettled returns the settlements once there are enough, and says how
// many there were when its context ends first.
func TestWaitSettledWaitsForTheGivenNumber(t *testing.T) {
	tr := bustest.NewTransport()
	b := bustest.Start(t, bus.WithEndpoint("orders"), bus.WithTransport(tr), quiet(),
		bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error { return nil }))
	if err := b.Send(t.Context(), orderPlaced{ID: "1"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	s, err := tr.WaitSettled(ctx, 1)
	if err != nil || len(s) != 1 || s[0].Outcome != bustest.Deleted {
		t.Fatalf("WaitSettled(1) = %+v, %v", s, err)
	}
	short, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if s, err := tr.WaitSettled(short, 2); !errors.Is(err, context.DeadlineExceeded) || len(s) != 1 || !strings.Contains(err.Error(), "1 of 2") {
		t.Fatalf("WaitSettled(2) = %d settlements, %v; want 1 and the deadline's error", len(s), err)
	}
}

func TestOutcomeNames(t *testing.T) {
	for o, want := range map[bustest.Outcome]string{bustest.Deleted: "deleted", bustest.Returned: "returned", bustest.DeadLettered: "dead-lettered", 9: "Outcome(9)"} {
		if got := o.String(); got != want {
			t.Errorf("Outcome(%d) = %q, want %q", uint8(o), got, want)
		}
	}
}

type redelivered struct{ ID string }

func (redelivered) MessageName() string { return "test.redelivered" }

// Settlements are recorded in the order the bus made them: a message
// returned at once is delivered, handled and settled again by another
// worker, and its next settlement is never recorded before the one that
// returned it.
func TestSettlementsOfOneMessageAreRecordedInOrder(t *testing.T) {
	const attempts = 300
	tr := bustest.NewTransport()
	b := bustest.Start(t, bus.WithEndpoint("orders"), bus.WithTransport(tr), quiet(), bus.WithConcurrency(8),
		bus.WithRetry(bus.RetryPolicy{Immediate: attempts - 1}),
		bus.WithHandler(func(context.Context, redelivered, bus.Attributes) error { return errors.New("again") }))
	if err := b.Send(t.Context(), redelivered{ID: "1"}, bus.To("orders")); err != nil {
		t.Fatal(err)
	}
	s, err := tr.WaitSettled(t.Context(), attempts)
	if err != nil {
		t.Fatal(err)
	}
	for i, st := range s {
		if st.Attempt != i+1 {
			t.Fatalf("settlement %d is of attempt %d (%s), want attempt %d", i, st.Attempt, st.Outcome, i+1)
		}
	}
	if s[attempts-1].Outcome != bustest.DeadLettered {
		t.Fatalf("last settlement %s, want dead-lettered", s[attempts-1].Outcome)
	}
}

// Sent messages are recorded in the order the memory transport accepted
// them: a message sent by a handler is delivered, handled by another
// worker, and what that handler sends is never recorded before it.
func TestSentMessagesAreRecordedInTheOrderAccepted(t *testing.T) {
	const steps = 300
	tr := bustest.NewTransport()
	b := bustest.Start(t, bus.WithEndpoint("steps"), bus.WithTransport(tr), quiet(), bus.WithConcurrency(8),
		bus.WithHandler(func(ctx context.Context, m step, _ bus.Attributes) error {
			if m.N == m.Last {
				return nil
			}
			b, _, _ := bus.MessageContext(ctx)
			return b.Send(ctx, step{N: m.N + 1, Last: m.Last}, bus.Immediately())
		}))
	if err := b.Send(t.Context(), step{N: 1, Last: steps}); err != nil {
		t.Fatal(err)
	}
	waitIdle(t, tr)
	sent := tr.Sent()
	if len(sent) != steps {
		t.Fatalf("%d messages recorded, want %d", len(sent), steps)
	}
	for i, s := range sent {
		var m step
		if err := json.Unmarshal(s.Envelope.Body, &m); err != nil {
			t.Fatal(err)
		}
		if m.N != i+1 {
			t.Fatalf("recorded message %d is step %d, want step %d", i+1, m.N, i+1)
		}
	}
}
