package saga_test

import (
	"context"
	"encoding/json"
	"errors"
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
	"github.com/plugbus/plugbus/store"
	"github.com/plugbus/plugbus/store/storetest"
	"github.com/plugbus/plugbus/transports/memory"
)

// orderBus starts a bus of endpoint "orders" with the outbox and inbox on
// st (unless bare) and the saga s, recording the handler names its
// handler-stage middleware sees.
func orderBus(t testing.TB, st *store.Store, tr bus.Transport, s *saga.Saga[Order], logs *testenv.LogBuffer, bare bool, extra ...bus.Option) (*bus.Bus, func() []string) {
	t.Helper()
	var mu sync.Mutex
	var seen []string
	names := bus.Middleware{Name: "names", Handling: func(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
		mu.Lock()
		seen = append(seen, h.HandlerName())
		mu.Unlock()
		return next.Call(ctx)
	}}
	mw := []bus.Plugin{names}
	if !bare {
		mw = append(mw, outbox.New(st, outbox.WithPollInterval(20*time.Millisecond)), inbox.New(st))
	}
	logger := slog.New(slog.DiscardHandler)
	if logs != nil {
		logger = slog.New(slog.NewTextHandler(logs, nil))
	}
	if s != nil {
		extra = append(extra, s.Option())
	}
	b, err := bus.New(bus.WithEndpoint("orders"), bus.WithTransport(tr), bus.WithLogger(logger),
		bus.WithMiddleware(mw...), bus.WithRetry(bus.RetryPolicy{Immediate: 3}), bus.WithOptions(extra...))
	if err != nil {
		t.Fatal(err)
	}
	start(t, b)
	return b, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), seen...)
	}
}

func send(t testing.TB, b *bus.Bus, m bus.Message, opts ...bus.SendOption) {
	t.Helper()
	if err := b.Send(context.Background(), m, append([]bus.SendOption{bus.To("orders")}, opts...)...); err != nil {
		t.Fatal(err)
	}
}

// TestOrderFlow: placed → paid → shipped runs one instance to completion;
// its send goes out once, a duplicate is skipped by the inbox, the
// handlers are seen by middleware under the saga's name, and the completed
// instance is deleted.
func TestOrderFlow(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		st := db.Open(t)
		broker := memory.NewBroker()
		sk := newSink(t, memTransport(broker))
		s := orderSaga(st, time.Hour)
		logs := &testenv.LogBuffer{}
		t.Cleanup(func() {
			if t.Failed() {
				t.Log(logs.String())
			}
		})
		b, seen := orderBus(t, st, memTransport(broker), s, logs, false)

		send(t, b, Placed{OrderID: "o-1", Amount: 42})
		waitFor(t, 10*time.Second, "placed", func() bool { _, _, ok := row(t, st, "order", "o-1"); return ok })
		send(t, b, Noted{Text: "gift"}, bus.WithAttribute("order-id", "o-1"))
		waitFor(t, 10*time.Second, "placed and noted", func() bool {
			state, _, ok := row(t, st, "order", "o-1")
			return ok && strings.Contains(state, "gift")
		})
		if n, err := st.ActiveSagas(t.Context(), "order"); err != nil || n != 1 {
			t.Fatalf("ActiveSagas = %d, %v; want 1", n, err)
		}
		// Paid twice with one message id: the inbox lets one through.
		send(t, b, Paid{OrderID: "o-1"}, bus.WithMessageID("paid-o-1"))
		send(t, b, Paid{OrderID: "o-1"}, bus.WithMessageID("paid-o-1"))
		waitFor(t, 10*time.Second, "paid", func() bool {
			state, _, _ := row(t, st, "order", "o-1")
			return strings.Contains(state, `"Paid":true`)
		})
		send(t, b, Shipped{OrderID: "o-1"})
		waitFor(t, 10*time.Second, "fulfilled", func() bool { f, _ := sk.counts("o-1"); return f == 1 })
		waitFor(t, 10*time.Second, "instance deleted", func() bool { _, _, ok := row(t, st, "order", "o-1"); return !ok })
		if n, err := st.ActiveSagas(t.Context(), "order"); err != nil || n != 0 {
			t.Fatalf("ActiveSagas after completion = %d, %v; want 0", n, err)
		}
		for _, name := range seen() {
			if name != "order" {
				t.Fatalf("handler-stage middleware saw handler %q; want the saga's name, order", name)
			}
		}
		if got := len(seen()); got < 4 {
			t.Fatalf("middleware saw %d handler runs, want at least 4", got)
		}
	})
}

