package bus_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/memory"
)

type refund struct{ ID string }

func (refund) MessageName() string { return "shop.refund" }

// delayRecorder is a memory transport that records the delays the bus
// asks for and reports dead letters.
type delayRecorder struct {
	*memory.Transport
	mu     sync.Mutex
	delays []time.Duration
	asked  chan time.Duration
	failed chan bus.Failure
	// returning, when set (before the bus starts), runs in ReturnAfter
	// before the message is handed back: what it changes is seen by the
	// delivery after the delay, which a test told on asked may not reach
	// in time (a delay drawn with jitter can be next to nothing).
	returning func()
}

func newDelayRecorder() *delayRecorder {
	return &delayRecorder{Transport: memory.New(), asked: make(chan time.Duration, 1024), failed: make(chan bus.Failure, 1024)}
}

func (r *delayRecorder) Fail(ctx context.Context, d *bus.Delivery, f bus.Failure) error {
	err := r.Transport.Fail(ctx, d, f)
	r.failed <- f
	return err
}

// attemptsOf is a handler-stage middleware sending each handled attempt to
// the channel it returns.
func attemptsOf() (bus.Middleware, chan int) {
	seen := make(chan int, 1024)
	return bus.Middleware{Name: "attempts", Handling: func(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
		seen <- h.Attempt()
		return next.Call(ctx)
	}}, seen
}

func (r *delayRecorder) ReturnAfter(ctx context.Context, d *bus.Delivery, cause error, delay time.Duration) error {
	r.mu.Lock()
	r.delays = append(r.delays, delay)
	r.mu.Unlock()
	r.asked <- delay
	if r.returning != nil {
		r.returning()
	}
	return r.Transport.ReturnAfter(ctx, d, cause, delay)
}

func (r *delayRecorder) recorded() []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.delays)
}

func TestRetryPolicyRunsRoundsThenDeadLettersWithTheHistory(t *testing.T) {
	tr := newDelayRecorder()
	policy := bus.RetryPolicy{Immediate: 1, Delayed: 2, Backoff: bus.Backoff{Initial: 2 * time.Millisecond, Max: 4 * time.Millisecond}}
	mw, seen := attemptsOf()
	var failures atomic.Int32
	startBus(t, bus.WithEndpoint("retry-rounds"), bus.WithTransport(tr), bus.WithRetry(policy), bus.WithMiddleware(mw),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			return fmt.Errorf("failure %d", failures.Add(1))
		}))
	began := time.Now()
	if err := startSender(t, tr.Broker()).Send(t.Context(), orderPlaced{ID: "1"}, bus.To("retry-rounds")); err != nil {
		t.Fatal(err)
	}
	f := await(t, tr.failed)
	var got []int
	for len(seen) > 0 {
		got = append(got, <-seen)
	}
	if want := []int{1, 2, 3, 4, 5, 6}; !slices.Equal(got, want) {
		t.Errorf("attempts %v, want %v (two per round, three rounds)", got, want)
	}
	delays := tr.recorded()
	if len(delays) != 2 {
		t.Fatalf("ReturnAfter called %d times (%v), want 2: after the first and the second round", len(delays), delays)
	}
	if delays[0] > 2*time.Millisecond || delays[1] > 4*time.Millisecond || delays[0] < 0 || delays[1] < 0 {
		t.Errorf("delays %v, want within [0, 2ms] then [0, 4ms]", delays)
	}
	if f.Attempts != 6 || f.History.Delayed != 2 || f.History.Immediate(f.Attempts) != 3 {
		t.Errorf("failure: %d attempts, %d delayed, %d immediate; want 6, 2, 3", f.Attempts, f.History.Delayed, f.History.Immediate(f.Attempts))
	}
	var endings []string
	for _, e := range f.History.Errors {
		endings = append(endings, e[strings.LastIndex(e, ": ")+2:])
	}
	if want := []string{"failure 2", "failure 3", "failure 4", "failure 5", "failure 6"}; !slices.Equal(endings, want) {
		t.Errorf("history errors %q, want the newest %d distinct, ending %q", f.History.Errors, bus.MaxRetryErrors, want)
	}
	if f.History.FirstFailure.Before(began.Add(-time.Second)) || f.History.LastFailure.Before(f.History.FirstFailure) {
		t.Errorf("first failure %v, last %v", f.History.FirstFailure, f.History.LastFailure)
	}
}

