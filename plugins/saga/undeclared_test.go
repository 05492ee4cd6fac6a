package saga_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugins/saga"
	"github.com/plugbus/plugbus/plugins/saga/sagatest"
	"github.com/plugbus/plugbus/store"
	"github.com/plugbus/plugbus/store/storetest"
	"github.com/plugbus/plugbus/transports/memory"
)

// forgetfulSaga requests a timeout of a message it does not declare with
// HandlesTimeout: Cancelled not at all, Paid with Handles.
func forgetfulSaga(st *store.Store, timeout bus.Message) *saga.Saga[Order] {
	s := saga.New[Order]("order", st)
	saga.StartedBy(s, saga.By(func(m Placed) string { return m.OrderID }), func(c *saga.Context[Order], m Placed) error {
		return c.RequestTimeout(time.Hour, timeout)
	})
	saga.Handles(s, saga.By(func(m Paid) string { return m.OrderID }), func(c *saga.Context[Order], m Paid) error { return nil })
	saga.HandlesTimeout(s, func(c *saga.Context[Order], m PaymentOverdue) error { return nil })
	return s
}

// TestRequestTimeoutOfAnUndeclaredMessageIsRefused: a timeout whose
// message the saga does not declare with HandlesTimeout would find no
// handler when it falls due (dead-lettered an hour later, or run as an
// ordinary message): RequestTimeout refuses it at once with a permanent
// *UndeclaredTimeoutError saying what to declare, and nothing is sent.
func TestRequestTimeoutOfAnUndeclaredMessageIsRefused(t *testing.T) {
	for _, tc := range []struct {
		timeout bus.Message
		want    string
	}{
		{Cancelled{OrderID: "o-1"}, "saga order: RequestTimeout(sagatests.cancelled): no handler for it: declare it with saga.HandlesTimeout"},
		{Paid{OrderID: "o-1"}, "saga order: RequestTimeout(sagatests.paid): the message is declared with Handles, not as a timeout"},
		{Placed{OrderID: "o-1"}, "saga order: RequestTimeout(sagatests.placed): the message is declared with StartedBy, not as a timeout"},
	} {
		h := sagatest.New(forgetfulSaga(nil, tc.timeout), time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
		err := h.Deliver(Placed{OrderID: "o-1"})
		var undeclared *saga.UndeclaredTimeoutError
		if !errors.As(err, &undeclared) || !errors.Is(err, saga.ErrUndeclaredTimeout) || !bus.IsPermanent(err) {
			t.Fatalf("RequestTimeout(%T) = %v; want a permanent *saga.UndeclaredTimeoutError", tc.timeout, err)
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error %q; want it to contain %q", err, tc.want)
		}
		if n := len(h.Timeouts()); n != 0 {
			t.Errorf("%d timeouts pending; want none", n)
		}
	}

	// A declared timeout still goes.
	h := sagatest.New(forgetfulSaga(nil, PaymentOverdue{OrderID: "o-1"}), time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	if err := h.Deliver(Placed{OrderID: "o-1"}); err != nil || len(h.Timeouts()) != 1 {
		t.Fatalf("a declared timeout: %v, %d pending; want it requested", err, len(h.Timeouts()))
	}

	// On a bus, the message that asked is dead-lettered on its first
	// attempt with the reason.
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		st := db.Open(t)
		broker := memory.NewBroker()
		b, _ := orderBus(t, st, memTransport(broker), forgetfulSaga(st, Cancelled{OrderID: "o-1"}), nil, false)
		send(t, b, Placed{OrderID: "o-1"})
		waitFor(t, 10*time.Second, "the dead letter", func() bool { return len(broker.DeadLetters("orders")) == 1 })
		dl := broker.DeadLetters("orders")[0]
		if dl.Failure.Attempts != 1 || !strings.Contains(dl.Failure.Reason, "declare it with saga.HandlesTimeout") {
			t.Fatalf("dead letter after %d attempts, reason %q; want the first, naming HandlesTimeout", dl.Failure.Attempts, dl.Failure.Reason)
		}
		if _, _, ok := row(t, st, "order", "o-1"); ok {
			t.Fatal("the instance was saved though its handler failed")
		}
	})
}