// TestMissingInstance: a continuing message for no instance is ignored
// with an INFO log, or dead-lettered with its reason under
// WhenMissing(DeadLetter); a message without its correlation value is
// dead-lettered.
func TestMissingInstance(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		st := db.Open(t)
		broker := memory.NewBroker()
		logs := &testenv.LogBuffer{}
		b, _ := orderBus(t, st, memTransport(broker), orderSaga(st, time.Hour), logs, false)
		send(t, b, Paid{OrderID: "nobody"})
		send(t, b, Shipped{OrderID: "nobody"})
		send(t, b, Noted{Text: "no attribute"})
		waitFor(t, 10*time.Second, "two dead letters", func() bool { return len(broker.DeadLetters("orders")) == 2 })
		waitFor(t, 10*time.Second, "the INFO log", func() bool {
			return strings.Contains(logs.String(), "level=INFO msg=\"saga: no running instance for the message; ignored\"")
		})
		var reasons []string
		for _, dl := range broker.DeadLetters("orders") {
			reasons = append(reasons, dl.Envelope.Name+": "+dl.Failure.Reason)
		}
		joined := strings.Join(reasons, "\n")
		for _, want := range []string{`sagatests.shipped: bus: 1 handler(s) of sagatests.shipped failed: order: saga order: no running instance "nobody" for message sagatests.shipped (permanent failure`,
			`sagatests.noted: bus: 1 handler(s) of sagatests.noted failed: order: saga order: message sagatests.noted has no attribute "order-id"`} {
			if !strings.Contains(joined, want) {
				t.Errorf("dead letters:\n%s\nwant one with %q", joined, want)
			}
		}
		if _, _, ok := row(t, st, "order", "nobody"); ok {
			t.Fatal("a continuing message created an instance")
		}
	})
}

// TestRetention: a completed instance is kept for the retention, late
// messages do not restart it, and the cleanup deletes it after.
func TestRetention(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		st := db.Open(t)
		broker := memory.NewBroker()
		sk := newSink(t, memTransport(broker))
		s := orderSaga(st, time.Hour, saga.WithRetention(time.Second), saga.WithCleanupInterval(20*time.Millisecond))
		b, _ := orderBus(t, st, memTransport(broker), s, nil, false)
		send(t, b, Placed{OrderID: "o-2", Amount: 1})
		waitFor(t, 10*time.Second, "placed", func() bool { _, _, ok := row(t, st, "order", "o-2"); return ok })
		send(t, b, Paid{OrderID: "o-2"})
		waitFor(t, 10*time.Second, "paid", func() bool { state, _, _ := row(t, st, "order", "o-2"); return strings.Contains(state, `"Paid":true`) })
		send(t, b, Shipped{OrderID: "o-2"})
		waitFor(t, 10*time.Second, "fulfilled", func() bool { f, _ := sk.counts("o-2"); return f == 1 })
		state, completed, ok := row(t, st, "order", "o-2")
		if !ok || !completed {
			t.Fatalf("right after completion: exists %v completed %v; want it kept, completed", ok, completed)
		}
		var o Order
		if err := json.Unmarshal([]byte(state), &o); err != nil || !o.Shipped || o.Amount != 1 {
			t.Fatalf("kept state %s (%v); want shipped, amount 1", state, err)
		}
		waitFor(t, 10*time.Second, "purged after the retention", func() bool { _, _, ok := row(t, st, "order", "o-2"); return !ok })
	})
}

// TestLateStartIgnoredWhileKept: a starting message for a completed,
// kept instance does not start it again.
func TestLateStartIgnoredWhileKept(t *testing.T) {
	db := storetest.New(t, storetest.SQLite)
	st := db.Open(t)
	broker := memory.NewBroker()
	sk := newSink(t, memTransport(broker))
	logs := &testenv.LogBuffer{}
	b, _ := orderBus(t, st, memTransport(broker), orderSaga(st, time.Hour, saga.WithRetention(time.Hour)), logs, false)
	send(t, b, Placed{OrderID: "o-3"})
	waitFor(t, 10*time.Second, "placed", func() bool { _, _, ok := row(t, st, "order", "o-3"); return ok })
	send(t, b, Paid{OrderID: "o-3"})
	waitFor(t, 10*time.Second, "paid", func() bool { state, _, _ := row(t, st, "order", "o-3"); return strings.Contains(state, `"Paid":true`) })
	send(t, b, Shipped{OrderID: "o-3"})
	waitFor(t, 10*time.Second, "fulfilled", func() bool { f, _ := sk.counts("o-3"); return f == 1 })
	send(t, b, Placed{OrderID: "o-3", Amount: 99})
	waitFor(t, 10*time.Second, "ignored", func() bool {
		return strings.Contains(logs.String(), "saga: message for a completed instance; ignored")
	})
	state, completed, _ := row(t, st, "order", "o-3")
	if !completed || strings.Contains(state, "99") {
		t.Fatalf("state %s completed %v: the late start changed the kept instance", state, completed)
	}
}

