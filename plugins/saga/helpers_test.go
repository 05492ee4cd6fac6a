package saga_test

import (
	"context"
	"database/sql"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugins/saga"
	"github.com/plugbus/plugbus/store"
	"github.com/plugbus/plugbus/transports/memory"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		runChild()
		return
	}
	goleak.VerifyTestMain(m)
}

// The order flow of the tests.
type (
	Placed struct {
		OrderID string
		Amount  int
	}
	Paid           struct{ OrderID string }
	Shipped        struct{ OrderID string }
	PaymentOverdue struct{ OrderID string }
	Fulfilled      struct{ OrderID string }
	Cancelled      struct{ OrderID string }
	// Noted is correlated by an attribute.
	Noted struct{ Text string }
)

func (Placed) MessageName() string         { return "sagatests.placed" }
func (Paid) MessageName() string           { return "sagatests.paid" }
func (Shipped) MessageName() string        { return "sagatests.shipped" }
func (PaymentOverdue) MessageName() string { return "sagatests.payment_overdue" }
func (Fulfilled) MessageName() string      { return "sagatests.fulfilled" }
func (Cancelled) MessageName() string      { return "sagatests.cancelled" }
func (Noted) MessageName() string          { return "sagatests.noted" }

// Order is the state of the order saga.
type Order struct {
	Amount  int
	Paid    bool
	Shipped bool
	Notes   []string
}

// orderSaga is placed → paid → shipped, completing when shipped, with a
// payment timeout that cancels it. Shipped for no order is dead-lettered.
func orderSaga(st *store.Store, paymentTimeout time.Duration, opts ...saga.Option) *saga.Saga[Order] {
	return orderSagaTo("sink", st, paymentTimeout, opts...)
}

// orderSagaTo is orderSaga sending to the endpoint sink.
func orderSagaTo(sink string, st *store.Store, paymentTimeout time.Duration, opts ...saga.Option) *saga.Saga[Order] {
	s := saga.New[Order]("order", st, opts...)
	saga.StartedBy(s, saga.By(func(m Placed) string { return m.OrderID }), func(c *saga.Context[Order], m Placed) error {
		c.State.Amount = m.Amount
		return c.RequestTimeout(paymentTimeout, PaymentOverdue{OrderID: m.OrderID})
	})
	saga.Handles(s, saga.By(func(m Paid) string { return m.OrderID }), func(c *saga.Context[Order], m Paid) error {
		c.State.Paid = true
		return nil
	})
	saga.Handles(s, saga.By(func(m Shipped) string { return m.OrderID }), func(c *saga.Context[Order], m Shipped) error {
		if !c.State.Paid {
			return bus.Permanent(errUnpaid)
		}
		c.State.Shipped = true
		c.Complete()
		return c.Send(Fulfilled(m), bus.To(sink))
	}, saga.WhenMissing(saga.DeadLetter))
	saga.Handles(s, saga.ByAttribute[Noted]("order-id"), func(c *saga.Context[Order], m Noted) error {
		c.State.Notes = append(c.State.Notes, m.Text)
		return nil
	})
	saga.HandlesTimeout(s, func(c *saga.Context[Order], m PaymentOverdue) error {
		if c.State.Paid {
			return nil
		}
		c.Complete()
		return c.Send(Cancelled(m), bus.To(sink))
	})
	return s
}

type unpaidError struct{}

func (unpaidError) Error() string { return "shipped before paid" }

var errUnpaid = unpaidError{}

func start(t testing.TB, b *bus.Bus) {
	t.Helper()
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})
}

// sink collects what the sagas send to endpoint "sink".
type sink struct {
	mu        sync.Mutex
	fulfilled map[string]int
	cancelled map[string]int
	at        map[string]time.Time
	changed   chan struct{}
}

func newSink(t testing.TB, tr bus.Transport) *sink { return newSinkAt(t, tr, "sink") }

// newSinkAt is newSink on endpoint.
func newSinkAt(t testing.TB, tr bus.Transport, endpoint string) *sink {
	s := &sink{fulfilled: map[string]int{}, cancelled: map[string]int{}, at: map[string]time.Time{}, changed: make(chan struct{}, 1)}
	b, err := bus.New(bus.WithEndpoint(endpoint), bus.WithTransport(tr), bus.WithLogger(slog.New(slog.DiscardHandler)),
		bus.WithHandler(func(_ context.Context, m Fulfilled, _ bus.Attributes) error {
			s.add(s.fulfilled, m.OrderID)
			return nil
		}),
		bus.WithHandler(func(_ context.Context, m Cancelled, _ bus.Attributes) error {
			s.add(s.cancelled, m.OrderID)
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	start(t, b)
	return s
}

func (s *sink) add(m map[string]int, id string) {
	s.mu.Lock()
	m[id]++
	s.at[id] = time.Now()
	s.mu.Unlock()
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

func (s *sink) counts(id string) (fulfilled, cancelled int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fulfilled[id], s.cancelled[id]
}

// waitFor polls cond until it holds, failing the test after limit.
func waitFor(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, limit)
		}
		<-tick.C
	}
}

func memTransport(b *memory.Broker) bus.Transport { return memory.New(memory.WithBroker(b)) }

// row reads the stored instance of saga name with key: its state, whether
// it completed, and whether it exists.
func row(t testing.TB, st *store.Store, name, key string) (state string, completed, exists bool) {
	t.Helper()
	q := st.Dialect().Rebind(`SELECT state, completed_at IS NOT NULL FROM ` + st.SagaTable() + ` WHERE saga = ? AND correlation = ?`)
	var body []byte
	err := st.DB().QueryRowContext(context.Background(), q, name, key).Scan(&body, &completed)
	if err == sql.ErrNoRows {
		return "", false, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(body), completed, true
}
