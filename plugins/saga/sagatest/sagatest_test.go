package sagatest_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugins/saga"
	"github.com/plugbus/plugbus/plugins/saga/sagatest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type (
	Placed         struct{ OrderID string }
	Paid           struct{ OrderID string }
	PaymentOverdue struct{ OrderID string }
	Cancelled      struct{ OrderID string }
)

func (Placed) MessageName() string         { return "t.placed" }
func (Paid) MessageName() string           { return "t.paid" }
func (PaymentOverdue) MessageName() string { return "t.overdue" }
func (Cancelled) MessageName() string      { return "t.cancelled" }

type Order struct {
	Paid      bool
	PlacedAt  time.Time
	Reminders int
}

func orders() *saga.Saga[Order] {
	s := saga.New[Order]("order", nil)
	saga.StartedBy(s, saga.By(func(m Placed) string { return m.OrderID }), func(c *saga.Context[Order], m Placed) error {
		c.State.PlacedAt = c.Now()
		return c.RequestTimeout(30*time.Minute, PaymentOverdue(m))
	})
	saga.Handles(s, saga.By(func(m Paid) string { return m.OrderID }), func(c *saga.Context[Order], m Paid) error {
		c.State.Paid = true
		c.Complete()
		return nil
	}, saga.WhenMissing(saga.DeadLetter))
	saga.HandlesTimeout(s, func(c *saga.Context[Order], m PaymentOverdue) error {
		c.Complete()
		return c.Publish(Cancelled(m))
	})
	return s
}

var epoch = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

