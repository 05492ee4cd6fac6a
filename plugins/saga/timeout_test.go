package saga_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/testenv"
	"github.com/plugbus/plugbus/plugins/inbox"
	"github.com/plugbus/plugbus/plugins/outbox"
	"github.com/plugbus/plugbus/plugins/saga"
	"github.com/plugbus/plugbus/store/storetest"
	"github.com/plugbus/plugbus/transports/memory"
	"github.com/plugbus/plugbus/transports/rabbitmq"
)

// TestTimeouts: a payment timeout fires after its delay and cancels the
// unpaid order; the timeout of an order completed before it is delivered
// to the saga's handler and dropped; through the outbox, so the due time
// travels with the stored message. The delay is scaled down to 1s.
func TestTimeouts(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		broker := memory.NewBroker()
		testTimeouts(t, db, "orders", "sink", func(testing.TB) bus.Transport { return memTransport(broker) })
	})
}

// TestTimeoutsRabbitMQ is TestTimeouts on RabbitMQ (its delay cascade)
// and PostgreSQL.
func TestTimeoutsRabbitMQ(t *testing.T) {
	url := testenv.RabbitMQ(t)
	db := storetest.New(t, storetest.Postgres)
	endpoint := randomName("saga-timeouts-")
	queueCleanup(t, url, endpoint, endpoint+"-sink")
	testTimeouts(t, db, endpoint, endpoint+"-sink", func(tb testing.TB) bus.Transport {
		tr, err := rabbitmq.New(url, rabbitmq.WithLogger(slog.New(slog.DiscardHandler)))
		if err != nil {
			tb.Fatal(err)
		}
		return tr
	})
}

func testTimeouts(t *testing.T, db storetest.DB, endpoint, sinkEndpoint string, transport func(testing.TB) bus.Transport) {
	// Long enough for the shipped order to be paid and shipped first on a
	// loaded machine.
	const delay = time.Second
	st := db.Open(t)
	sk := newSinkAt(t, transport(t), sinkEndpoint)
	var mu sync.Mutex
	timeouts := map[string]int{} // PaymentOverdue handled, by order
	seen := bus.Middleware{Name: "timeouts", Handling: func(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
		err := next.Call(ctx)
		if m, ok := h.Message().(PaymentOverdue); ok && err == nil {
			mu.Lock()
			timeouts[m.OrderID]++
			mu.Unlock()
		}
		return err
	}}
	b, err := bus.New(bus.WithEndpoint(endpoint), bus.WithTransport(transport(t)), bus.WithLogger(slog.New(slog.DiscardHandler)),
		bus.WithMiddleware(seen, outbox.New(st, outbox.WithPollInterval(20*time.Millisecond)), inbox.New(st)),
		orderSagaTo(sinkEndpoint, st, delay).Option())
	if err != nil {
		t.Fatal(err)
	}
	start(t, b)
	send := func(m bus.Message) {
		t.Helper()
		if err := b.Send(context.Background(), m, bus.To(endpoint)); err != nil {
			t.Fatal(err)
		}
	}
	began := time.Now()
	send(Placed{OrderID: "unpaid"})
	send(Placed{OrderID: "shipped"})
	waitFor(t, 10*time.Second, "placed", func() bool {
		_, _, a := row(t, st, "order", "unpaid")
		_, _, b := row(t, st, "order", "shipped")
		return a && b
	})
	send(Paid{OrderID: "shipped"})
	waitFor(t, 10*time.Second, "paid", func() bool { s, _, _ := row(t, st, "order", "shipped"); return strings.Contains(s, `"Paid":true`) })
	send(Shipped{OrderID: "shipped"})
	waitFor(t, 20*time.Second, "both timeouts handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return timeouts["unpaid"] == 1 && timeouts["shipped"] == 1
	})
	waitFor(t, 20*time.Second, "cancelled and fulfilled", func() bool {
		_, c := sk.counts("unpaid")
		f, _ := sk.counts("shipped")
		return c == 1 && f == 1
	})
	sk.mu.Lock()
	cancelledAt := sk.at["unpaid"]
	sk.mu.Unlock()
	if f, c := sk.counts("unpaid"); f != 0 || c != 1 {
		t.Fatalf("unpaid order: fulfilled %d cancelled %d; want 0 and 1", f, c)
	}
	if early := cancelledAt.Sub(began); early < delay {
		t.Fatalf("the timeout fired %s after the order was placed; want at least %s", early, delay)
	}
	if f, c := sk.counts("shipped"); f != 1 || c != 0 {
		t.Fatalf("shipped order: fulfilled %d cancelled %d; want 1 and 0: a timeout fired for a completed instance", f, c)
	}
	var stored int
	q := db.Rebind("SELECT count(*) FROM " + db.Table("outbox") + " WHERE name = ?")
	if err := st.DB().QueryRowContext(t.Context(), q, Cancelled{}.MessageName()).Scan(&stored); err != nil || stored != 1 {
		t.Fatalf("%d Cancelled stored (%v); want 1: the completed order's timeout must send nothing", stored, err)
	}
	if _, _, ok := row(t, st, "order", "unpaid"); ok {
		t.Fatal("the cancelled order's instance is still there")
	}
}

// TestTimeoutOfAnEarlierInstanceIsDropped: an instance completed and
// started again with the same correlation value does not receive the
// timeout the first one asked for.
func TestTimeoutOfAnEarlierInstanceIsDropped(t *testing.T) {
	db := storetest.New(t, storetest.SQLite)
	st := db.Open(t)
	broker := memory.NewBroker()
	sk := newSink(t, memTransport(broker))
	s := saga.New[Order]("renewed", st)
	saga.StartedBy(s, saga.By(func(m Placed) string { return m.OrderID }), func(c *saga.Context[Order], m Placed) error {
		c.State.Amount = m.Amount
		if m.Amount == 1 {
			c.Complete() // the first instance ends at once, leaving its timeout behind
			return c.RequestTimeout(600*time.Millisecond, PaymentOverdue{OrderID: m.OrderID})
		}
		return c.RequestTimeout(1200*time.Millisecond, PaymentOverdue{OrderID: m.OrderID})
	})
	saga.HandlesTimeout(s, func(c *saga.Context[Order], m PaymentOverdue) error {
		c.Complete()
		return c.Send(Cancelled{OrderID: m.OrderID + "/" + string(rune('0'+c.State.Amount))}, bus.To("sink"))
	})
	b, _ := orderBus(t, st, memTransport(broker), s, nil, false)
	send(t, b, Placed{OrderID: "o", Amount: 1})
	waitFor(t, 10*time.Second, "first instance done", func() bool { return broker.Delayed() == 1 })
	send(t, b, Placed{OrderID: "o", Amount: 2})
	waitFor(t, 10*time.Second, "second instance cancelled", func() bool { _, c := sk.counts("o/2"); return c == 1 })
	if _, c := sk.counts("o/1"); c != 0 {
		t.Fatal("the first instance's timeout reached the second instance")
	}
}
