package bus_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
	"github.com/plugbus/plugbus/transports/memory"
)

// Start runs the middleware Start hooks in registration order and Stop
// runs their Stop hooks in reverse; a running bus refuses a second Start.
func TestStartAndStopRunTheHooksInOrder(t *testing.T) {
	var order []string
	hooks := func(name string) bus.Middleware {
		return bus.Middleware{
			Name:  name,
			Start: func(context.Context) error { order = append(order, "start "+name); return nil },
			Stop:  func(context.Context) error { order = append(order, "stop "+name); return nil },
		}
	}
	b, err := bus.New(bus.WithEndpoint("ep"), bus.WithLogger(discard()), bus.WithMiddleware(hooks("p1"), hooks("p2")),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(t.Context()); !errors.Is(err, bus.ErrAlreadyStarted) {
		t.Fatalf("second Start: %v", err)
	}
	if err := b.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(order, ", "); got != "start p1, start p2, stop p2, stop p1" {
		t.Fatalf("lifecycle order: %s", got)
	}
}

// A stopped bus stays stopped: Start, Send and Deliver fail with
// ErrClosed, and a second Stop does nothing.
func TestStoppedBusStaysStopped(t *testing.T) {
	b, err := bus.New(bus.WithEndpoint("ep"), bus.WithLogger(discard()),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := b.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(t.Context()); !errors.Is(err, bus.ErrClosed) {
		t.Fatalf("Start after Stop: %v", err)
	}
	if err := b.Send(t.Context(), orderPlaced{}); !errors.Is(err, bus.ErrClosed) {
		t.Fatalf("Send after Stop: %v", err)
	}
	if err := b.Deliver(t.Context(), bustest.Delivery(orderPlaced{}, bus.Attributes{})); !errors.Is(err, bus.ErrClosed) {
		t.Fatalf("Deliver after Stop: %v", err)
	}
	if err := b.Stop(t.Context()); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
}

// A Start hook that fails aborts Start, after the hooks already started
// are stopped.
func TestFailingPluginStartStopsTheStartedOnes(t *testing.T) {
	var stopped []string
	b, err := bus.New(bus.WithLogger(discard()), bus.WithMiddleware(
		bus.Middleware{Name: "ok", Start: func(context.Context) error { return nil }, Stop: func(context.Context) error { stopped = append(stopped, "ok"); return nil }},
		bus.Middleware{Name: "bad", Start: func(context.Context) error { return errors.New("no database") }},
	))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(t.Context()); err == nil || !strings.Contains(err.Error(), `"bad"`) {
		t.Fatalf("Start: %v", err)
	}
	if len(stopped) != 1 {
		t.Fatalf("started middleware not stopped: %v", stopped)
	}
	_ = b.Stop(t.Context())
}

// A Start hook that fails because Start's context ended still has the
// hooks already started stopped with a context that has not ended (as
// Stop runs them, bounded by StopGrace): a Stop hook that waits for its
// work, or tells an out-of-process plugin to stop, can do it.
func TestFailingPluginStartStopsTheStartedOnesPastItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stopCtxErr error
	stopped := false
	b, err := bus.New(bus.WithLogger(discard()), bus.WithMiddleware(
		bus.Middleware{Name: "ok", Start: func(context.Context) error { return nil }, Stop: func(ctx context.Context) error {
			stopped, stopCtxErr = true, ctx.Err()
			return nil
		}},
		bus.Middleware{Name: "slow", Start: func(ctx context.Context) error {
			cancel() // Start's deadline passes while this hook waits
			<-ctx.Done()
			return ctx.Err()
		}},
	))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Start: %v", err)
	}
	if !stopped || stopCtxErr != nil {
		t.Fatalf("started middleware stopped %v, with a context that had ended: %v", stopped, stopCtxErr)
	}
	_ = b.Stop(t.Context())
}

// A Start hook may send: Start does not hold what Send needs.
func TestStartHookCanSend(t *testing.T) {
	got := make(chan string, 1)
	var b *bus.Bus
	b, err := bus.New(bus.WithEndpoint("ep"), bus.WithLogger(discard()),
		bus.WithMiddleware(bus.Middleware{Name: "announce", Start: func(ctx context.Context) error {
			return b.Send(ctx, chargeCard{OrderID: "from-start"}, bus.To("ep"))
		}}),
		bus.WithHandler(func(ctx context.Context, m chargeCard, a bus.Attributes) error { got <- m.OrderID; return nil }))
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan error, 1)
	go func() { started <- b.Start(t.Context()) }()
	select {
	case err := <-started:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Start deadlocked on a hook that sends")
	}
	defer b.Stop(context.Background())
	if id := await(t, got); id != "from-start" {
		t.Fatal(id)
	}
}

// Stop waits for the messages being handled.
func TestStopDrainsInFlightMessages(t *testing.T) {
	started := make(chan struct{})
	release := make(chan struct{})
	finished := make(chan struct{})
	b, err := bus.New(bus.WithEndpoint("ep"), bus.WithLogger(discard()),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			close(started)
			<-release
			close(finished)
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(t.Context(), orderPlaced{}); err != nil {
		t.Fatal(err)
	}
	<-started
	stopped := make(chan error)
	go func() { stopped <- b.Stop(context.Background()) }()
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned %v before the in-flight handler finished", err)
	default:
	}
	close(release)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	select {
	case <-finished:
	default:
		t.Fatal("Stop returned before the handler finished")
	}
}

