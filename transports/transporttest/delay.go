package transporttest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
)

// history is a retry history as the bus leaves it after two failures, one
// of them before a delayed round.
func history(t *testing.T) bus.RetryHistory {
	t.Helper()
	var h bus.RetryHistory
	text := `{"d":1,"r":2,"f":"2026-12-01T10:00:00Z","l":"2026-12-01T10:00:05Z","e":["first failure","second failure"]}`
	if err := h.UnmarshalText([]byte(text)); err != nil {
		t.Fatal(err)
	}
	return h
}

func sameHistory(a, b bus.RetryHistory) bool {
	return a.Delayed == b.Delayed && a.FirstFailure.Equal(b.FirstFailure) && a.LastFailure.Equal(b.LastFailure) && slices.Equal(a.Errors, b.Errors)
}

// A dead letter keeps the retry history the bus gave Fail.
func (s *suite) failKeepsHistory(t *testing.T) {
	ep, name := Name("tt-hist"), Name("tt.msg")
	tr := s.open(t, ep, name)
	ctx := s.ctx(t)
	if err := tr.Send(ctx, envelope(name, `{}`), ep); err != nil {
		t.Fatal(err)
	}
	d := s.receive(t, tr)
	h := history(t)
	d.Retries = h
	if err := tr.Fail(ctx, d, bus.Failure{Reason: "gave up", Attempts: 3, Endpoint: ep, Time: time.Now().UTC(), History: h}); err != nil {
		t.Fatal(err)
	}
	dl := s.f.DeadLetters(ctx, t, ep, 1)
	if len(dl) != 1 {
		t.Fatalf("dead letters = %d, want 1", len(dl))
	}
	if got := dl[0].Failure.History; !sameHistory(got, h) {
		t.Errorf("dead letter's history %+v, want %+v", got, h)
	}
}

// A message given to ReturnAfter comes back no earlier than its delay,
// with its attempt raised and its retry history.
func (s *suite) returnAfterDelays(t *testing.T) {
	ep, name := Name("tt-delay"), Name("tt.msg")
	tr := s.open(t, ep, name)
	ctx := s.ctx(t)
	env := envelope(name, `{"delayed":true}`)
	env.Headers = bus.Headers{"x-kept": "yes"}
	if err := tr.Send(ctx, env, ep); err != nil {
		t.Fatal(err)
	}
	d := s.receive(t, tr)
	h := history(t)
	d.Retries = h
	delay := 3 * s.f.DelayUnit
	returned := time.Now()
	if err := tr.(bus.Delayer).ReturnAfter(ctx, d, errors.New("later"), delay); err != nil {
		t.Fatalf("ReturnAfter: %v", err)
	}
	again := s.receive(t, tr)
	if waited := time.Since(returned); waited < delay {
		t.Errorf("delivered again after %v, before its delay of %v", waited, delay)
	}
	if again.Attempt != 2 || again.Attributes.MessageID != env.Attributes.MessageID || string(again.Body) != `{"delayed":true}` || again.Headers["x-kept"] != "yes" {
		t.Errorf("delayed redelivery changed the message: attempt %d, id %s, body %s, headers %v", again.Attempt, again.Attributes.MessageID, again.Body, again.Headers)
	}
	if !sameHistory(again.Retries, h) {
		t.Errorf("retry history %+v, want %+v", again.Retries, h)
	}
	if err := tr.Delete(ctx, again); err != nil {
		t.Fatal(err)
	}
	s.expectNothing(t, tr)
}

// A message delayed for long never holds back one delayed for a moment.
func (s *suite) noHeadOfLine(t *testing.T) {
	ep, name := Name("tt-hol"), Name("tt.msg")
	tr := s.open(t, ep, name)
	ctx := s.ctx(t)
	for _, body := range []string{`"long"`, `"short"`} {
		if err := tr.Send(ctx, envelope(name, body), ep); err != nil {
			t.Fatal(err)
		}
	}
	first, second := s.receive(t, tr), s.receive(t, tr)
	long := min(time.Hour, tr.(bus.Delayer).MaxDelay())
	if err := tr.(bus.Delayer).ReturnAfter(ctx, first, nil, long); err != nil {
		t.Fatal(err)
	}
	short := 2 * s.f.DelayUnit
	returned := time.Now()
	if err := tr.(bus.Delayer).ReturnAfter(ctx, second, nil, short); err != nil {
		t.Fatal(err)
	}
	got := s.receive(t, tr)
	if string(got.Body) != string(second.Body) {
		t.Fatalf("got %s first, want the one delayed %v, not the one delayed %v", got.Body, short, long)
	}
	if waited := time.Since(returned); waited > short+2*time.Second {
		t.Errorf("the message delayed %v arrived after %v", short, waited)
	}
	if err := tr.Delete(ctx, got); err != nil {
		t.Fatal(err)
	}
}

