package ratelimit_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
	"github.com/plugbus/plugbus/middleware/internal/servedtest"
	"github.com/plugbus/plugbus/middleware/ratelimit"
	"go.uber.org/goleak"
	"golang.org/x/time/rate"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type callPartner struct{ Customer string }

func (callPartner) MessageName() string { return "partner.call" }

type syncPartner struct{}

func (syncPartner) MessageName() string { return "partner.sync" }

func instantiate(t *testing.T, p bus.Plugin) bus.Middleware {
	t.Helper()
	m, err := p.Instantiate(bus.PluginInfo{})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// run runs the middleware's handler stage for msg with a recording next.
func run(ctx context.Context, mw bus.Middleware, msg bus.Message, attrs bus.Attributes) (*bustest.NextRecorder, error) {
	rec := bustest.RecordNext(nil)
	return rec, mw.Handling(ctx, bustest.Handling("h", msg, attrs), rec.HandlingNext())
}

// A burst goes through at once; the run after it waits for its token.
// At one token an hour in bursts of 2, the two runs of the burst are let
// through and the third is returned with a wait of about an hour
// (WithMaxWait): however loaded the machine, a burst cannot look like a
// wait there. At 10 tokens a second the third run waits on the real timer
// and then runs: it cannot start before 100ms after the first took its
// token, however the machine is loaded.
func TestBurstThenWaitForTheToken(t *testing.T) {
	hourly := instantiate(t, ratelimit.New(rate.Every(time.Hour), 2, ratelimit.WithMaxWait(time.Minute)))
	for i := range 2 {
		if rec, err := run(t.Context(), hourly, callPartner{}, bus.Attributes{}); err != nil || !rec.Called() {
			t.Fatalf("run %d of the burst at 1/h: err %v, next called %v", i+1, err, rec.Called())
		}
	}
	rec, err := run(t.Context(), hourly, callPartner{}, bus.Attributes{})
	var le *ratelimit.LimitedError
	if !errors.As(err, &le) || rec.Called() || le.Wait < 59*time.Minute {
		t.Fatalf("after the burst at 1/h: err %v, next called %v; want a wait of about an hour", err, rec.Called())
	}

	mw := instantiate(t, ratelimit.New(10, 2))
	start := time.Now()
	for i := range 3 {
		if rec, err := run(t.Context(), mw, callPartner{}, bus.Attributes{}); err != nil || !rec.Called() {
			t.Fatalf("run %d at 10/s: err %v, next called %v", i+1, err, rec.Called())
		}
	}
	if waited := time.Since(start); waited < 95*time.Millisecond {
		t.Fatalf("3 runs within %v at 10/s in bursts of 2, want at least 100ms", waited)
	}
}

// A ctx that ends during the wait ends it: next is not called and the
// token is given back.
func TestWaitEndsWithTheContext(t *testing.T) {
	mw := instantiate(t, ratelimit.New(rate.Every(time.Hour), 1))
	if _, err := run(t.Context(), mw, callPartner{}, bus.Attributes{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	rec, err := run(ctx, mw, callPartner{}, bus.Attributes{})
	if !errors.Is(err, context.Canceled) || rec.Called() {
		t.Fatalf("err %v, next called %v; want the ctx's error and no call", err, rec.Called())
	}
}

// Over the maximum wait, the message is returned for later at once with
// the wait it would have had.
func TestMaxWaitReturnsTheMessageForLater(t *testing.T) {
	mw := instantiate(t, ratelimit.New(rate.Every(time.Hour), 1, ratelimit.WithMaxWait(time.Second)))
	if _, err := run(t.Context(), mw, callPartner{}, bus.Attributes{}); err != nil {
		t.Fatal(err)
	}
	rec, err := run(t.Context(), mw, callPartner{}, bus.Attributes{})
	var ra *bus.RetryAfterError
	var le *ratelimit.LimitedError
	if !errors.As(err, &ra) || !errors.As(err, &le) || rec.Called() || ra.Delay < 59*time.Minute || le.Wait != ra.Delay || le.Handler != "h" {
		t.Fatalf("err %v, next called %v; want a RetryAfter of about an hour with a LimitedError", err, rec.Called())
	}
	if !errors.Is(err, ratelimit.ErrLimited) || !strings.Contains(err.Error(), "ratelimit: handler h of partner.call over the rate limit") {
		t.Fatalf("error text %q", err)
	}
}

// Per message name and per key, each has its own bucket.
func TestBucketsPerMessageNameAndPerKey(t *testing.T) {
	full := ratelimit.WithMaxWait(time.Millisecond) // over the limit = returned at once
	t.Run("message name", func(t *testing.T) {
		mw := instantiate(t, ratelimit.New(rate.Every(time.Hour), 1, ratelimit.PerMessageName(), full))
		for _, c := range []struct {
			msg     bus.Message
			limited bool
		}{{callPartner{}, false}, {syncPartner{}, false}, {callPartner{}, true}, {syncPartner{}, true}} {
			if _, err := run(t.Context(), mw, c.msg, bus.Attributes{}); errors.Is(err, ratelimit.ErrLimited) != c.limited {
				t.Fatalf("%s: err %v, want limited %v", c.msg.MessageName(), err, c.limited)
			}
		}
	})
	t.Run("key", func(t *testing.T) {
		byTenant := ratelimit.PerKey(func(m bus.Message, a bus.Attributes) string {
			tenant, _ := a.StickyValue("tenant")
			return tenant + "/" + m.(callPartner).Customer
		})
		mw := instantiate(t, ratelimit.New(rate.Every(time.Hour), 1, byTenant, full, ratelimit.WithMaxKeys(2)))
		acme, globex := bus.Attributes{}.WithSticky("tenant", "acme"), bus.Attributes{}.WithSticky("tenant", "globex")
		for i, c := range []struct {
			msg     callPartner
			attrs   bus.Attributes
			limited bool
			key     string
		}{
			{callPartner{"c1"}, acme, false, ""}, {callPartner{"c1"}, globex, false, ""}, {callPartner{"c2"}, acme, false, ""},
			{callPartner{"c1"}, acme, true, "acme/c1"}, {callPartner{"c1"}, globex, true, "globex/c1"},
		} {
			_, err := run(t.Context(), mw, c.msg, c.attrs)
			var le *ratelimit.LimitedError
			if errors.As(err, &le) != c.limited || c.limited && le.Key != c.key {
				t.Fatalf("run %d: err %v, want limited %v with key %q", i, err, c.limited, c.key)
			}
		}
	})
}

func TestNewRefusesWhatCannotWork(t *testing.T) {
	for _, c := range []struct {
		p    bus.Plugin
		want string
	}{
		{ratelimit.New(10, 0), "burst must be at least 1"},
		{ratelimit.New(0, 1), "limit must be positive"},
		{ratelimit.New(10, 1, ratelimit.PerKey(nil)), "PerKey(nil)"},
		{ratelimit.New(10, 1, ratelimit.WithMaxKeys(0)), "WithMaxKeys(0)"},
		// Negative is no "return at once": it would wait however long it takes.
		{ratelimit.New(10, 1, ratelimit.WithMaxWait(-time.Second)), "WithMaxWait(-1s)"},
	} {
		if _, err := c.p.Instantiate(bus.PluginInfo{}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("got %v, want %q", err, c.want)
		}
	}
}

// starts records when each handler run starts.
type starts struct {
	mu    sync.Mutex
	times []time.Time
	done  chan struct{}
	want  int
}

func newStarts(want int) *starts { return &starts{done: make(chan struct{}), want: want} }

func (s *starts) handler(context.Context, callPartner, bus.Attributes) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.times = append(s.times, time.Now())
	if len(s.times) == s.want {
		close(s.done)
	}
	return nil
}

// since waits for every run and returns the time from start (taken
// before the first message was sent, so before the first token was
// taken) to the last run.
func (s *starts) since(t *testing.T, start time.Time) time.Duration {
	t.Helper()
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		t.Fatal("not every message handled within 10s")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.times[len(s.times)-1].Sub(start)
}

// On a bus with 4 workers, 6 messages at 100/s in bursts of 1 take at
// least 5 intervals of 10ms, whatever the concurrency.
func TestOnABusTheEndpointIsLimited(t *testing.T) {
	s := newStarts(6)
	b := bustest.Start(t, bus.WithEndpoint("partner"), bus.WithConcurrency(4),
		bus.WithMiddleware(ratelimit.New(100, 1)), bus.WithHandler(s.handler))
	start := time.Now()
	for range 6 {
		if err := b.Send(t.Context(), callPartner{}, bus.To("partner")); err != nil {
			t.Fatal(err)
		}
	}
	if got := s.since(t, start); got < 49*time.Millisecond {
		t.Fatalf("6 runs within %v, want at least 50ms at 100/s", got)
	}
}

// A wait under way when the bus begins to stop ends at once: the message
// is returned for later with what was left of its wait, and Stop does
// not wait for the limit.
func TestStopEndsTheWait(t *testing.T) {
	tr := bustest.NewTransport()
	b := secondRunWaiting(t, tr, ratelimit.New(rate.Every(time.Hour), 1))
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := b.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	settled := tr.Settled()
	if len(settled) != 2 || settled[0].Outcome != bustest.Deleted || settled[1].Outcome != bustest.Returned {
		t.Fatalf("settled %+v, want the first deleted and the second returned", settled)
	}
	var le *ratelimit.LimitedError
	if !errors.As(settled[1].Cause, &le) || !le.Stopping || settled[1].Delay < 59*time.Minute {
		t.Fatalf("returned with %v after %v, want a LimitedError while stopping, after about an hour", settled[1].Cause, settled[1].Delay)
	}
}

// Per handler, only that handler is limited.
func TestPerHandler(t *testing.T) {
	s := newStarts(4)
	free := make(chan struct{}, 4)
	b := bustest.Start(t, bus.WithEndpoint("partner"), bus.WithConcurrency(2),
		bus.WithHandler(s.handler, bus.HandlerName("limited"), bus.HandlerMiddleware(ratelimit.New(100, 1))),
		bus.WithHandler(func(context.Context, callPartner, bus.Attributes) error { free <- struct{}{}; return nil }, bus.HandlerName("free")))
	start := time.Now()
	for range 4 {
		if err := b.Send(t.Context(), callPartner{}, bus.To("partner")); err != nil {
			t.Fatal(err)
		}
	}
	if got := s.since(t, start); got < 29*time.Millisecond {
		t.Fatalf("4 runs of the limited handler within %v, want at least 30ms", got)
	}
	for range 4 {
		<-free
	}
}

// Served from another process, the bucket lives there and limits the
// host's handler runs alike.
func TestOutOfProcess(t *testing.T) {
	p := servedtest.Load(t, `{"middleware": "ratelimit", "rate": 100, "burst": 1}`)
	s := newStarts(4)
	b := bustest.Start(t, bus.WithEndpoint("partner"), bus.WithConcurrency(4), bus.WithMiddleware(p), bus.WithHandler(s.handler))
	start := time.Now()
	for range 4 {
		if err := b.Send(t.Context(), callPartner{}, bus.To("partner")); err != nil {
			t.Fatal(err)
		}
	}
	if got := s.since(t, start); got < 29*time.Millisecond {
		t.Fatalf("4 runs within %v, want at least 30ms at 100/s", got)
	}
}

// Served from another process, the wait does not see the host bus begin
// to stop (the plugin's process has no bus): Stop waits for the token
// until its ctx ends, then the run is interrupted and its message is
// returned for retry, not lost.
func TestOutOfProcessStopWaitsUntilItsContextEnds(t *testing.T) {
	p := servedtest.Load(t, `{"middleware": "ratelimit", "rate": 0.0002, "burst": 1}`) // a token every ~83 minutes
	tr := bustest.NewTransport()
	b := secondRunWaiting(t, tr, p)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	if err := b.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop: %v, want its ctx's end reported: the second run waited for its token", err)
	}
	if settled := tr.Settled(); len(settled) != 2 || settled[1].Outcome != bustest.Returned {
		t.Fatalf("settled %+v, want the second message returned for retry", settled)
	}
}

// secondRunWaiting starts a bus on tr whose handler stage runs limit, one
// worker, sends it two messages, and returns once the second has reached
// limit (at an hour a token, it waits there). The test stops the bus.
func secondRunWaiting(t *testing.T, tr *bustest.Transport, limit bus.Plugin) *bus.Bus {
	t.Helper()
	waiting := make(chan struct{})
	var runs int
	b, err := bus.New(bus.WithEndpoint("partner"), bus.WithTransport(tr), bus.WithConcurrency(1),
		bus.WithMiddleware(bus.Middleware{Name: "spy", Handling: func(ctx context.Context, _ *bus.Handling, next *bus.HandlingNext) error {
			if runs++; runs == 2 {
				close(waiting) // the second run is about to wait for its token
			}
			return next.Call(ctx)
		}}, limit),
		bus.WithHandler(func(context.Context, callPartner, bus.Attributes) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := b.Send(t.Context(), callPartner{}, bus.To("partner")); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-waiting:
	case <-time.After(10 * time.Second):
		t.Fatal("the second message never reached the limit")
	}
	return b
}