// When Stop's context ends, Stop cancels the handlers' contexts and waits
// for them before it runs the Stop hooks; the interrupted message goes
// back to the queue.
func TestStopTimeoutWaitsForCancelledHandlersBeforeClosing(t *testing.T) {
	started := make(chan struct{})
	var handlerDone, hookRan atomic.Bool
	var hookAfterHandler atomic.Bool
	broker := memory.NewBroker()
	b := startBus(t, bus.WithEndpoint("ep"), bus.WithTransport(memory.New(memory.WithBroker(broker))),
		bus.WithMiddleware(bus.Middleware{Name: "store", Stop: func(context.Context) error {
			hookRan.Store(true)
			hookAfterHandler.Store(handlerDone.Load())
			return nil
		}}),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			close(started)
			<-ctx.Done()
			handlerDone.Store(true)
			return ctx.Err()
		}))
	if err := b.Send(t.Context(), orderPlaced{}); err != nil {
		t.Fatal(err)
	}
	<-started
	stopAtDeadline(t, b)
	if !hookRan.Load() || !hookAfterHandler.Load() {
		t.Fatalf("Stop hook ran %v, after the handler returned %v", hookRan.Load(), hookAfterHandler.Load())
	}
	if n := broker.Depth("ep"); n != 1 {
		t.Fatalf("the cancelled message is not back in the queue: depth %d", n)
	}
}

// A handler cancelled by Stop's deadline has not failed: its message is
// returned for retry even on its last attempt, and what another handler
// sent before it succeeded under a cancelled context still goes out.
func TestStopTimeoutReturnsTheLastAttemptAndFlushesWhatSucceeded(t *testing.T) {
	broker := memory.NewBroker()
	inWaiting, inSending := make(chan struct{}), make(chan struct{})
	b := startBus(t, bus.WithEndpoint("ep"), bus.WithTransport(memory.New(memory.WithBroker(broker))),
		bus.WithConcurrency(2), bus.WithMaxAttempts(1),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			close(inWaiting)
			<-ctx.Done()
			return ctx.Err()
		}),
		bus.WithHandler(func(ctx context.Context, m chargeCard, a bus.Attributes) error {
			close(inSending)
			<-ctx.Done()
			b, _, _ := bus.MessageContext(ctx)
			return b.Send(ctx, orderPlaced{ID: "after-stop"}, bus.To("elsewhere"))
		}))
	if err := b.Send(t.Context(), orderPlaced{}); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(t.Context(), chargeCard{}); err != nil {
		t.Fatal(err)
	}
	<-inWaiting
	<-inSending
	stopAtDeadline(t, b)
	if dl := broker.DeadLetters("ep"); len(dl) != 0 {
		t.Fatalf("Stop dead-lettered %d message(s): %+v", len(dl), dl[0].Failure)
	}
	if n := broker.Depth("ep"); n != 1 {
		t.Fatalf("queue depth %d after Stop; want the interrupted message back (1)", n)
	}
	if n := broker.Depth("elsewhere"); n != 1 {
		t.Fatalf("%d message(s) sent by the handler that succeeded; want 1", n)
	}
}

// The instance queue's loop runs until every other handler returned; a
// handler of its own that waits for its context must not hang Stop.
func TestStopBoundsTheInstanceQueuesHandlers(t *testing.T) {
	tr := memory.New()
	inInstance := make(chan struct{})
	b, err := bus.New(bus.WithEndpoint("ep"), bus.WithTransport(tr), bus.WithLogger(discard()),
		bus.WithMiddleware(bus.Middleware{Name: "replies", InstanceQueue: true}),
		bus.WithHandler(func(ctx context.Context, m chargeCard, a bus.Attributes) error {
			close(inInstance)
			<-ctx.Done()
			return ctx.Err()
		}))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(t.Context(), chargeCard{}, bus.To(tr.InstanceAddress())); err != nil {
		t.Fatal(err)
	}
	<-inInstance
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- b.Stop(ctx) }()
	select {
	case err := <-stopped:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Stop: %v", err)
		}
	case <-time.After(bus.StopGrace + 10*time.Second):
		t.Fatal("Stop hung on a handler of the instance queue")
	}
}

// Stop on a bus that was never started bounds the wait for Deliver calls.
func TestStopOfAnUnstartedBusBoundsDeliver(t *testing.T) {
	broker := memory.NewBroker()
	in, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	b, err := bus.New(bus.WithEndpoint("ep"), bus.WithTransport(memory.New(memory.WithBroker(broker))), bus.WithLogger(discard()),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			close(in)
			<-release
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	body, err := json.Marshal(orderPlaced{ID: "1"})
	if err != nil {
		t.Fatal(err)
	}
	delivered := make(chan error, 1)
	go func() {
		delivered <- b.Deliver(context.Background(), &bus.Delivery{Envelope: bus.Envelope{Name: orderPlaced{}.MessageName(), ContentType: "application/json", Body: body}, Attempt: 1})
	}()
	<-in
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	stopped := make(chan error, 1)
	start := time.Now()
	go func() { stopped <- b.Stop(ctx) }()
	select {
	case err := <-stopped:
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "Deliver calls still running") {
			t.Fatalf("Stop: %v", err)
		}
		if took := time.Since(start); took >= bus.StopGrace {
			t.Fatalf("Stop took %v: there is nothing to cancel, so no grace to wait", took)
		}
	case <-time.After(bus.StopGrace + 10*time.Second):
		t.Fatal("Stop of an unstarted bus hung on a Deliver call")
	}
	release <- struct{}{}
	if err := <-delivered; err != nil {
		t.Fatalf("Deliver: %v", err)
	}
}
