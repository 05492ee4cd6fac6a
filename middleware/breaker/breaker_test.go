package breaker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
	"github.com/plugbus/plugbus/middleware/breaker"
	"github.com/sony/gobreaker/v2"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type chargeCard struct{ OrderID string }

func (chargeCard) MessageName() string { return "billing.charge_card" }

var errDown = errors.New("payment provider down")

// tripAfter2 opens after 2 failures in a row, for timeout.
func tripAfter2(timeout time.Duration) breaker.Option {
	return breaker.WithSettings(gobreaker.Settings{Timeout: timeout, ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= 2 }})
}

func instantiate(t *testing.T, p bus.Plugin, info bus.PluginInfo) bus.Middleware {
	t.Helper()
	m, err := p.Instantiate(info)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func run(mw bus.Middleware, handler string, result error) (*bustest.NextRecorder, error) {
	rec := bustest.RecordNext(result)
	return rec, mw.Handling(context.Background(), bustest.Handling(handler, chargeCard{OrderID: "o-1"}, bus.Attributes{}), rec.HandlingNext())
}

// After enough failures the breaker opens: the handler does not run and
// the message is returned with a delay between half and all of the retry
// delay, with an OpenError naming the handler.
func TestOpenBreakerReturnsMessagesWithADelay(t *testing.T) {
	mw := instantiate(t, breaker.New(tripAfter2(time.Hour), breaker.WithRetryDelay(time.Minute)), bus.PluginInfo{})
	for range 2 {
		if _, err := run(mw, "charge", errDown); err != errDown {
			t.Fatalf("closed: got %v, want the handler's error unchanged", err)
		}
	}
	rec, err := run(mw, "charge", nil)
	var ra *bus.RetryAfterError
	var oe *breaker.OpenError
	if rec.Called() || !errors.As(err, &ra) || !errors.As(err, &oe) {
		t.Fatalf("open: next called %v, err %v; want no call and a RetryAfter with an OpenError", rec.Called(), err)
	}
	if ra.Delay < 30*time.Second || ra.Delay > time.Minute {
		t.Fatalf("delay %v, want between 30s and 1m", ra.Delay)
	}
	if oe.Handler != "charge" || oe.State != gobreaker.StateOpen || !errors.Is(err, gobreaker.ErrOpenState) || !errors.Is(err, breaker.ErrOpen) {
		t.Fatalf("open error %+v", oe)
	}
	if want := "breaker: circuit of handler charge is open; message billing.charge_card held back"; !strings.Contains(err.Error(), want) {
		t.Fatalf("text %q, want %q", err, want)
	}
	// Another handler of the bus has a breaker of its own.
	if rec, err := run(mw, "email", nil); err != nil || !rec.Called() {
		t.Fatalf("other handler: err %v, called %v", err, rec.Called())
	}
}

// Permanent failures say the message is wrong, not the dependency: they
// do not open the breaker; neither do interrupted runs nor returns asked
// for by middleware inside.
func TestPermanentAndInterruptedFailuresDoNotTrip(t *testing.T) {
	mw := instantiate(t, breaker.New(tripAfter2(time.Hour)), bus.PluginInfo{})
	for _, err := range []error{bus.Permanent(errDown), context.Canceled, bus.RetryAfter(errDown, time.Second), bus.Permanent(errDown), context.Canceled} {
		if _, got := run(mw, "charge", err); got != err {
			t.Fatalf("got %v, want %v", got, err)
		}
	}
	if rec, err := run(mw, "charge", nil); err != nil || !rec.Called() {
		t.Fatalf("breaker opened: %v", err)
	}
}

// A panicking handler counts as a failure and the panic goes on.
func TestPanicCountsAsAFailure(t *testing.T) {
	mw := instantiate(t, breaker.New(tripAfter2(time.Hour)), bus.PluginInfo{Handler: "charge"})
	for range 2 {
		func() {
			defer func() {
				if recover() == nil {
					t.Fatal("the panic did not go on")
				}
			}()
			_ = mw.Handling(context.Background(), bustest.Handling("charge", chargeCard{}, bus.Attributes{}), bus.NewHandlingNext(func(context.Context) error { panic("boom") }))
		}()
	}
	if _, err := run(mw, "charge", nil); !errors.Is(err, breaker.ErrOpen) {
		t.Fatalf("got %v, want the breaker open after two panics", err)
	}
}

// On a bus, while the provider is down the breaker opens; the messages
// that arrive then are returned with a delay, not dead-lettered, and
// handled once the breaker half-opens and the provider is back. A handler
// without the breaker is not held back.
func TestOnABusMessagesWaitOutTheOutage(t *testing.T) {
	tr := bustest.NewTransport()
	var down atomic.Bool
	down.Store(true)
	var other atomic.Int32
	// The breaker stays open for a second, far longer than it takes to
	// send and receive o-3 even on a loaded machine (open for only the
	// retry delay, it could half-open before o-3 arrives, which is then
	// never returned); o-3 is returned every 15-30ms meanwhile.
	b := bustest.Start(t, bus.WithEndpoint("billing"), bus.WithTransport(tr), bus.WithMaxAttempts(1), bus.WithConcurrency(1),
		bus.WithHandler(func(context.Context, chargeCard, bus.Attributes) error {
			if down.Load() {
				return errDown
			}
			return nil
		}, bus.HandlerName("charge"), bus.HandlerMiddleware(breaker.New(tripAfter2(time.Second), breaker.WithRetryDelay(30*time.Millisecond)))),
		bus.WithHandler(func(context.Context, chargeCard, bus.Attributes) error { other.Add(1); return nil }, bus.HandlerName("receipt")))
	send := func(id string) {
		t.Helper()
		if err := b.Send(t.Context(), chargeCard{OrderID: id}, bus.To("billing")); err != nil {
			t.Fatal(err)
		}
	}
	send("o-1")
	send("o-2")
	if _, err := tr.WaitSettled(t.Context(), 2); err != nil { // both failed: dead-lettered (1 attempt)
		t.Fatal(err)
	}
	down.Store(false) // back, but the breaker is open for a second
	send("o-3")
	if err := tr.WaitIdle(t.Context()); err != nil {
		t.Fatal(err)
	}
	var outcomes []string
	returned := 0
	for _, s := range tr.Settled() {
		outcomes = append(outcomes, s.Outcome.String())
		if s.Outcome == bustest.Returned {
			returned++
			if !errors.Is(s.Cause, breaker.ErrOpen) || s.Delay < 15*time.Millisecond || s.Delay > 30*time.Millisecond {
				t.Fatalf("returned with %v after %v, want the open breaker, after 15-30ms", s.Cause, s.Delay)
			}
		}
	}
	last := tr.Settled()[len(tr.Settled())-1]
	if returned == 0 || last.Outcome != bustest.Deleted || string(last.Envelope.Body) != `{"OrderID":"o-3"}` {
		t.Fatalf("settled %v, want o-1 and o-2 dead-lettered, o-3 returned and then handled", outcomes)
	}
	if n := other.Load(); n < 3 {
		t.Fatalf("the handler without the breaker ran %d times, want every delivery", n)
	}
}

// A negative retry delay, or one so short that its jitter rounds to no
// delay (a message held back would come straight back, round after
// round, while the breaker is open), is refused.
func TestNewRefusesARetryDelayBelowAMillisecond(t *testing.T) {
	for _, d := range []time.Duration{-time.Second, time.Nanosecond, time.Millisecond - 1} {
		if _, err := breaker.New(breaker.WithRetryDelay(d)).Instantiate(bus.PluginInfo{}); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("WithRetryDelay(%v)", d)) {
			t.Errorf("WithRetryDelay(%v): %v, want an error naming it", d, err)
		}
	}
	if _, err := breaker.New(breaker.WithRetryDelay(time.Millisecond)).Instantiate(bus.PluginInfo{}); err != nil {
		t.Errorf("WithRetryDelay(1ms): %v", err)
	}
}

