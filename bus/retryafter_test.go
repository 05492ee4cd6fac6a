package bus_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
)

var errBusy = errors.New("dependency busy")

// A message whose handler asks to be retried later is returned with that
// delay, even on its last attempt, without a failure in its history, and
// handled when it comes back.
func TestRetryAfterReturnsWithTheDelayOutsideThePolicy(t *testing.T) {
	var calls atomic.Int32
	e := newEnv(t, nil, bus.WithMaxAttempts(1),
		bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error {
			if calls.Add(1) == 1 {
				return bus.RetryAfter(errBusy, 20*time.Millisecond)
			}
			return nil
		}))
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}); err != nil {
		t.Fatal(err)
	}
	s := e.expect(bustest.Returned)
	if s.Delay != 20*time.Millisecond || !errors.Is(s.Cause, bus.ErrRetryAfter) || !errors.Is(s.Cause, errBusy) {
		t.Fatalf("returned with delay %v, cause %v; want 20ms and the RetryAfter error", s.Delay, s.Cause)
	}
	s = e.expect(bustest.Deleted)
	if s.Attempt != 2 {
		t.Fatalf("handled on attempt %d, want 2 (a return counts as a delivery)", s.Attempt)
	}
	if !strings.Contains(e.logs.String(), "message returned to be tried again later") {
		t.Fatalf("no INFO log of the return:\n%s", e.logs)
	}
}

// The history of a message returned for later records no failure: the
// policy's rounds are left whole for real failures.
func TestRetryAfterLeavesTheRetryHistoryUntouched(t *testing.T) {
	var calls atomic.Int32
	e := newEnv(t, nil, bus.WithMaxAttempts(2),
		bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error {
			if calls.Add(1) == 1 {
				return bus.RetryAfter(errBusy, time.Millisecond)
			}
			return errors.New("real failure")
		}))
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}); err != nil {
		t.Fatal(err)
	}
	e.expect(bustest.Returned)
	s := e.expect(bustest.DeadLettered) // attempt 2 of 2: the policy is used up
	if h := s.Failure.History; len(h.Errors) != 1 || !strings.Contains(h.Errors[0], "real failure") {
		t.Fatalf("history %+v, want the real failure alone", h)
	}
}

// A return for later uses up no immediate retry either: the first real
// failure after it still gets the round's immediate retry, not a delayed
// round (with a delay, and with none).
func TestRetryAfterUsesUpNoImmediateRetry(t *testing.T) {
	for _, after := range []time.Duration{time.Millisecond, 0} {
		t.Run(fmt.Sprint(after), func(t *testing.T) {
			var calls atomic.Int32
			e := newEnv(t, nil,
				bus.WithRetry(bus.RetryPolicy{Immediate: 1, Delayed: 1, Backoff: bus.Backoff{Initial: time.Hour, Max: time.Hour}}),
				bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error {
					switch calls.Add(1) {
					case 1:
						return bus.RetryAfter(errBusy, after) // tried nothing: a breaker is open, say
					case 2:
						return errors.New("deadlock detected") // the first real failure
					}
					return nil
				}))
			if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}); err != nil {
				t.Fatal(err)
			}
			if s := e.expect(bustest.Returned); s.Delay != after {
				t.Fatalf("attempt 1 returned after %v, want %v (RetryAfter)", s.Delay, after)
			}
			if s := e.expect(bustest.Returned); s.Delay != 0 {
				t.Fatalf("attempt %d, the first real failure, returned for a delayed round (after %v); want its immediate retry", s.Attempt, s.Delay)
			}
			e.expect(bustest.Deleted)
		})
	}
}

