package bus_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/memory"
)

// received records when each message id arrived.
type received struct {
	mu  sync.Mutex
	at  map[string]time.Time
	got chan string
}

func newReceived() *received {
	return &received{at: map[string]time.Time{}, got: make(chan string, 64)}
}

func (r *received) handle(_ context.Context, m orderPlaced, _ bus.Attributes) error {
	r.mu.Lock()
	r.at[m.ID] = time.Now()
	r.mu.Unlock()
	r.got <- m.ID
	return nil
}

func (r *received) when(id string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.at[id]
}

// A message sent with Delay or At arrives no earlier than its due time,
// and one sent with no delay (or a negative one) overtakes it: sent after
// a message delayed an hour, it arrives while that one still waits.
func TestDelayedSendArrivesNoEarlierThanDue(t *testing.T) {
	r := newReceived()
	broker := memory.NewBroker()
	// One worker: the messages are handled in the order of the queue, not
	// in the order that several workers happen to reach the handler.
	b := startBus(t, bus.WithEndpoint("ep"), bus.WithTransport(memory.New(memory.WithBroker(broker))),
		bus.WithConcurrency(1), bus.WithHandler(r.handle))
	const delay = 80 * time.Millisecond
	start := time.Now()
	if err := b.Send(t.Context(), orderPlaced{ID: "later"}, bus.Delay(delay)); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(t.Context(), orderPlaced{ID: "at"}, bus.At(start.Add(delay))); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(t.Context(), orderPlaced{ID: "held"}, bus.Delay(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(t.Context(), orderPlaced{ID: "now"}, bus.Delay(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for range 3 {
		got[await(t, r.got)]++
	}
	if got["later"] != 1 || got["at"] != 1 || got["now"] != 1 {
		t.Fatalf("delivered %v, want later, at and now once each (and not the one due in an hour)", got)
	}
	if n := broker.Delayed(); n != 1 {
		t.Fatalf("%d messages still delayed, want the one due in an hour: the undelayed one did not overtake it", n)
	}
	for _, id := range []string{"later", "at"} {
		if early := start.Add(delay).Sub(r.when(id)); early > 0 {
			t.Errorf("%s delivered %v early", id, early)
		}
	}
}

// A delayed publish reaches every subscribed endpoint once, after its delay.
func TestDelayedPublishReachesEverySubscriberOnce(t *testing.T) {
	broker := memory.NewBroker()
	r := newReceived()
	for _, ep := range []string{"a", "b", "c"} {
		startBus(t, bus.WithEndpoint(ep), bus.WithTransport(memory.New(memory.WithBroker(broker))), bus.WithHandler(r.handle))
	}
	pub := startBus(t, bus.WithTransport(memory.New(memory.WithBroker(broker))))
	const delay = 50 * time.Millisecond
	start := time.Now()
	if err := pub.Publish(t.Context(), orderPlaced{ID: "e"}, bus.Delay(delay)); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		await(t, r.got)
	}
	if early := start.Add(delay).Sub(r.when("e")); early > 0 {
		t.Errorf("delivered %v early", early)
	}
	if n := broker.Delayed(); n != 0 {
		t.Errorf("%d messages still delayed", n)
	}
	select {
	case id := <-r.got:
		t.Fatalf("a fourth delivery of %q", id)
	default:
	}
}

// Inside a handler the delay counts from the call to Send, not from the
// flush when the handler returns.
func TestDelayInHandlerCountsFromTheCall(t *testing.T) {
	r := newReceived()
	const delay = 60 * time.Millisecond
	sentAt := make(chan time.Time, 1)
	b := startBus(t, bus.WithEndpoint("ep"), bus.WithHandler(r.handle),
		bus.WithHandler(func(ctx context.Context, m chargeCard, _ bus.Attributes) error {
			now := time.Now()
			if err := handlingBus(ctx).Send(ctx, orderPlaced{ID: m.OrderID}, bus.Delay(delay)); err != nil {
				return err
			}
			sentAt <- now
			return nil
		}))
	if err := b.Send(t.Context(), chargeCard{OrderID: "o"}); err != nil {
		t.Fatal(err)
	}
	start := await(t, sentAt)
	await(t, r.got)
	if early := start.Add(delay).Sub(r.when("o")); early > 0 {
		t.Errorf("delivered %v early", early)
	}
}

// Outgoing middleware reads the due time and may change it.
func TestOutgoingMiddlewareReadsAndChangesDue(t *testing.T) {
	r := newReceived()
	seen := make(chan time.Time, 1)
	const delay = 40 * time.Millisecond
	b := startBus(t, bus.WithEndpoint("ep"), bus.WithHandler(r.handle),
		bus.WithMiddleware(bus.Middleware{Name: "later", Outgoing: func(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
			seen <- out.Due()
			out.SetDue(time.Now().Add(delay))
			return next.Call(ctx)
		}}))
	at := time.Now().Add(time.Hour)
	if err := b.Send(t.Context(), orderPlaced{ID: "x"}, bus.At(at)); err != nil {
		t.Fatal(err)
	}
	if got := await(t, seen); !got.Equal(at) {
		t.Fatalf("middleware saw due %v, want %v", got, at)
	}
	start := time.Now()
	await(t, r.got)
	if early := start.Add(delay).Sub(r.when("x")); early > 40*time.Millisecond {
		t.Errorf("delivered %v early", early)
	}
	if err := b.Send(t.Context(), orderPlaced{ID: "y"}); err != nil {
		t.Fatal(err)
	}
	if got := await(t, seen); !got.IsZero() {
		t.Fatalf("middleware saw due %v for a message without a delay, want zero", got)
	}
	await(t, r.got)
}

// A due time beyond what the transport carries is refused at Send with a
// typed error, and nothing is sent.
func TestDelayBeyondTheTransportIsRefused(t *testing.T) {
	b := startBus(t, bus.WithTransport(nullTransport{}))
	err := b.Send(t.Context(), orderPlaced{ID: "1"}, bus.To("ep"), bus.Delay(time.Second))
	var tooLong *bus.DelayTooLongError
	if !errors.As(err, &tooLong) || !errors.Is(err, bus.ErrDelayTooLong) || tooLong.Max != 0 || tooLong.Message != "shop.order_placed" {
		t.Fatalf("Send with a delay on a transport that cannot delay: %v, want a *DelayTooLongError with Max 0", err)
	}
	// Now and the past are not delays: accepted everywhere.
	if err := b.Send(t.Context(), orderPlaced{ID: "2"}, bus.To("ep"), bus.At(time.Now().Add(-time.Minute))); err != nil {
		t.Fatalf("Send due in the past: %v", err)
	}
	short := startBus(t, bus.WithTransport(shortDelays{memory.New()}))
	err = short.Publish(t.Context(), orderPlaced{ID: "3"}, bus.Delay(2*time.Minute))
	if !errors.As(err, &tooLong) || tooLong.Max != time.Minute || tooLong.Delay <= time.Minute {
		t.Fatalf("Publish beyond MaxDelay: %v, want a *DelayTooLongError with Max 1m", err)
	}
	if err := short.Publish(t.Context(), orderPlaced{ID: "4"}, bus.Delay(time.Minute/2)); err != nil {
		t.Fatalf("Publish within MaxDelay: %v", err)
	}
}

// shortDelays is a memory transport that carries delays of a minute at most.
type shortDelays struct{ *memory.Transport }

func (shortDelays) MaxDelay() time.Duration { return time.Minute }