// TestDeclarationErrors: bus.New fails with the saga's first declaration
// error.
func TestDeclarationErrors(t *testing.T) {
	db := storetest.New(t, storetest.SQLite)
	st := db.Open(t)
	for name, s := range map[string]*saga.Saga[Order]{
		"twice": func() *saga.Saga[Order] {
			s := saga.New[Order]("o", st)
			saga.StartedBy(s, saga.By(func(m Placed) string { return m.OrderID }), func(*saga.Context[Order], Placed) error { return nil })
			saga.Handles(s, saga.By(func(m Placed) string { return m.OrderID }), func(*saga.Context[Order], Placed) error { return nil })
			return s
		}(),
		"no correlation": func() *saga.Saga[Order] {
			s := saga.New[Order]("o", st)
			saga.StartedBy(s, saga.By[Placed](nil), func(*saga.Context[Order], Placed) error { return nil })
			return s
		}(),
		"empty": saga.New[Order]("o", st),
		"no StartedBy": func() *saga.Saga[Order] { // nothing starts an instance: every message ignored
			s := saga.New[Order]("o", st)
			saga.Handles(s, saga.By(func(m Paid) string { return m.OrderID }), func(*saga.Context[Order], Paid) error { return nil })
			return s
		}(),
		"name too long": func() *saga.Saga[Order] { // with a key, it would not fit PostgreSQL's index
			s := saga.New[Order](strings.Repeat("o", saga.MaxKeyLength+1), st)
			saga.StartedBy(s, saga.By(func(m Placed) string { return m.OrderID }), func(*saga.Context[Order], Placed) error { return nil })
			return s
		}(),
		"no store": func() *saga.Saga[Order] {
			s := saga.New[Order]("o", nil)
			saga.StartedBy(s, saga.By(func(m Placed) string { return m.OrderID }), func(*saga.Context[Order], Placed) error { return nil })
			return s
		}(),
	} {
		if _, err := bus.New(bus.WithEndpoint("x"), s.Option()); err == nil {
			t.Errorf("%s: bus.New succeeded", name)
		}
	}
}

// TestHandlerErrorRollsBack: a handler that fails leaves the state and
// its sends as they were; the message is retried and succeeds.
func TestHandlerErrorRollsBack(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		st := db.Open(t)
		broker := memory.NewBroker()
		sk := newSink(t, memTransport(broker))
		s := saga.New[Order]("flaky", st)
		var mu sync.Mutex
		fails := 1
		saga.StartedBy(s, saga.By(func(m Placed) string { return m.OrderID }), func(c *saga.Context[Order], m Placed) error {
			c.State.Amount += m.Amount
			if err := c.Send(Fulfilled{OrderID: m.OrderID}, bus.To("sink")); err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			if fails > 0 {
				fails--
				return errors.New("fails once after changing the state and sending")
			}
			return nil
		})
		b, _ := orderBus(t, st, memTransport(broker), s, nil, false)
		send(t, b, Placed{OrderID: "o-4", Amount: 5})
		waitFor(t, 10*time.Second, "fulfilled", func() bool { f, _ := sk.counts("o-4"); return f == 1 })
		state, _, _ := row(t, st, "flaky", "o-4")
		if !strings.Contains(state, `"Amount":5,`) {
			t.Fatalf("state %s; want Amount 5: the failed attempt's change must be rolled back", state)
		}
		var sent int
		q := db.Rebind("SELECT count(*) FROM " + db.Table("outbox") + " WHERE name = ?")
		if err := st.DB().QueryRowContext(t.Context(), q, Fulfilled{}.MessageName()).Scan(&sent); err != nil || sent != 1 {
			t.Fatalf("outbox holds %d Fulfilled (%v); want 1: the failed attempt's send must be rolled back", sent, err)
		}
	})
}
