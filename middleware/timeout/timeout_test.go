package timeout_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
	"github.com/plugbus/plugbus/middleware/internal/servedtest"
	"github.com/plugbus/plugbus/middleware/timeout"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type chargeCard struct{ OrderID string }

func (chargeCard) MessageName() string { return "billing.charge_card" }

func instantiate(t *testing.T, p bus.Plugin) bus.Middleware {
	t.Helper()
	m, err := p.Instantiate(bus.PluginInfo{})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// A handler that outlives its deadline fails with an error naming the
// handler, the message and the deadline, wrapping the handler's error.
func TestHandlerOutlivingItsDeadlineFailsWithTimeoutError(t *testing.T) {
	mw := instantiate(t, timeout.New(10*time.Millisecond))
	h := bustest.Handling("charge", chargeCard{OrderID: "o-1"}, bus.Attributes{})
	rec := bustest.RecordNextFunc(func(ctx context.Context) error {
		<-ctx.Done() // the deadline, not a sleep: the handler waits on its ctx
		return ctx.Err()
	})
	err := mw.Handling(t.Context(), h, rec.HandlingNext())
	var te *timeout.Error
	if !errors.As(err, &te) || te.Handler != "charge" || te.Message != "billing.charge_card" || te.After != 10*time.Millisecond {
		t.Fatalf("got %v, want a *timeout.Error for charge after 10ms", err)
	}
	if !errors.Is(err, timeout.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%v does not match ErrTimeout and context.DeadlineExceeded", err)
	}
	if want := "timeout: handler charge of billing.charge_card ran out of its 10ms deadline: context deadline exceeded"; err.Error() != want {
		t.Fatalf("text %q, want %q", err, want)
	}
}

// In time, the handler's result passes unchanged, and its ctx had the
// deadline.
func TestHandlerInTimeKeepsItsResult(t *testing.T) {
	mw := instantiate(t, timeout.New(time.Hour))
	errHandler := errors.New("card declined")
	for _, want := range []error{nil, errHandler} {
		rec := bustest.RecordNext(want)
		err := mw.Handling(t.Context(), bustest.Handling("charge", chargeCard{}, bus.Attributes{}), rec.HandlingNext())
		if err != want {
			t.Fatalf("got %v, want %v", err, want)
		}
		if dl, ok := rec.Ctx().Deadline(); !ok || time.Until(dl) < 59*time.Minute {
			t.Fatalf("next's ctx deadline %v (%v), want about an hour", dl, ok)
		}
	}
}

// An earlier deadline of the caller stays, and a failure at it is not
// reported as the timeout's.
func TestEarlierOuterDeadlineIsNotThisTimeout(t *testing.T) {
	mw := instantiate(t, timeout.New(time.Hour))
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Millisecond)
	defer cancel()
	rec := bustest.RecordNextFunc(func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
	err := mw.Handling(ctx, bustest.Handling("charge", chargeCard{}, bus.Attributes{}), rec.HandlingNext())
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, timeout.ErrTimeout) {
		t.Fatalf("got %v, want the outer deadline's error alone", err)
	}
}

func TestNewRefusesANonPositiveDeadline(t *testing.T) {
	if _, err := timeout.New(0).Instantiate(bus.PluginInfo{}); err == nil || !strings.Contains(err.Error(), "must be positive") {
		t.Fatalf("got %v", err)
	}
}

// On a bus: the handler given its own deadline fails with it and its
// message is dead-lettered with the timeout as the reason; the other
// handler, under the bus-level deadline, succeeds.
func TestOnABusPerHandlerAndBusLevel(t *testing.T) {
	tr := bustest.NewTransport()
	b := bustest.Start(t, bus.WithEndpoint("billing"), bus.WithTransport(tr), bus.WithMaxAttempts(1),
		bus.WithMiddleware(timeout.New(time.Hour)),
		bus.WithHandler(func(ctx context.Context, _ chargeCard, _ bus.Attributes) error {
			<-ctx.Done()
			return ctx.Err()
		}, bus.HandlerName("slow"), bus.HandlerMiddleware(timeout.New(20*time.Millisecond))),
		bus.WithHandler(func(ctx context.Context, _ chargeCard, _ bus.Attributes) error {
			if dl, ok := ctx.Deadline(); !ok || time.Until(dl) < time.Minute {
				return errors.New("no bus-level deadline")
			}
			return nil
		}, bus.HandlerName("fast")))
	if err := b.Send(t.Context(), chargeCard{OrderID: "o-1"}, bus.To("billing")); err != nil {
		t.Fatal(err)
	}
	settled, err := tr.WaitSettled(t.Context(), 1)
	if err != nil {
		t.Fatal(err)
	}
	want := "1 handler(s) of billing.charge_card failed: slow: timeout: handler slow of billing.charge_card ran out of its 20ms deadline"
	if s := settled[0]; s.Outcome != bustest.DeadLettered || !strings.Contains(s.Failure.Reason, want) {
		t.Fatalf("settled %s with %q, want dead-lettered with %q", s.Outcome, s.Failure.Reason, want)
	}
}

// Served from another process, the deadline crosses to the host, which
// runs the handler under it: the plugin reports the timeout.
func TestOutOfProcess(t *testing.T) {
	p := servedtest.Load(t, `{"middleware": "timeout", "duration": "30ms"}`)
	tr := bustest.NewTransport()
	b := bustest.Start(t, bus.WithEndpoint("billing"), bus.WithTransport(tr), bus.WithMaxAttempts(1),
		bus.WithHandler(func(ctx context.Context, _ chargeCard, _ bus.Attributes) error {
			dl, ok := ctx.Deadline()
			if !ok || time.Until(dl) > 30*time.Millisecond {
				return bus.Permanent(errors.New("no deadline from the plugin"))
			}
			<-ctx.Done()
			return ctx.Err()
		}, bus.HandlerName("slow"), bus.HandlerMiddleware(p)))
	if err := b.Send(t.Context(), chargeCard{OrderID: "o-1"}, bus.To("billing")); err != nil {
		t.Fatal(err)
	}
	settled, err := tr.WaitSettled(t.Context(), 1)
	if err != nil {
		t.Fatal(err)
	}
	want := "timeout: handler slow of billing.charge_card ran out of its 30ms deadline: context deadline exceeded"
	if s := settled[0]; s.Outcome != bustest.DeadLettered || !strings.Contains(s.Failure.Reason, want) {
		t.Fatalf("settled %s with %q, want dead-lettered with %q", s.Outcome, s.Failure.Reason, want)
	}
}
