package concurrency_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
	"github.com/plugbus/plugbus/middleware/concurrency"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type exportReport struct{ ID int }

func (exportReport) MessageName() string { return "reports.export" }

type placeOrder struct{}

func (placeOrder) MessageName() string { return "shop.place_order" }

// A slow kind of message limited to 1 at once: the others of its kind are
// returned for later instead of taking the workers, another kind is
// handled meanwhile, and every message is handled in the end.
func TestSlowKindCannotTakeEveryWorker(t *testing.T) {
	tr := bustest.NewTransport()
	gate := make(chan struct{})
	started := make(chan struct{}, 10)
	ordered := make(chan struct{}, 1)
	var running, most, exported atomic.Int32
	b := bustest.Start(t, bus.WithEndpoint("backoffice"), bus.WithTransport(tr), bus.WithConcurrency(3), bus.WithMaxAttempts(1),
		bus.WithMiddleware(concurrency.New(8, concurrency.WithLimit(1, exportReport{}), concurrency.WithRetryDelay(5*time.Millisecond))),
		bus.WithHandler(func(context.Context, exportReport, bus.Attributes) error {
			n := running.Add(1)
			defer running.Add(-1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			started <- struct{}{}
			<-gate
			exported.Add(1)
			return nil
		}),
		bus.WithHandler(func(context.Context, placeOrder, bus.Attributes) error { ordered <- struct{}{}; return nil }))
	for i := range 3 {
		if err := b.Send(t.Context(), exportReport{ID: i}, bus.To("backoffice")); err != nil {
			t.Fatal(err)
		}
	}
	<-started
	// While the first export runs, the others are returned, not waiting on a worker …
	for n := 1; ; n++ {
		settled, err := tr.WaitSettled(t.Context(), n)
		if err != nil {
			t.Fatal(err)
		}
		if s := settled[n-1]; s.Outcome == bustest.Returned {
			var full *concurrency.FullError
			if !errors.As(s.Cause, &full) || full.Limit != 1 || full.Message != "reports.export" || s.Delay != 5*time.Millisecond {
				t.Fatalf("returned with %v after %v, want a FullError for reports.export after 5ms", s.Cause, s.Delay)
			}
			break
		}
	}
	// … so another kind is handled meanwhile.
	if err := b.Send(t.Context(), placeOrder{}, bus.To("backoffice")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ordered:
	case <-time.After(10 * time.Second):
		t.Fatal("an order waited behind the exports")
	}
	close(gate)
	if err := tr.WaitIdle(t.Context()); err != nil {
		t.Fatal(err)
	}
	if exported.Load() != 3 || most.Load() != 1 {
		t.Fatalf("%d exports, at most %d at once; want 3, 1 at a time", exported.Load(), most.Load())
	}
	for _, s := range tr.Settled() {
		if s.Outcome == bustest.DeadLettered {
			t.Fatalf("dead-lettered: %+v", s.Failure)
		}
	}
}

// Given to one handler, the limit bounds that handler's runs; a run over
// it waits up to the maximum wait for a slot, and is returned after it.
func TestPerHandlerWithMaxWait(t *testing.T) {
	mw, err := concurrency.New(1, concurrency.WithMaxWait(10*time.Millisecond), concurrency.WithRetryDelay(time.Second)).
		Instantiate(bus.PluginInfo{Handler: "export", Handles: []string{"reports.export"}})
	if err != nil {
		t.Fatal(err)
	}
	if mw.Incoming != nil || mw.Handling == nil {
		t.Fatal("per handler, the limit must be in the handler stage alone")
	}
	h := func() *bus.Handling { return bustest.Handling("export", exportReport{}, bus.Attributes{}) }
	inside, release := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		_ = mw.Handling(context.Background(), h(), bus.NewHandlingNext(func(context.Context) error { close(inside); <-release; return nil }))
	})
	<-inside
	rec := bustest.RecordNext(nil)
	err = mw.Handling(context.Background(), h(), rec.HandlingNext())
	var full *concurrency.FullError
	var ra *bus.RetryAfterError
	if rec.Called() || !errors.As(err, &full) || !errors.As(err, &ra) || full.Handler != "export" || ra.Delay != time.Second {
		t.Fatalf("over the limit: called %v, err %v; want a RetryAfter of 1s with a FullError naming the handler", rec.Called(), err)
	}
	if want := "concurrency: handler export already runs 1 message(s) of reports.export at once, its limit"; !strings.Contains(err.Error(), want) {
		t.Fatalf("text %q, want %q", err, want)
	}
	close(release)
	wg.Wait()
}

// A run over the limit that may wait takes the slot freed while it waits.
func TestWaitTakesAFreedSlot(t *testing.T) {
	mw, err := concurrency.New(1, concurrency.WithMaxWait(time.Minute)).
		Instantiate(bus.PluginInfo{Handler: "export", Handles: []string{"reports.export"}})
	if err != nil {
		t.Fatal(err)
	}
	h := func() *bus.Handling { return bustest.Handling("export", exportReport{}, bus.Attributes{}) }
	inside, release := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		_ = mw.Handling(context.Background(), h(), bus.NewHandlingNext(func(context.Context) error { close(inside); <-release; return nil }))
	})
	<-inside
	waited := make(chan error)
	go func() {
		rec := bustest.RecordNext(nil)
		err := mw.Handling(context.Background(), h(), rec.HandlingNext())
		if err == nil && !rec.Called() {
			err = errors.New("next not called")
		}
		waited <- err
	}()
	close(release)
	wg.Wait()
	if err := <-waited; err != nil {
		t.Fatalf("the waiting run: %v, want it to take the freed slot", err)
	}
}