// Mixed failures, a permanent one, and a transport that cannot delay
// leave the decision to the policy.
func TestRetryAfterOnlyWhenEveryFailureAsksAndTheTransportDelays(t *testing.T) {
	t.Run("one of two handlers", func(t *testing.T) {
		e := newEnv(t, nil, bus.WithMaxAttempts(1),
			bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error { return bus.RetryAfter(errBusy, time.Hour) }, bus.HandlerName("x")),
			bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error { return errors.New("broken") }, bus.HandlerName("y")))
		if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}); err != nil {
			t.Fatal(err)
		}
		e.expect(bustest.DeadLettered)
	})
	t.Run("two handlers: the longest delay", func(t *testing.T) {
		var calls atomic.Int32
		e := newEnv(t, nil, bus.WithMaxAttempts(1),
			bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error {
				if calls.Add(1) <= 2 {
					return bus.RetryAfter(errBusy, time.Millisecond)
				}
				return nil
			}, bus.HandlerName("x")),
			bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error {
				if calls.Add(1) <= 2 {
					return bus.RetryAfter(errBusy, 30*time.Millisecond)
				}
				return nil
			}, bus.HandlerName("y")))
		if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}); err != nil {
			t.Fatal(err)
		}
		if s := e.expect(bustest.Returned); s.Delay != 30*time.Millisecond {
			t.Fatalf("delay %v, want the longest, 30ms", s.Delay)
		}
		e.expect(bustest.Deleted)
	})
	t.Run("permanent", func(t *testing.T) {
		e := newEnv(t, nil,
			bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error {
				return bus.RetryAfter(bus.Permanent(errBusy), time.Hour)
			}))
		if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}); err != nil {
			t.Fatal(err)
		}
		e.expect(bustest.DeadLettered)
	})
	t.Run("no delayer", func(t *testing.T) {
		e := newEnvOver(t, nil, func(r *bustest.Transport) bus.Transport { return struct{ bus.Transport }{r} }, bus.WithMaxAttempts(1),
			bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error { return bus.RetryAfter(errBusy, time.Hour) }))
		if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}); err != nil {
			t.Fatal(err)
		}
		e.expect(bustest.DeadLettered)
	})
}

// RetryAfter(nil) is nil; the error reads as its cause and the delay.
func TestRetryAfterError(t *testing.T) {
	if bus.RetryAfter(nil, time.Second) != nil {
		t.Fatal("RetryAfter(nil) is not nil")
	}
	err := bus.RetryAfter(errBusy, time.Second)
	var ra *bus.RetryAfterError
	if !errors.As(err, &ra) || ra.Delay != time.Second || errors.Unwrap(err) != errBusy || err.Error() != "dependency busy (returned to be tried again after 1s)" {
		t.Fatalf("got %v", err)
	}
}

type cappedMsg struct{ ID string }

func (cappedMsg) MessageName() string { return "test.capped" }

// cappedTransport delivers a message with its Attempt capped at the
// policy's MaxAttempts, as SQS does (prior is cut to MaxAttempts-1 and the
// copy's receive count adds 1).
type cappedTransport struct {
	*bustest.Transport
	max int
}

func (c cappedTransport) Receive(ctx context.Context) (*bus.Delivery, error) {
	d, err := c.Transport.Receive(ctx)
	if d != nil {
		d.Attempt = min(d.Attempt, c.max)
	}
	return d, err
}

// A return for later on a delivery at the transport's last attempt, which
// a transport that caps the attempts (SQS) delivers again as that same
// attempt, keeps the history trusted: the dead letter still carries the
// failures before it.
func TestRetryAfterAtTheLastAttemptKeepsTheHistory(t *testing.T) {
	rec := bustest.NewTransport()
	var calls atomic.Int32
	b := bustest.Start(t, bus.WithEndpoint("rev"), bus.WithTransport(cappedTransport{rec, 2}),
		bus.WithRetry(bus.RetryPolicy{Immediate: 1}),
		bus.WithHandler(func(context.Context, cappedMsg, bus.Attributes) error {
			switch calls.Add(1) {
			case 1:
				return errors.New("first real failure")
			case 2, 3:
				return bus.RetryAfter(errors.New("breaker open"), 0)
			}
			return errors.New("second real failure")
		}))
	if err := b.Send(t.Context(), cappedMsg{ID: "1"}, bus.To("rev")); err != nil {
		t.Fatal(err)
	}
	s, err := rec.WaitSettled(t.Context(), 4)
	if err != nil {
		t.Fatal(err)
	}
	last := s[3]
	if last.Outcome != bustest.DeadLettered {
		t.Fatalf("outcome %s", last.Outcome)
	}
	if !slices.ContainsFunc(last.Failure.History.Errors, func(e string) bool { return strings.Contains(e, "first real failure") }) {
		t.Errorf("dead letter's history lost the first failure: %v", last.Failure.History.Errors)
	}
}