// A handler's dependency is down for 20 delay units under a steady 200
// messages a second: with the default retry policy scaled to the delay
// unit (1s → one unit), every message is handled once the dependency is
// back, none is dead-lettered and none is lost.
func (s *suite) outageLosesNothing(t *testing.T) {
	ep := Name("tt-outage")
	unit := s.f.DelayUnit
	outage := 20 * unit
	policy := bus.DefaultRetryPolicy()
	policy.Backoff = bus.Backoff{Initial: unit, Max: 300 * unit}
	var down atomic.Bool
	down.Store(true)
	var mu sync.Mutex
	handled := map[int]bool{}
	var total atomic.Int64
	allHandled := make(chan struct{})
	var failures atomic.Int64
	receiver, err := bus.New(bus.WithEndpoint(ep), bus.WithTransport(s.newTransport(t)), bus.WithRetry(policy), bus.WithConcurrency(16),
		bus.WithLogger(slog.New(slog.DiscardHandler)),
		bus.WithHandler(func(ctx context.Context, m outageMessage, a bus.Attributes) error {
			if down.Load() {
				failures.Add(1)
				return errors.New("dependency down")
			}
			mu.Lock()
			defer mu.Unlock()
			handled[m.N] = true
			if n := total.Load(); n > 0 && int64(len(handled)) == n {
				select {
				case <-allHandled:
				default:
					close(allHandled)
				}
			}
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := s.ctx(t)
	if err := receiver.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = receiver.Stop(context.Background()) })
	sender, err := bus.New(bus.WithTransport(s.newTransport(t)), bus.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sender.Stop(context.Background()) })

	// 200 messages a second while the dependency is down, and as long
	// again after it is back.
	began := time.Now()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	n := 0
	for time.Since(began) < 2*outage {
		<-tick.C
		if down.Load() && time.Since(began) >= outage {
			down.Store(false)
		}
		if err := sender.Send(ctx, outageMessage{N: n}, bus.To(ep)); err != nil {
			t.Fatalf("Send %d: %v", n, err)
		}
		n++
	}
	total.Store(int64(n))
	mu.Lock()
	done := len(handled) == n
	mu.Unlock()
	if !done {
		wait := time.NewTimer(s.f.Timeout + policy.Backoff.Max)
		defer wait.Stop()
		select {
		case <-allHandled:
		case <-wait.C:
			mu.Lock()
			t.Fatalf("%d of %d messages handled after the outage", len(handled), n)
		}
	}
	if failures.Load() == 0 {
		t.Fatal("no handler failed: the outage did not happen")
	}
	if dl := s.f.DeadLetters(ctx, t, ep, 0); len(dl) != 0 {
		t.Errorf("%d messages dead-lettered, want 0; the first: %s", len(dl), dl[0].Failure.Reason)
	}
	t.Logf("%d messages, %d handler failures during an outage of %v, all handled %v after it ended", n, failures.Load(), outage, time.Since(began)-outage)
}

type outageMessage struct{ N int }

func (outageMessage) MessageName() string { return "transporttest.outage" }

// Messages whose handler fails at random one time in five are all
// handled, none dead-lettered and none lost, with the default retry
// policy scaled to the delay unit.
func (s *suite) randomFailuresLoseNothing(t *testing.T) {
	n := s.f.RandomFailures
	ep := Name("tt-random")
	policy := bus.DefaultRetryPolicy()
	policy.Backoff = bus.Backoff{Initial: s.f.DelayUnit, Max: 300 * s.f.DelayUnit}
	var mu sync.Mutex
	handled := make(map[int]bool, n)
	allHandled := make(chan struct{})
	var failures atomic.Int64
	receiver, err := bus.New(bus.WithEndpoint(ep), bus.WithTransport(s.newTransport(t)), bus.WithRetry(policy), bus.WithConcurrency(16),
		bus.WithLogger(slog.New(slog.DiscardHandler)),
		bus.WithHandler(func(ctx context.Context, m outageMessage, a bus.Attributes) error {
			if rand.N(5) == 0 {
				failures.Add(1)
				return errors.New("transient")
			}
			mu.Lock()
			defer mu.Unlock()
			handled[m.N] = true
			if len(handled) == n {
				close(allHandled)
			}
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := s.ctx(t)
	if err := receiver.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = receiver.Stop(context.Background()) })
	sender, err := bus.New(bus.WithTransport(s.newTransport(t)), bus.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sender.Stop(context.Background()) })
	began := time.Now()
	const senders = 8
	var wg sync.WaitGroup
	errs := make(chan error, senders)
	for g := range senders {
		wg.Go(func() {
			for i := g; i < n; i += senders {
				if err := sender.Send(ctx, outageMessage{N: i}, bus.To(ep)); err != nil {
					errs <- fmt.Errorf("Send %d: %w", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	wait := time.NewTimer(s.f.Timeout + policy.Backoff.Max)
	defer wait.Stop()
	select {
	case <-allHandled:
	case <-wait.C:
		mu.Lock()
		t.Fatalf("%d of %d messages handled", len(handled), n)
	}
	if dl := s.f.DeadLetters(ctx, t, ep, 0); len(dl) != 0 {
		t.Errorf("%d messages dead-lettered, want 0; the first: %s", len(dl), dl[0].Failure.Reason)
	}
	t.Logf("%d messages, %d handler failures, all handled in %v", n, failures.Load(), time.Since(began))
}