// A message no handler handles is not bounded (it has no slots).
func TestUnhandledNamesPass(t *testing.T) {
	mw, err := concurrency.New(1).Instantiate(bus.PluginInfo{Handles: []string{"reports.export"}})
	if err != nil {
		t.Fatal(err)
	}
	rec := bustest.RecordNext(nil)
	if err := mw.Incoming(context.Background(), bustest.Incoming(bustest.Delivery(placeOrder{}, bus.Attributes{})), rec.IncomingNext()); err != nil || !rec.Called() {
		t.Fatalf("err %v, called %v", err, rec.Called())
	}
}

func TestNewRefusesWhatCannotWork(t *testing.T) {
	for _, c := range []struct {
		p    bus.Plugin
		want string
	}{
		{concurrency.New(0), "New(0)"},
		{concurrency.New(1, concurrency.WithLimit(0, exportReport{})), "WithLimit(0) for reports.export"},
		{concurrency.New(1, concurrency.WithLimit(1, nil)), "nil message"},
		{concurrency.New(1, concurrency.WithRetryDelay(0)), "WithRetryDelay(0s) must be positive"},
	} {
		if _, err := c.p.Instantiate(bus.PluginInfo{}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("got %v, want %q", err, c.want)
		}
	}
}

// A message type with a slice field (an order with its lines) is an
// ordinary message; WithLimit must accept it.
// A message with a slice is no map key: limits are kept by name.
type orderWithLines struct{ Lines []string }

func (orderWithLines) MessageName() string { return "shop.order_with_lines" }

func TestWithLimitTakesMessagesThatAreNoMapKeys(t *testing.T) {
	var err error
	func() {
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("bus.New panicked: %v", p)
			}
		}()
		_, err = bus.New(bus.WithEndpoint("shop"),
			bus.WithMiddleware(concurrency.New(4, concurrency.WithLimit(1, orderWithLines{}))),
			bus.WithHandler(func(context.Context, orderWithLines, bus.Attributes) error { return nil }))
	}()
	if err != nil {
		t.Fatalf("bus.New: %v", err)
	}
}

// A message waiting for a slot when the bus begins to stop is returned
// for later at once, as a rate limit's wait is: Stop does not wait for
// the slot (up to WithMaxWait), nor, once its context ends, interrupt
// the message as a failure (on a broker that counts receives, a last
// attempt would then be dead-lettered).
func TestStopEndsTheWaitForASlot(t *testing.T) {
	tr := bustest.NewTransport()
	inside, release := make(chan struct{}, 2), make(chan struct{})
	second := make(chan struct{})
	var received atomic.Int32
	b, err := bus.New(bus.WithEndpoint("backoffice"), bus.WithTransport(tr), bus.WithConcurrency(2),
		bus.WithMiddleware(bus.Middleware{Name: "spy", Incoming: func(ctx context.Context, _ *bus.Incoming, next *bus.IncomingNext) error {
			if received.Add(1) == 2 {
				close(second) // the second export is about to wait for the slot
			}
			return next.Call(ctx)
		}}, concurrency.New(1, concurrency.WithMaxWait(time.Hour), concurrency.WithRetryDelay(time.Minute))),
		bus.WithHandler(func(ctx context.Context, m exportReport, _ bus.Attributes) error {
			inside <- struct{}{}
			<-release
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := b.Send(t.Context(), exportReport{ID: i}, bus.To("backoffice")); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []chan struct{}{inside, second} {
		select {
		case <-c:
		case <-time.After(10 * time.Second):
			t.Fatal("the exports never reached the limit")
		}
	}
	stopped := make(chan error, 1)
	go func() { stopped <- b.Stop(context.Background()) }()
	<-b.Stopping()
	// While the first export still holds the slot, the second is returned.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	settled, err := tr.WaitSettled(ctx, 1)
	close(release)
	if err := <-stopped; err != nil {
		t.Errorf("Stop: %v", err)
	}
	if err != nil {
		t.Fatalf("nothing settled while the first export held the slot: the second waited for it through Stop (%v)", err)
	}
	var full *concurrency.FullError
	if s := settled[0]; s.Outcome != bustest.Returned || !errors.As(s.Cause, &full) || !full.Stopping || s.Delay != time.Minute {
		t.Fatalf("settled %s with %v after %v, want returned after 1m with a FullError while stopping", s.Outcome, s.Cause, s.Delay)
	}
	if settled := tr.Settled(); len(settled) != 2 || settled[1].Outcome != bustest.Deleted {
		t.Fatalf("settled %+v, want the first export deleted after the second was returned", settled)
	}
}