func TestTransientFailureIsHealedByADelayedRetry(t *testing.T) {
	tr := newDelayRecorder()
	var healthy atomic.Bool
	// The first round is used up when the bus asks for a delay: the
	// dependency comes back then, before the message is returned for the
	// delay (its jitter may make it next to nothing).
	tr.returning = func() { healthy.Store(true) }
	handled := make(chan struct{}, 1)
	mw, seen := attemptsOf()
	policy := bus.RetryPolicy{Immediate: 2, Delayed: 3, Backoff: bus.Backoff{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond}}
	startBus(t, bus.WithEndpoint("healed"), bus.WithTransport(tr), bus.WithRetry(policy), bus.WithMiddleware(mw),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			if !healthy.Load() {
				return errors.New("database down")
			}
			handled <- struct{}{}
			return nil
		}))
	if err := startSender(t, tr.Broker()).Send(t.Context(), orderPlaced{ID: "1"}, bus.To("healed")); err != nil {
		t.Fatal(err)
	}
	await(t, handled) // after the dependency came back
	var attempts []int
	for len(seen) > 0 {
		attempts = append(attempts, <-seen)
	}
	if want := []int{1, 2, 3, 4}; !slices.Equal(attempts, want) {
		t.Errorf("attempts %v, want %v: the first round, then the first attempt after the delay", attempts, want)
	}
	if dl := tr.Broker().DeadLetters("healed"); len(dl) != 0 {
		t.Errorf("dead letters: %v", dl)
	}
}

// startSender starts a send-only bus on broker.
func startSender(t *testing.T, broker *memory.Broker) *bus.Bus {
	return startBus(t, bus.WithTransport(memory.New(memory.WithBroker(broker))))
}

func TestRetryPolicyOfTheMessageAndOfTheHandlerOverrideTheBus(t *testing.T) {
	tr := newDelayRecorder()
	none := bus.RetryPolicy{}
	twice := bus.RetryPolicy{Immediate: 1}
	var orders, refunds atomic.Int32
	startBus(t, bus.WithEndpoint("overrides"), bus.WithTransport(tr),
		bus.WithRetry(bus.RetryPolicy{Immediate: 4}),
		bus.WithRetryFor(none, orderPlaced{}),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			orders.Add(1)
			return errors.New("no")
		}),
		bus.WithHandler(func(ctx context.Context, m refund, a bus.Attributes) error {
			refunds.Add(1)
			return errors.New("no")
		}, bus.HandlerRetry(twice)))
	sender := startSender(t, tr.Broker())
	if err := sender.Send(t.Context(), orderPlaced{ID: "1"}, bus.To("overrides")); err != nil {
		t.Fatal(err)
	}
	if err := sender.Send(t.Context(), refund{ID: "2"}, bus.To("overrides")); err != nil {
		t.Fatal(err)
	}
	await(t, tr.failed)
	await(t, tr.failed)
	if o, r := orders.Load(), refunds.Load(); o != 1 || r != 2 {
		t.Errorf("order handled %d times (want 1: its message's policy), refund %d (want 2: its handler's policy)", o, r)
	}
}

func TestRetryPolicyIsValidatedAtNew(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  bus.Option
	}{
		{"negative immediate", bus.WithRetry(bus.RetryPolicy{Immediate: -1})},
		{"delayed without backoff", bus.WithRetry(bus.RetryPolicy{Delayed: 1})},
		{"max below initial", bus.WithRetry(bus.RetryPolicy{Delayed: 1, Backoff: bus.Backoff{Initial: time.Second, Max: time.Millisecond}})},
		{"for no message", bus.WithRetryFor(bus.RetryPolicy{})},
		{"handler policy", bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error { return nil }, bus.HandlerRetry(bus.RetryPolicy{Delayed: 2}))},
	} {
		if _, err := bus.New(bus.WithEndpoint("x"), tc.opt); err == nil {
			t.Errorf("%s: New accepted it", tc.name)
		}
	}
}

