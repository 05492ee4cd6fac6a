package transporttest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
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

// sameHistory compares what the bus reads of two histories, the round
// they are in included.
func sameHistory(a, b bus.RetryHistory) bool {
	ta, errA := a.MarshalText()
	tb, errB := b.MarshalText()
	return errA == nil && errB == nil && string(ta) == string(tb)
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
// with its attempt raised and its retry history — with no delay too (the
// bus returns a message that asked for bus.RetryAfter this way, its
// history changed).
func (s *suite) returnAfterDelays(t *testing.T) {
	ep, name := Name("tt-delay"), Name("tt.msg")
	tr := s.open(t, ep, name)
	ctx := s.ctx(t)
	for _, delay := range []time.Duration{3 * s.f.DelayUnit, 0} {
		s.returnAfter(t, ctx, tr, ep, name, delay)
	}
}

func (s *suite) returnAfter(t *testing.T, ctx context.Context, tr bus.Transport, ep, name string, delay time.Duration) {
	t.Helper()
	env := envelope(name, `{"delayed":true}`)
	env.Headers = bus.Headers{"x-kept": "yes"}
	if err := tr.Send(ctx, env, ep); err != nil {
		t.Fatal(err)
	}
	d := s.receive(t, tr)
	h := history(t)
	d.Retries = h
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
		t.Errorf("returned after %v: retry history %+v, want %+v", delay, again.Retries, h)
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

// tally records which messages of a test were handled and tells when
// all of them were.
type tally struct {
	mu      sync.Mutex
	handled map[int]bool
	total   int // 0 until known
	all     chan struct{}
}

func newTally() *tally { return &tally{handled: map[int]bool{}, all: make(chan struct{})} }

func (c *tally) add(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.handled[n] = true
	c.checkLocked()
}

// expect sets how many messages there are.
func (c *tally) expect(total int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.total = total
	c.checkLocked()
}

func (c *tally) checkLocked() {
	if c.total > 0 && len(c.handled) == c.total {
		select {
		case <-c.all:
		default:
			close(c.all)
		}
	}
}

// wait waits until every message was handled, failing t after d.
func (c *tally) wait(t *testing.T, d time.Duration) {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-c.all:
	case <-timer.C:
		c.mu.Lock()
		defer c.mu.Unlock()
		t.Fatalf("%d of %d messages handled", len(c.handled), c.total)
	}
}

// retryingPair starts a bus receiving at ep with policy, whose handler is
// fail (an error fails the message) and then counts the message in c, and
// returns a send-only bus on a transport of its own.
func (s *suite) retryingPair(t *testing.T, ep string, policy bus.RetryPolicy, c *tally, fail func() error) (sender *bus.Bus) {
	t.Helper()
	quiet := bus.WithLogger(slog.New(slog.DiscardHandler)) // thousands of retries
	receiver, err := bus.New(bus.WithEndpoint(ep), bus.WithTransport(s.newTransport(t)), bus.WithRetry(policy), bus.WithConcurrency(16), quiet,
		bus.WithHandler(func(ctx context.Context, m outageMessage, a bus.Attributes) error {
			if err := fail(); err != nil {
				return err
			}
			c.add(m.N)
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	if err := receiver.Start(s.ctx(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = receiver.Stop(context.Background()) })
	sender, err = bus.New(bus.WithTransport(s.newTransport(t)), quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sender.Stop(context.Background()) })
	return sender
}

// scaledDefaultPolicy is bus.DefaultRetryPolicy with its back-off in delay
// units instead of seconds.
func (s *suite) scaledDefaultPolicy() bus.RetryPolicy {
	p := bus.DefaultRetryPolicy()
	p.Backoff = bus.Backoff{Initial: s.f.DelayUnit, Max: 300 * s.f.DelayUnit}
	return p
}

// noDeadLetters fails t when ep dead-lettered a message. (That every
// message was handled says as much, but for a duplicate.)
func (s *suite) noDeadLetters(t *testing.T, ep string) {
	t.Helper()
	if dl := s.f.DeadLetters(s.ctx(t), t, ep, 0); len(dl) != 0 {
		t.Errorf("%d messages dead-lettered, want 0; the first: %s", len(dl), dl[0].Failure.Reason)
	}
}

// A handler's dependency is down for 20 delay units under a steady 200
// messages a second: with the default retry policy scaled to the delay
// unit (1s → one unit), every message is handled once the dependency is
// back, none is dead-lettered and none is lost.
func (s *suite) outageLosesNothing(t *testing.T) {
	ep := Name("tt-outage")
	outage := 20 * s.f.DelayUnit
	policy := s.scaledDefaultPolicy()
	var down atomic.Bool
	down.Store(true)
	var failures atomic.Int64
	felt := make(chan struct{}) // closed by the first failure
	var feltOnce sync.Once
	c := newTally()
	sender := s.retryingPair(t, ep, policy, c, func() error {
		if down.Load() {
			failures.Add(1)
			feltOnce.Do(func() { close(felt) })
			return errors.New("dependency down")
		}
		return nil
	})
	ctx := s.ctx(t)
	// The dependency is back once the outage lasted its time and a handler
	// failed during it: on a loaded machine, or broker, the first message
	// may reach a handler only after the outage's time, and an outage no
	// handler saw tests nothing.
	var began time.Time
	over := func() bool {
		select {
		case <-felt:
			return time.Since(began) >= outage
		default:
			return false
		}
	}
	// 200 messages a second while the dependency is down, and as long
	// again after it is back.
	began = time.Now()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	n := 0
	for time.Since(began) < 2*outage {
		<-tick.C
		if down.Load() && over() {
			down.Store(false)
		}
		if err := sender.Send(ctx, outageMessage{N: n}, bus.To(ep)); err != nil {
			t.Fatalf("Send %d: %v", n, err)
		}
		n++
	}
	if down.Load() {
		select {
		case <-felt:
		case <-ctx.Done():
			t.Fatal("no message reached a handler during the outage")
		}
		down.Store(false)
	}
	c.expect(n)
	c.wait(t, s.f.Timeout+policy.Backoff.Max)
	if failures.Load() == 0 {
		t.Fatal("no handler failed: the outage did not happen")
	}
	s.noDeadLetters(t, ep)
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
	policy := s.scaledDefaultPolicy()
	var failures atomic.Int64
	c := newTally()
	sender := s.retryingPair(t, ep, policy, c, func() error {
		if rand.N(5) == 0 {
			failures.Add(1)
			return errors.New("transient")
		}
		return nil
	})
	ctx := s.ctx(t)
	began := time.Now()
	const senders = 8
	var wg sync.WaitGroup
	errs := make(chan error, senders)
	for g := range senders {
		wg.Go(func() {
			for i := g; i < n; i += senders {
				if err := sender.Send(ctx, outageMessage{N: i}, bus.To(ep)); err != nil {
					errs <- fmt.Errorf("sending message %d: %w", i, err)
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
	c.expect(n)
	c.wait(t, s.f.Timeout+policy.Backoff.Max)
	s.noDeadLetters(t, ep)
	t.Logf("%d messages, %d handler failures, all handled in %v", n, failures.Load(), time.Since(began))
}