type refundIssued struct{ OrderID string }

func (refundIssued) MessageName() string { return "billing.refund_issued" }

// "At the bus level each handler gets a breaker of its own." The bus lets
// two handlers of different messages share a name (names are unique per
// message); the failing handler of one message must not hold back the
// healthy handler of the other.
func TestHandlersOfTwoMessagesWithOneNameHaveABreakerEach(t *testing.T) {
	tr := bustest.NewTransport()
	b := bustest.Start(t, bus.WithEndpoint("billing"), bus.WithTransport(tr), bus.WithConcurrency(1), bus.WithMaxAttempts(2),
		bus.WithMiddleware(breaker.New(tripAfter2(time.Hour))),
		bus.WithHandler(func(context.Context, chargeCard, bus.Attributes) error { return errDown }, bus.HandlerName("notify")),
		bus.WithHandler(func(context.Context, refundIssued, bus.Attributes) error { return nil }, bus.HandlerName("notify")))
	ctx := t.Context()
	if err := b.Send(ctx, chargeCard{OrderID: "o-1"}, bus.To("billing")); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.WaitSettled(ctx, 2); err != nil { // failed twice: chargeCard's breaker opens
		t.Fatal(err)
	}
	if err := b.Send(ctx, refundIssued{OrderID: "o-2"}, bus.To("billing")); err != nil {
		t.Fatal(err)
	}
	settled, err := tr.WaitSettled(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if s := settled[2]; s.Outcome != bustest.Deleted {
		t.Fatalf("refund (a healthy handler of another message) %s: %v; want handled", s.Outcome, s.Cause)
	}
}