// Many messages failing at random are all handled: none is lost, none
// dead-lettered, with delayed retries through the memory transport's
// timers.
func TestRandomTransientFailuresLoseNothing(t *testing.T) {
	const n = 10_000
	tr := newDelayRecorder()
	policy := bus.RetryPolicy{Immediate: 2, Delayed: 10, Backoff: bus.Backoff{Initial: time.Millisecond, Max: 20 * time.Millisecond}}
	var mu sync.Mutex
	seen := make(map[string]bool, n)
	done := make(chan struct{})
	startBus(t, bus.WithEndpoint("random-failures"), bus.WithTransport(tr), bus.WithRetry(policy), bus.WithConcurrency(16),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			if rand.N(5) == 0 {
				return errors.New("transient")
			}
			mu.Lock()
			defer mu.Unlock()
			seen[m.ID] = true
			if len(seen) == n {
				close(done)
			}
			return nil
		}))
	sender := startSender(t, tr.Broker())
	for i := range n {
		if err := sender.Send(t.Context(), orderPlaced{ID: fmt.Sprint(i)}, bus.To("random-failures")); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		mu.Lock()
		t.Fatalf("%d of %d messages handled", len(seen), n)
	}
	if dl := tr.Broker().DeadLetters("random-failures"); len(dl) != 0 {
		t.Errorf("%d dead letters, want 0", len(dl))
	}
	if len(tr.recorded()) == 0 {
		t.Error("no delayed retry: every failure was retried at once")
	}
}

func TestBackoffDelaysStayUnderTheirCeiling(t *testing.T) {
	b := bus.Backoff{Initial: 10 * time.Millisecond, Max: time.Second}
	for n, want := range map[int]time.Duration{0: 10 * time.Millisecond, 1: 10 * time.Millisecond, 2: 20 * time.Millisecond, 7: 640 * time.Millisecond, 8: time.Second, 1000: time.Second} {
		if got := b.Ceiling(n); got != want {
			t.Errorf("Ceiling(%d) = %v, want %v", n, got, want)
		}
	}
	huge := bus.Backoff{Initial: time.Hour, Max: time.Duration(1<<63 - 1)}
	if c := huge.Ceiling(200); c != huge.Max {
		t.Errorf("Ceiling(200) of %v = %v: overflowed", huge, c)
	}
	var sum time.Duration
	const draws = 20_000
	for range draws {
		d := b.Delay(3)
		if d < 0 || d > 40*time.Millisecond {
			t.Fatalf("Delay(3) = %v, outside [0, 40ms]", d)
		}
		sum += d
	}
	// Full jitter: uniform over [0, 40ms], so the mean is near 20ms.
	if mean := sum / draws; mean < 19*time.Millisecond || mean > 21*time.Millisecond {
		t.Errorf("mean delay %v, want about 20ms", mean)
	}
}

func TestRetryHistoryRoundTripsAsText(t *testing.T) {
	var h bus.RetryHistory
	if err := h.UnmarshalText([]byte(`{"d":2,"r":5,"f":"2026-12-01T00:00:00Z","l":"2026-12-01T00:01:00Z","e":["a","b"]}`)); err != nil {
		t.Fatal(err)
	}
	text, err := h.MarshalText()
	if err != nil {
		t.Fatal(err)
	}
	var back bus.RetryHistory
	if err := back.UnmarshalText(text); err != nil {
		t.Fatal(err)
	}
	if back.Delayed != 2 || !slices.Equal(back.Errors, []string{"a", "b"}) || !back.LastFailure.Equal(time.Date(2026, 12, 1, 0, 1, 0, 0, time.UTC)) {
		t.Errorf("round trip: %+v", back)
	}
	for _, bad := range []string{`{"d":-1}`, `{"e":["1","2","3","4","5","6"]}`, `not json`} {
		if err := new(bus.RetryHistory).UnmarshalText([]byte(bad)); err == nil {
			t.Errorf("UnmarshalText(%s) accepted it", bad)
		}
	}
}

// forgetful is a memory transport that loses the retry history of what it
// delivers; it reports its dead letters on failed.
type forgetful struct {
	*memory.Transport
	failed chan bus.Failure
}

func (f forgetful) Fail(ctx context.Context, d *bus.Delivery, fl bus.Failure) error {
	err := f.Transport.Fail(ctx, d, fl)
	f.failed <- fl
	return err
}

func (f forgetful) Receive(ctx context.Context) (*bus.Delivery, error) {
	d, err := f.Transport.Receive(ctx)
	if d != nil {
		d.Retries = bus.RetryHistory{}
	}
	return d, err
}