func TestTimeoutCancelsUnpaidOrder(t *testing.T) {
	h := sagatest.New(orders(), epoch)
	if err := h.Deliver(Placed{OrderID: "o-1"}); err != nil {
		t.Fatal(err)
	}
	if s, ok := h.State("o-1"); !ok || !s.PlacedAt.Equal(epoch) {
		t.Fatalf("state %+v %v; want placed at the harness's clock", s, ok)
	}
	if ts := h.Timeouts(); len(ts) != 1 || !ts[0].Due.Equal(epoch.Add(30*time.Minute)) || ts[0].Key != "o-1" {
		t.Fatalf("timeouts %+v; want one due in 30m for o-1", ts)
	}
	if err := h.Advance(29 * time.Minute); err != nil {
		t.Fatal(err)
	}
	if len(h.Messages()) != 0 || !h.Running("o-1") {
		t.Fatal("the timeout fired early")
	}
	if err := h.Advance(time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := h.Messages(); len(got) != 1 || got[0] != (Cancelled{OrderID: "o-1"}) {
		t.Fatalf("sent %v; want Cancelled o-1", got)
	}
	if h.Running("o-1") {
		t.Fatal("the cancelled order still runs")
	}
	if e := h.Sent()[0]; e.Kind != saga.EffectPublish {
		t.Fatalf("effect kind %s; want publish", e.Kind)
	}
	if !h.Now().Equal(epoch.Add(30 * time.Minute)) {
		t.Fatalf("clock %s; want 30m after the start", h.Now())
	}
}

func TestPaidOrderIgnoresItsTimeout(t *testing.T) {
	h := sagatest.New(orders(), epoch)
	for _, m := range []bus.Message{Placed{OrderID: "o-2"}, Paid{OrderID: "o-2"}} {
		if err := h.Deliver(m); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := h.State("o-2"); ok {
		t.Fatal("the completed order is still kept (no retention)")
	}
	if err := h.Advance(time.Hour); err != nil {
		t.Fatal(err)
	}
	if got := h.Messages(); len(got) != 0 {
		t.Fatalf("sent %v after the paid order's timeout; want nothing", got)
	}
	if len(h.Timeouts()) != 0 {
		t.Fatal("the timeout is still pending after its due time")
	}
}

func TestMissingInstanceIsDeadLettered(t *testing.T) {
	h := sagatest.New(orders(), epoch)
	err := h.Deliver(Paid{OrderID: "nobody"})
	if !errors.Is(err, saga.ErrNotFound) || !bus.IsPermanent(err) {
		t.Fatalf("Deliver = %v; want a permanent saga.ErrNotFound", err)
	}
}

func TestAttributeCorrelation(t *testing.T) {
	s := saga.New[Order]("tagged", nil, saga.WithRetention(time.Hour))
	saga.StartedBy(s, saga.ByAttribute[Placed]("tenant"), func(c *saga.Context[Order], m Placed) error {
		c.State.Reminders++
		return nil
	})
	h := sagatest.New(s, epoch)
	for range 2 {
		if err := h.Deliver(Placed{OrderID: "x"}, sagatest.WithAttribute("tenant", "acme")); err != nil {
			t.Fatal(err)
		}
	}
	if st, ok := h.State("acme"); !ok || st.Reminders != 2 {
		t.Fatalf("state %+v %v; want 2 messages on instance acme", st, ok)
	}
	if err := h.Deliver(Placed{OrderID: "x"}); !errors.Is(err, saga.ErrCorrelation) {
		t.Fatalf("Deliver without the attribute = %v; want saga.ErrCorrelation", err)
	}
}

// TestKeyLongerThanTheLimitIsRefused: as on a bus, a correlation value
// longer than saga.MaxKeyLength fails permanently with a
// *saga.CorrelationError, from a field, an attribute or a timeout's
// AttrKey, and one of saga.MaxKeyLength bytes starts an instance.
func TestKeyLongerThanTheLimitIsRefused(t *testing.T) {
	s := orders()
	saga.Handles(s, saga.ByAttribute[Cancelled]("order-id"), func(*saga.Context[Order], Cancelled) error { return nil })
	h := sagatest.New(s, epoch)
	longest, tooLong := strings.Repeat("k", saga.MaxKeyLength), strings.Repeat("k", saga.MaxKeyLength+1)
	for what, deliver := range map[string]func() error{
		"field":     func() error { return h.Deliver(Placed{OrderID: tooLong}) },
		"attribute": func() error { return h.Deliver(Cancelled{}, sagatest.WithAttribute("order-id", tooLong)) },
		"timeout": func() error {
			return h.Deliver(PaymentOverdue{}, sagatest.WithAttribute(saga.AttrSaga, "order"), sagatest.WithAttribute(saga.AttrKey, tooLong))
		},
	} {
		err := deliver()
		var ce *saga.CorrelationError
		if !errors.As(err, &ce) || ce.Value != tooLong || ce.Limit != saga.MaxKeyLength || !bus.IsPermanent(err) {
			t.Errorf("%s: Deliver = %.200v; want a permanent *saga.CorrelationError with the value and the limit", what, err)
		} else if want := fmt.Sprintf("is %d bytes long, longer than the limit of %d bytes", len(tooLong), saga.MaxKeyLength); !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %q; want it to say %q", what, err, want)
		}
	}
	if err := h.Deliver(Placed{OrderID: longest}); err != nil {
		t.Fatal(err)
	}
	if !h.Running(longest) || h.Running(tooLong) {
		t.Fatalf("running: the longest key %v, the key too long %v; want only the longest", h.Running(longest), h.Running(tooLong))
	}
}

// TestHarnessRefusesWhatABusRefuses: a publish with bus.To and a nil
// message fail the handler with the bus's errors, as on a bus, and the
// harness records nothing of them.
func TestHarnessRefusesWhatABusRefuses(t *testing.T) {
	s := saga.New[Order]("refusing", nil)
	saga.StartedBy(s, saga.By(func(m Placed) string { return m.OrderID }), func(c *saga.Context[Order], m Placed) error {
		return c.Publish(Cancelled(m), bus.To("billing"))
	})
	saga.StartedBy(s, saga.By(func(m Paid) string { return m.OrderID }), func(c *saga.Context[Order], m Paid) error {
		return c.RequestTimeout(time.Minute, (*PaymentOverdue)(nil))
	})
	h := sagatest.New(s, epoch)
	if err := h.Deliver(Placed{OrderID: "o-1"}); !errors.Is(err, bus.ErrInvalidOption) {
		t.Errorf("Publish with bus.To: Deliver = %v; want bus.ErrInvalidOption", err)
	}
	if err := h.Deliver(Paid{OrderID: "o-1"}); !errors.Is(err, bus.ErrInvalidMessage) {
		t.Errorf("RequestTimeout of a nil message: Deliver = %v; want bus.ErrInvalidMessage", err)
	}
	if len(h.Sent()) != 0 || len(h.Timeouts()) != 0 || h.Running("o-1") {
		t.Fatalf("sent %v, timeouts %v, running %v; want nothing", h.Sent(), h.Timeouts(), h.Running("o-1"))
	}
	// Nor does it deliver what a bus's Send refuses: a nil message, a nil
	// pointer (whose MessageName would panic).
	for _, m := range []bus.Message{nil, (*PaymentOverdue)(nil)} {
		if err := h.Deliver(m); !errors.Is(err, bus.ErrInvalidMessage) {
			t.Errorf("Deliver(%#v) = %v; want bus.ErrInvalidMessage", m, err)
		}
	}
}

func TestFailedHandlerChangesNothing(t *testing.T) {
	s := saga.New[Order]("failing", nil)
	saga.StartedBy(s, saga.By(func(m Placed) string { return m.OrderID }), func(c *saga.Context[Order], m Placed) error {
		c.State.Reminders++
		if err := c.Send(Cancelled(m)); err != nil {
			return err
		}
		return errors.New("boom")
	})
	h := sagatest.New(s, epoch)
	if err := h.Deliver(Placed{OrderID: "f"}); err == nil {
		t.Fatal("Deliver succeeded")
	}
	if _, ok := h.State("f"); ok || len(h.Messages()) != 0 {
		t.Fatal("a failed handler created an instance or sent")
	}
}

// TestFailedTimeoutStaysPending: a timeout whose handler fails is not
// lost (on a bus it would be retried): Advance returns the error with the
// clock at the timeout's due time, the timeout is still pending, and the
// next Advance delivers it again.
func TestFailedTimeoutStaysPending(t *testing.T) {
	fail := true
	s := saga.New[Order]("flaky-timeout", nil)
	saga.StartedBy(s, saga.By(func(m Placed) string { return m.OrderID }), func(c *saga.Context[Order], m Placed) error {
		return c.RequestTimeout(time.Minute, PaymentOverdue(m))
	})
	saga.HandlesTimeout(s, func(c *saga.Context[Order], m PaymentOverdue) error {
		if fail {
			return errors.New("database down")
		}
		c.Complete()
		return c.Publish(Cancelled(m))
	})
	h := sagatest.New(s, epoch)
	if err := h.Deliver(Placed{OrderID: "o-3"}); err != nil {
		t.Fatal(err)
	}
	if err := h.Advance(time.Hour); err == nil {
		t.Fatal("Advance hid the timeout handler's error")
	}
	if !h.Now().Equal(epoch.Add(time.Minute)) {
		t.Fatalf("clock %s after the failed timeout; want its due time", h.Now())
	}
	if ts := h.Timeouts(); len(ts) != 1 || ts[0].Key != "o-3" {
		t.Fatalf("timeouts after a failed delivery: %+v; want the failed one still pending", ts)
	}
	fail = false
	if err := h.Advance(0); err != nil {
		t.Fatal(err)
	}
	if got := h.Messages(); len(got) != 1 || got[0] != (Cancelled{OrderID: "o-3"}) || h.Running("o-3") {
		t.Fatalf("sent %v, running %v; want the timeout delivered again and the order cancelled", got, h.Running("o-3"))
	}
}
