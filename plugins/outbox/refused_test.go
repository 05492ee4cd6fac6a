package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/testenv"
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

// refusingAll refuses every message, as a transport in an outage that
// fails fast does.
type refusingAll struct {
	bus.Transport
	refused atomic.Int64
	mu      sync.Mutex
	tries   map[string]int // by message id
}

func (r *refusingAll) Send(_ context.Context, e *bus.Envelope, _ string) error {
	r.refused.Add(1)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tries[e.Attributes.MessageID]++
	return errors.New("connection refused")
}

// In an outage the relay tries rows of the backlog once, going on at once
// after each full round refused whole, and backs off as soon as refused
// rows come round again (here at once: their own backoff is a
// nanosecond, so the second round takes the first two rows again): it
// does not bring the backlog to parking at the speed of the transport's
// errors.
func TestOutageTriesEachRowOnceThenBacksOff(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		st := db.Open(t, store.WithBackoff(bus.Backoff{Initial: time.Nanosecond, Max: time.Nanosecond})) // rows due again at once
		tr := &refusingAll{Transport: memory.New(), tries: map[string]int{}}
		logs := &testenv.LogBuffer{}
		b, err := bus.New(bus.WithTransport(tr), bus.WithLogger(slog.New(slog.NewTextHandler(logs, nil))),
			bus.WithMiddleware(outbox.New(st, outbox.WithBatchSize(2), outbox.WithPollInterval(time.Hour),
				outbox.WithBackoff(bus.Backoff{Initial: time.Hour, Max: time.Hour}))))
		if err != nil {
			t.Fatal(err)
		}
		// Stored before the relay starts: its first rounds take them.
		if err := st.Migrate(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := outbox.Within(context.Background(), b, st, func(ctx context.Context, _ *sql.Tx) error {
			for i := range 6 {
				if err := b.Send(ctx, Done{N: i}, bus.To("sink")); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		start(t, b)
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(logs.String(), "outbox relay: dispatch failed; retrying") { // no signal to wait for: poll the log
			if time.Now().After(deadline) {
				t.Fatalf("the relay never backed off; %d sends refused:\n%s", tr.refused.Load(), logs)
			}
			time.Sleep(time.Millisecond)
		}
		tr.mu.Lock()
		twice := 0
		for id, n := range tr.tries {
			if n > 2 {
				t.Errorf("row of %s tried %d times before the relay backed off, want at most 2", id, n)
			}
			if n == 2 {
				twice++
			}
		}
		tr.mu.Unlock()
		if twice != 2 || tr.refused.Load() != 4 {
			t.Errorf("%d rows tried twice, %d sends, want the first round's 2 rows tried again and no more (4 sends): the relay backs off after a round of retried rows", twice, tr.refused.Load())
		}
		if n, err := st.ParkedCount(context.Background()); err != nil || n != 0 {
			t.Fatalf("%d rows parked (%v), want none", n, err)
		}
	})
}