// On a transport that carries no retry history, a message is still
// delivered at most RetryPolicy.MaxAttempts times, then dead-lettered.
func TestRetryPolicyStopsAtMaxAttemptsWithoutAHistory(t *testing.T) {
	tr := forgetful{memory.New(), make(chan bus.Failure, 1)}
	policy := bus.RetryPolicy{Immediate: 1, Delayed: 2, Backoff: bus.Backoff{Initial: time.Millisecond, Max: time.Millisecond}}
	var runs atomic.Int32
	startBus(t, bus.WithEndpoint("forgetful"), bus.WithTransport(tr), bus.WithRetry(policy),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			runs.Add(1)
			return errors.New("always")
		}))
	if err := startSender(t, tr.Broker()).Send(t.Context(), orderPlaced{ID: "1"}, bus.To("forgetful")); err != nil {
		t.Fatal(err)
	}
	await(t, tr.failed)
	if n := runs.Load(); n != int32(policy.MaxAttempts()) {
		t.Errorf("handled %d times, want %d (the policy's MaxAttempts)", n, policy.MaxAttempts())
	}
}

// A classifier that panics marks nothing permanent and does not take the
// process down: the message is retried as any transient failure.
func TestPanickingClassifierCountsAsTransient(t *testing.T) {
	tr := newDelayRecorder()
	var runs atomic.Int32
	startBus(t, bus.WithEndpoint("panicky-classifier"), bus.WithTransport(tr), bus.WithMaxAttempts(2),
		bus.WithPermanentErrors(func(error) bool { panic("classifier bug") }),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			runs.Add(1)
			return errors.New("fails")
		}))
	if err := startSender(t, tr.Broker()).Send(t.Context(), orderPlaced{ID: "1"}, bus.To("panicky-classifier")); err != nil {
		t.Fatal(err)
	}
	f := await(t, tr.failed)
	if runs.Load() != 2 || f.Attempts != 2 {
		t.Errorf("handled %d times, dead-lettered after %d attempts; want 2 and 2 (retried, not permanent)", runs.Load(), f.Attempts)
	}
}

// FuzzRetryHistory feeds UnmarshalText what a foreign producer may put in
// the header or attribute that carries a retry history (RabbitMQ's
// plugbus-retries, the "hist" of an SQS delayed copy): no panic; a history
// it accepts is within the bounds the bus promises (Delayed and the round
// start not negative, at most MaxRetryErrors errors of at most
// MaxRetryErrorLen bytes of valid UTF-8), encodes again, and reads back
// unchanged, so that the next copy carries it on.
func FuzzRetryHistory(f *testing.F) {
	for _, s := range []string{
		`{"d":2,"r":5,"f":"2026-12-01T00:00:00Z","l":"2026-12-01T00:01:00Z","e":["a","b"]}`,
		`{}`, `null`, `[]`, `""`, `{"d":-1}`, `{"r":-1}`, `{"e":["1","2","3","4","5","6"]}`,
		`{"D":1,"R":2,"E":["x"],"d":3}`,
		`{"e":["` + strings.Repeat("é", 200) + `","\xff\xfe"]}`,
		`{"f":"0000-01-01T00:00:00+01:00","l":"9999-12-31T23:59:59-23:59"}`,
		`{"f":"2026-01-01T00:00:00.123456789123Z","l":null,"e":null}`,
		`{"d":9223372036854775807,"r":9223372036854775807}`,
		`{"d":1e3,"e":[1]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, text []byte) {
		var h bus.RetryHistory
		if h.UnmarshalText(text) != nil {
			if !h.IsZero() {
				t.Fatalf("refused %q but kept %+v", text, h)
			}
			return
		}
		if h.Delayed < 0 || len(h.Errors) > bus.MaxRetryErrors {
			t.Fatalf("%q read as %+v: out of range", text, h)
		}
		for _, e := range h.Errors {
			if len(e) > bus.MaxRetryErrorLen || !utf8.ValidString(e) {
				t.Fatalf("%q read an error of %d bytes, valid UTF-8 %v", text, len(e), utf8.ValidString(e))
			}
		}
		again, err := h.MarshalText()
		if err != nil {
			t.Fatalf("%q read as %+v, which does not encode: %v", text, h, err)
		}
		var back bus.RetryHistory
		if err := back.UnmarshalText(again); err != nil {
			t.Fatalf("%q read as %+v, encoded as %q, which does not read back: %v", text, h, again, err)
		}
		twice, _ := back.MarshalText()
		if back.Delayed != h.Delayed || !back.FirstFailure.Equal(h.FirstFailure) || !back.LastFailure.Equal(h.LastFailure) ||
			!slices.Equal(back.Errors, h.Errors) || string(twice) != string(again) {
			t.Fatalf("%q read as %+v, read back as %+v", text, h, back)
		}
	})
}
