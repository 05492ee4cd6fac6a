package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugins/outbox"
	"github.com/plugbus/plugbus/store"
	"github.com/plugbus/plugbus/store/storetest"
	"github.com/plugbus/plugbus/transports/memory"
)

type Poison struct{}

func (Poison) MessageName() string { return "test.poison" }

// refusing refuses every test.poison for good (a message too large for the
// broker, a queue not deployed yet).
type refusing struct {
	bus.Transport
	refused atomic.Int64
}

func (r *refusing) Send(ctx context.Context, e *bus.Envelope, to string) error {
	if e.Name == "test.poison" {
		r.refused.Add(1)
		return errors.New("message too large")
	}
	return r.Transport.Send(ctx, e, to)
}

// One message the transport refuses does not hold up the outbox: the
// messages committed after it are delivered, and it ends parked.
func TestRefusedMessageDoesNotBlock(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		st := db.Open(t, store.WithDispatchAttempts(3), store.WithBackoff(bus.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond}))
		broker := memory.NewBroker()
		got := sink(t, broker)
		tr := &refusing{Transport: memory.New(memory.WithBroker(broker))}
		b, err := bus.New(bus.WithTransport(tr), bus.WithMiddleware(outbox.New(st, outbox.WithRelays(3), outbox.WithPollInterval(10*time.Millisecond))))
		if err != nil {
			t.Fatal(err)
		}
		start(t, b)
		ctx := context.Background()
		if err := outbox.Within(ctx, b, st, func(ctx context.Context, _ *sql.Tx) error {
			return b.Send(ctx, Poison{}, bus.To("sink"))
		}); err != nil {
			t.Fatal(err)
		}
		for i := range 20 {
			if err := outbox.Within(ctx, b, st, func(ctx context.Context, _ *sql.Tx) error {
				return b.Send(ctx, Done{N: i}, bus.To("sink"))
			}); err != nil {
				t.Fatal(err)
			}
		}
		seen := map[int]bool{}
		for len(seen) < 20 {
			seen[receive(t, got).msg.N] = true
		}
		waitFor(t, "the poison message parked", func() bool { n, _ := st.ParkedCount(ctx); return n == 1 })
		if n := tr.refused.Load(); n != 3 {
			t.Fatalf("poison tried %d times, want 3", n)
		}
		// A row is marked dispatched after the transport took it, in the
		// relay's transaction: wait for the last marks to commit.
		waitFor(t, "every delivered row marked dispatched", func() bool {
			n, err := st.Pending(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return n == 0
		})
	})
}

// refusingOnce refuses the first attempt at each message, as a broker
// briefly out of resources would, and counts the attempts.
type refusingOnce struct {
	bus.Transport
	attempts atomic.Int64
}

func (r *refusingOnce) Send(ctx context.Context, e *bus.Envelope, to string) error {
	if r.attempts.Add(1) == 1 {
		return errors.New("resource alarm")
	}
	return r.Transport.Send(ctx, e, to)
}

// A refused message is retried when its backoff ends, not at the next
// poll: with a poll of one hour and a backoff of 200ms it arrives within
// seconds.
func TestRefusedMessageRetriedWhenItsBackoffEnds(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		st := db.Open(t, store.WithBackoff(bus.Backoff{Initial: 200 * time.Millisecond, Max: time.Second}))
		broker := memory.NewBroker()
		got := sink(t, broker)
		tr := &refusingOnce{Transport: memory.New(memory.WithBroker(broker))}
		b, err := bus.New(bus.WithTransport(tr), bus.WithMiddleware(outbox.New(st, outbox.WithPollInterval(time.Hour))))
		if err != nil {
			t.Fatal(err)
		}
		start(t, b)
		if err := outbox.Within(context.Background(), b, st, func(ctx context.Context, _ *sql.Tx) error {
			return b.Send(ctx, Done{N: 7}, bus.To("sink"))
		}); err != nil {
			t.Fatal(err)
		}
		if m := receive(t, got); m.msg.N != 7 { // within 10s, against a poll of an hour
			t.Fatalf("received %d", m.msg.N)
		}
		if n := tr.attempts.Load(); n != 2 {
			t.Fatalf("%d attempts, want 2", n)
		}
	})
}

// A full batch of messages the transport refuses (a burst to an endpoint
// not deployed yet, at least a batch of them) does not hold up the
// messages behind it: each refused row waits for its own backoff, and the
// relay goes on at once to the next rows instead of backing off as if
// the transport were down. With the relay's backoff at an hour, the good
// message arrives within seconds.
func TestRefusedFullBatchDoesNotHoldUpTheOthers(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		st := db.Open(t, store.WithBackoff(bus.Backoff{Initial: time.Hour, Max: time.Hour}))
		broker := memory.NewBroker()
		got := sink(t, broker)
		tr := &refusing{Transport: memory.New(memory.WithBroker(broker))}
		b, err := bus.New(bus.WithTransport(tr), bus.WithMiddleware(outbox.New(st, outbox.WithBatchSize(2),
			outbox.WithPollInterval(time.Hour), outbox.WithBackoff(bus.Backoff{Initial: time.Hour, Max: time.Hour}))))
		if err != nil {
			t.Fatal(err)
		}
		start(t, b)
		// One transaction: the four refused rows come first in id order.
		if err := outbox.Within(context.Background(), b, st, func(ctx context.Context, _ *sql.Tx) error {
			for range 4 {
				if err := b.Send(ctx, Poison{}, bus.To("sink")); err != nil {
					return err
				}
			}
			return b.Send(ctx, Done{N: 9}, bus.To("sink"))
		}); err != nil {
			t.Fatal(err)
		}
		if m := receive(t, got); m.msg.N != 9 { // within 10s, against a relay backoff of an hour
			t.Fatalf("received %d", m.msg.N)
		}
		if n := tr.refused.Load(); n != 4 {
			t.Fatalf("poison tried %d times, want 4 (each once: its own backoff is an hour)", n)
		}
	})
}
