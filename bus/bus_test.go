package bus_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
	"github.com/plugbus/plugbus/transports/memory"
)

func TestCorrelationAndStickyAttributesFlowDownstream(t *testing.T) {
	got := make(chan bus.Attributes, 1)
	var first bus.Attributes
	e := newEnv(t, nil,
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			first = a
			return e0bus(ctx).Send(ctx, chargeCard{OrderID: m.ID}, bus.WithAttribute("hop", "2"))
		}),
		bus.WithHandler(func(ctx context.Context, m chargeCard, a bus.Attributes) error { got <- a; return nil }))
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}, bus.WithAttribute("hop", "1"), bus.WithStickyAttribute("tenant", "acme")); err != nil {
		t.Fatal(err)
	}
	a := recv(t, got)
	if first.MessageID == "" || first.CorrelationID != first.MessageID {
		t.Fatalf("first message: id %q correlation %q (a new conversation is correlated by its first id)", first.MessageID, first.CorrelationID)
	}
	if a.CorrelationID != first.CorrelationID {
		t.Fatalf("correlation id not inherited: %s vs %s", a.CorrelationID, first.CorrelationID)
	}
	if a.MessageID == first.MessageID || a.MessageID == "" {
		t.Fatalf("message id %q not new", a.MessageID)
	}
	if v, _ := a.StickyValue("tenant"); v != "acme" {
		t.Fatalf("sticky attribute not copied: %q", v)
	}
	if v, _ := a.Value("hop"); v != "2" {
		t.Fatalf("one-hop attribute: %q, want only the new message's own", v)
	}
	if a.SentAt.IsZero() || a.SentAt.Before(first.SentAt) {
		t.Fatalf("sent-at %v before %v", a.SentAt, first.SentAt)
	}
}

func TestMaxAttemptsDeadLettersWithMetadata(t *testing.T) {
	calls := atomic.Int32{}
	e := newEnv(t, nil, bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
		calls.Add(1)
		return errors.New("card declined")
	}, bus.HandlerName("charge")))
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}, bus.WithMessageID("m-dl")); err != nil {
		t.Fatal(err)
	}
	e.expect("return")
	e.expect("return")
	s := e.expect("fail")
	if calls.Load() != 3 {
		t.Fatalf("handler ran %d times, want 3", calls.Load())
	}
	dl := e.broker.DeadLetters("ep")
	if len(dl) != 1 {
		t.Fatalf("%d dead letters", len(dl))
	}
	f := dl[0].Failure
	if f.Attempts != 3 || f.Endpoint != "ep" || !strings.Contains(f.Reason, "charge: card declined") || f.Time.IsZero() {
		t.Fatalf("failure %+v", f)
	}
	if dl[0].Envelope.Attributes.MessageID != "m-dl" || s.d.Attributes.MessageID != "m-dl" {
		t.Fatalf("dead letter lost the message id: %s", dl[0].Envelope.Attributes.MessageID)
	}
}

func TestUndecodableMessageDeadLettersAtOnce(t *testing.T) {
	ran := make(chan struct{}, 1)
	e := newEnv(t, nil, bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
		ran <- struct{}{}
		return nil
	}))
	raw := memory.New(memory.WithBroker(e.broker))
	poison := &bus.Envelope{Name: "shop.order_placed", ContentType: "application/json", Body: []byte(`{"id": 42`),
		Attributes: bus.NewAttributes("m-poison", "c", e0(), nil, nil)}
	if err := raw.Send(t.Context(), poison, bus.SendOptions{Destination: "ep"}); err != nil {
		t.Fatal(err)
	}
	noName := &bus.Envelope{Body: []byte(`{}`), Attributes: bus.NewAttributes("m-noname", "c", e0(), nil, nil)}
	if err := raw.Send(t.Context(), noName, bus.SendOptions{Destination: "ep"}); err != nil {
		t.Fatal(err)
	}
	s := e.expect("fail")
	if s.d.Attempt != 1 || !strings.Contains(s.failure.Reason, "cannot be decoded into bus_test.orderPlaced") {
		t.Fatalf("poison dead-lettered after %d attempts with %q", s.d.Attempt, s.failure.Reason)
	}
	s = e.expect("fail")
	if !strings.Contains(s.failure.Reason, "no name") {
		t.Fatalf("unnamed message reason %q", s.failure.Reason)
	}
	if len(ran) != 0 {
		t.Fatal("handler ran for an undecodable message")
	}
	if dl := e.broker.DeadLetters("ep"); len(dl) != 2 || dl[0].Envelope.Attributes.MessageID != "m-poison" {
		t.Fatalf("dead letters %+v", dl)
	}
}

func TestPanicsAreRecoveredAsErrors(t *testing.T) {
	e := newEnv(t, nil,
		bus.WithMiddleware(bus.Middleware{Name: "panics", Outgoing: func(ctx context.Context, out *bus.Outgoing, next bus.Next) error {
			if out.Name() == "shop.order_shipped" {
				panic("outgoing panic")
			}
			return next(ctx)
		}}),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			panic(errors.New("handler panic"))
		}))
	err := e.bus.Publish(t.Context(), orderShipped{})
	var pe *bus.PanicError
	if !errors.As(err, &pe) || !errors.Is(err, bus.ErrPanic) || pe.Value != "outgoing panic" || len(pe.Stack) == 0 {
		t.Fatalf("outgoing panic: %v", err)
	}
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}); err != nil {
		t.Fatal(err)
	}
	s := e.expect("return")
	if !errors.Is(s.cause, bus.ErrPanic) || !strings.Contains(s.cause.Error(), "handler panic") {
		t.Fatalf("handler panic surfaced as %v", s.cause)
	}
}

func TestIncomingPanicIsRetried(t *testing.T) {
	e := newEnv(t, nil,
		bus.WithMiddleware(bus.Middleware{Name: "panics", Incoming: func(ctx context.Context, in *bus.Incoming, next bus.Next) error {
			panic("incoming panic")
		}}),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error { return nil }))
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}); err != nil {
		t.Fatal(err)
	}
	if s := e.expect("return"); !errors.Is(s.cause, bus.ErrPanic) {
		t.Fatalf("cause %v", s.cause)
	}
}

func TestTwoBusesAreIsolated(t *testing.T) {
	broker := memory.NewBroker()
	var aOut, bOut, aIn, bIn atomic.Int32
	count := func(name string, in, out *atomic.Int32) bus.Plugin {
		return bus.PluginFunc(func(info bus.PluginInfo) (bus.Middleware, error) {
			return bus.Middleware{
				Name:     name,
				Incoming: func(ctx context.Context, _ *bus.Incoming, next bus.Next) error { in.Add(1); return next(ctx) },
				Outgoing: func(ctx context.Context, _ *bus.Outgoing, next bus.Next) error { out.Add(1); return next(ctx) },
			}, nil
		})
	}
	charged := make(chan string, 10)
	var busB *bus.Bus
	sendErr := make(chan error, 10)
	a := newEnv(t, broker, bus.WithMiddleware(count("a", &aIn, &aOut)),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, at bus.Attributes) error {
			// bus B's Send with bus A's handler context is not buffered in A's outbox
			sendErr <- busB.Send(ctx, chargeCard{OrderID: m.ID}, bus.To("billing"))
			return errors.New("a fails: its own sends are discarded, B's are not A's")
		}))
	b, err := bus.New(bus.WithEndpoint("billing"), bus.WithTransport(memory.New(memory.WithBroker(broker))),
		bus.WithLogger(discard()), bus.WithMiddleware(count("b", &bIn, &bOut)),
		bus.WithHandler(func(ctx context.Context, m chargeCard, at bus.Attributes) error {
			if _, _, ok := bus.MessageContext(ctx); !ok {
				return errors.New("no message context")
			}
			charged <- m.OrderID
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	busB = b
	if err := b.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop(context.Background()) })
	if err := a.bus.Send(t.Context(), orderPlaced{ID: "1"}); err != nil {
		t.Fatal(err)
	}
	if err := recv(t, sendErr); err != nil {
		t.Fatal(err)
	}
	if got := recv(t, charged); got != "1" {
		t.Fatalf("charged %s", got)
	}
	a.expect("return")
	if aOut.Load() != 1 || bOut.Load() < 1 || bIn.Load() < 1 {
		t.Fatalf("middleware counts: a out %d, b out %d, b in %d", aOut.Load(), bOut.Load(), bIn.Load())
	}
	if aIn.Load() < 1 {
		t.Fatal("a's incoming middleware did not run")
	}
}

func TestPluginsInstantiatedOncePerBusWithLifecycle(t *testing.T) {
	var made atomic.Int32
	var order []string
	plugin := func(name string) bus.Plugin {
		return bus.PluginFunc(func(info bus.PluginInfo) (bus.Middleware, error) {
			made.Add(1)
			if info.Endpoint != "ep" || info.Bus == nil || info.Logger == nil || info.Transport == nil || len(info.Handles) != 1 {
				t.Errorf("plugin info %+v", info)
			}
			return bus.Middleware{
				Name:  name,
				Start: func(context.Context) error { order = append(order, "start "+name); return nil },
				Stop:  func(context.Context) error { order = append(order, "stop "+name); return nil },
			}, nil
		})
	}
	b, err := bus.New(bus.WithEndpoint("ep"), bus.WithLogger(discard()), bus.WithMiddleware(plugin("p1"), plugin("p2")),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	if made.Load() != 2 {
		t.Fatalf("plugins instantiated %d times", made.Load())
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
	if made.Load() != 2 {
		t.Fatalf("plugins instantiated %d times", made.Load())
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

func TestNewRejectsBadConfiguration(t *testing.T) {
	handler := bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error { return nil })
	for name, opts := range map[string][]bus.Option{
		"handlers without endpoint": {handler},
		"zero concurrency":          {bus.WithConcurrency(0)},
		"zero attempts":             {bus.WithMaxAttempts(0)},
		"nil plugin":                {bus.WithMiddleware(nil)},
		"unnamed middleware":        {bus.WithMiddleware(bus.Middleware{})},
		"failing plugin": {bus.WithMiddleware(bus.PluginFunc(func(bus.PluginInfo) (bus.Middleware, error) {
			return bus.Middleware{}, errors.New("bad config")
		}))},
	} {
		if _, err := bus.New(opts...); err == nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
}

func TestSendOnlyBusAndRouting(t *testing.T) {
	broker := memory.NewBroker()
	got := make(chan string, 2)
	newEnv(t, broker, bus.WithHandler(func(ctx context.Context, m chargeCard, a bus.Attributes) error { got <- m.OrderID; return nil }))
	sender, err := bus.New(bus.WithTransport(memory.New(memory.WithBroker(broker))), bus.WithRoute("ep", chargeCard{}), bus.WithLogger(discard()))
	if err != nil {
		t.Fatal(err)
	}
	defer sender.Stop(context.Background())
	ctx := t.Context()
	if err := sender.Send(ctx, chargeCard{OrderID: "routed"}); err != nil {
		t.Fatal(err)
	}
	if err := sender.Send(ctx, chargeCard{OrderID: "direct"}, bus.To("ep")); err != nil {
		t.Fatal(err)
	}
	if a, b := recv(t, got), recv(t, got); a != "routed" || b != "direct" {
		t.Fatalf("got %s, %s", a, b)
	}
	if err := sender.Send(ctx, orderPlaced{}); !errors.Is(err, bus.ErrNoRoute) || !strings.Contains(err.Error(), "bus.To") {
		t.Fatalf("unrouted send: %v", err)
	}
}

func TestHeaderReservedRefusedAtSendTime(t *testing.T) {
	e := newEnv(t, nil,
		bus.WithTransport(reserving{memory.New()}),
		bus.WithMiddleware(bus.Middleware{Name: "sets-reserved", Outgoing: func(ctx context.Context, out *bus.Outgoing, next bus.Next) error {
			out.Headers()["x-reserved"] = "1"
			return next(ctx)
		}}),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error { return nil }))
	err := e.bus.Send(t.Context(), orderPlaced{})
	var hr *bus.HeaderReservedError
	if !errors.Is(err, bus.ErrHeaderReserved) || !errors.As(err, &hr) || hr.Header != "x-reserved" {
		t.Fatalf("Send: %v", err)
	}
}

// reserving is a memory transport that reserves the header x-reserved.
type reserving struct{ *memory.Transport }

func (reserving) ValidateHeaders(h bus.Headers) error {
	if _, ok := h["x-reserved"]; ok {
		return &bus.HeaderReservedError{Transport: "test", Header: "x-reserved"}
	}
	return nil
}

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

func TestDeliverReportsOutcome(t *testing.T) {
	boom := errors.New("boom")
	b, err := bus.New(bus.WithEndpoint("ep"), bus.WithLogger(discard()),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			if m.ID == "bad" {
				return boom
			}
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop(context.Background())
	ctx := t.Context()
	if err := b.Deliver(ctx, bustest.Delivery(orderPlaced{ID: "good"}, bus.Attributes{})); err != nil {
		t.Fatalf("good: %v", err)
	}
	if err := b.Deliver(ctx, bustest.Delivery(orderPlaced{ID: "bad"}, bus.Attributes{})); !errors.Is(err, boom) {
		t.Fatalf("bad: %v", err)
	}
	poison := bustest.Delivery(orderPlaced{}, bus.Attributes{})
	poison.Body = []byte("not json")
	if err := b.Deliver(ctx, poison); !errors.Is(err, bus.ErrDecode) {
		t.Fatalf("poison: %v", err)
	}
}

func TestSendAfterHandlerReturnedIsRefused(t *testing.T) {
	kept := make(chan context.Context, 1)
	e := newEnv(t, nil, bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
		kept <- ctx
		return nil
	}))
	if err := e.bus.Send(t.Context(), orderPlaced{}); err != nil {
		t.Fatal(err)
	}
	ctx := recv(t, kept)
	e.expect("delete")
	if err := e.bus.Send(ctx, chargeCard{}, bus.To("ep")); err == nil || !strings.Contains(err.Error(), "already returned") {
		t.Fatalf("send with a finished handler's context: %v", err)
	}
}

func TestContextWithOutbox(t *testing.T) {
	b, err := bus.New(bus.WithLogger(discard()), bus.WithRoute("ep", chargeCard{}))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop(context.Background())
	var box collect
	ctx := bus.ContextWithOutbox(t.Context(), b, &box)
	if err := b.Send(ctx, chargeCard{OrderID: "1"}, bus.WithMessageID("m-1")); err != nil {
		t.Fatal(err)
	}
	if len(box) != 1 || box[0].Envelope.Attributes.MessageID != "m-1" || box[0].Options.Destination != "ep" || box[0].Kind != bus.KindSend {
		t.Fatalf("outbox got %+v", box)
	}
	other, _ := bus.New(bus.WithLogger(discard()), bus.WithRoute("ep", chargeCard{}))
	defer other.Stop(context.Background())
	if err := other.Send(ctx, chargeCard{}); err != nil { // another bus ignores it
		t.Fatal(err)
	}
	if len(box) != 1 {
		t.Fatal("another bus used this bus's outbox")
	}
}

// Inside a handler an outbox put in the context takes the message instead
// of the handler's buffer (it commits with the caller's transaction, not
// with the handler); Immediately goes past every outbox.
func TestContextWithOutboxInsideAHandlerAndImmediately(t *testing.T) {
	broker := memory.NewBroker()
	var box collect
	var b *bus.Bus
	b, err := bus.New(bus.WithEndpoint("ep"), bus.WithLogger(discard()), bus.WithTransport(memory.New(memory.WithBroker(broker))),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			ctx = bus.ContextWithOutbox(ctx, b, &box)
			if err := b.Send(ctx, chargeCard{OrderID: "stored"}, bus.To("billing")); err != nil {
				return err
			}
			if err := b.Send(ctx, chargeCard{OrderID: "now"}, bus.To("billing"), bus.Immediately()); err != nil {
				return err
			}
			if n := broker.Depth("billing"); n != 1 {
				return fmt.Errorf("billing depth %d inside the handler; want the Immediately send (1)", n)
			}
			return errors.New("the handler fails after its caller's transaction committed")
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop(context.Background())
	if err := b.Deliver(t.Context(), bustest.Delivery(orderPlaced{ID: "1"}, bus.Attributes{})); err == nil || !strings.Contains(err.Error(), "transaction committed") {
		t.Fatalf("Deliver: %v", err)
	}
	if len(box) != 1 || box[0].Envelope.Attributes.CorrelationID == "" {
		t.Fatalf("the context's outbox got %d message(s): %+v", len(box), box)
	}
	if n := broker.Depth("billing"); n != 1 {
		t.Fatalf("billing depth %d after the handler failed; want the Immediately send only (1)", n)
	}
}

type collect []bus.Outbound

func (c *collect) Add(_ context.Context, m bus.Outbound) error { *c = append(*c, m); return nil }

func TestInstanceQueue(t *testing.T) {
	got := make(chan string, 1)
	needs := bus.Middleware{Name: "replies", InstanceQueue: true,
		Incoming: func(ctx context.Context, in *bus.Incoming, next bus.Next) error {
			got <- in.Name()
			return nil
		}}
	if _, err := bus.New(bus.WithTransport(nullTransport{}), bus.WithMiddleware(needs)); err == nil || !strings.Contains(err.Error(), "InstanceQueuer") {
		t.Fatalf("New with a transport lacking instance queues: %v", err)
	}
	broker := memory.NewBroker()
	tr := memory.New(memory.WithBroker(broker))
	b, err := bus.New(bus.WithTransport(tr), bus.WithLogger(discard()), bus.WithMiddleware(needs)) // no endpoint
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer b.Stop(context.Background())
	other, _ := bus.New(bus.WithTransport(memory.New(memory.WithBroker(broker))), bus.WithLogger(discard()))
	defer other.Stop(context.Background())
	if err := other.Send(t.Context(), chargeCard{}, bus.To(tr.InstanceAddress())); err != nil {
		t.Fatal(err)
	}
	if name := recv(t, got); name != "shop.charge_card" {
		t.Fatalf("instance received %s", name)
	}
}

// A middleware that calls next on another goroutine and stops waiting
// (a timeout) must not crash the process nor let its next run another
// message's chain.
func TestNextOnAnotherGoroutineOutlivingItsMiddleware(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{})
	inner := make(chan string, 8)
	lateErr := make(chan error, 1)
	handled := make(chan string, 8)
	detached := func(in *bus.Incoming) bool { return in.Attributes().MessageID == "slow" && in.Attempt() == 1 }
	timeout := bus.Middleware{Name: "timeout", Incoming: func(ctx context.Context, in *bus.Incoming, next bus.Next) error {
		if !detached(in) {
			return next(ctx)
		}
		go func() { lateErr <- next(ctx) }() // outlives this middleware
		<-entered                            // the rest of the chain is running on that goroutine
		return errors.New("timed out")
	}}
	probe := bus.Middleware{Name: "probe", Incoming: func(ctx context.Context, in *bus.Incoming, next bus.Next) error {
		if detached(in) {
			close(entered)
			<-release
		}
		// reads its context after the outer layer returned
		inner <- fmt.Sprintf("%s/%d", in.Attributes().MessageID, in.Attempt())
		return next(ctx)
	}}
	e := newEnv(t, nil, bus.WithMiddleware(timeout, probe),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			handled <- a.MessageID
			return nil
		}))
	ctx := t.Context()
	if err := e.bus.Send(ctx, orderPlaced{}, bus.WithMessageID("slow")); err != nil {
		t.Fatal(err)
	}
	if s := e.expect("return"); s.d.Attributes.MessageID != "slow" { // the timeout returned it for retry
		t.Fatalf("returned %s", s.d.Attributes.MessageID)
	}
	// Other messages, and the retry, flow while the detached next is still
	// waiting inside "probe".
	if err := e.bus.Send(ctx, orderPlaced{}, bus.WithMessageID("fast")); err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"slow/2": true, "fast/1": true}
	for range 2 {
		if got := recv(t, inner); !want[got] {
			t.Fatalf("probe saw %s", got)
		}
		e.expect("delete")
	}
	close(release)
	if got := recv(t, inner); got != "slow/1" {
		t.Fatalf("detached next saw %s, want its own message", got)
	}
	if err := recv(t, lateErr); err != nil {
		t.Fatalf("detached next: %v", err)
	}
	counts := map[string]int{}
	for range 3 {
		counts[recv(t, handled)]++
	}
	if counts["slow"] != 2 || counts["fast"] != 1 {
		t.Fatalf("handled %v", counts)
	}
}

// A next handed to a goroutine that runs only after the middleware
// returned gets an error instead of running a later message's chain.
func TestNextCalledAfterReturnOnAnotherGoroutine(t *testing.T) {
	kept := make(chan bus.Next, 1)
	ran := make(chan string, 4)
	e := newEnv(t, nil,
		bus.WithMiddleware(bus.Middleware{Name: "keeps", Incoming: func(ctx context.Context, in *bus.Incoming, next bus.Next) error {
			if in.Attributes().MessageID == "first" {
				kept <- next
				return nil // short-circuit; next escapes
			}
			return next(ctx)
		}}),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error { ran <- a.MessageID; return nil }))
	ctx := t.Context()
	if err := e.bus.Send(ctx, orderPlaced{}, bus.WithMessageID("first")); err != nil {
		t.Fatal(err)
	}
	e.expect("delete")
	next := recv(t, kept)
	if err := e.bus.Send(ctx, orderPlaced{}, bus.WithMessageID("second")); err != nil {
		t.Fatal(err)
	}
	if got := recv(t, ran); got != "second" {
		t.Fatalf("ran %s", got)
	}
	e.expect("delete")
	err := next(ctx)
	var nt *bus.NextMisuseError
	if !errors.As(err, &nt) || !nt.AfterReturn {
		t.Fatalf("late next: %v", err)
	}
	if len(ran) != 0 {
		t.Fatal("a late next ran a handler")
	}
}

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
	if id := recv(t, got); id != "from-start" {
		t.Fatal(id)
	}
}

func TestStopTimeoutWaitsForCancelledHandlersBeforeClosing(t *testing.T) {
	started := make(chan struct{})
	var handlerDone, hookRan atomic.Bool
	var hookAfterHandler atomic.Bool
	broker := memory.NewBroker()
	b, err := bus.New(bus.WithEndpoint("ep"), bus.WithLogger(discard()), bus.WithTransport(memory.New(memory.WithBroker(broker))),
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
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := b.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop: %v", err)
	}
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
	b, err := bus.New(bus.WithEndpoint("ep"), bus.WithLogger(discard()), bus.WithTransport(memory.New(memory.WithBroker(broker))),
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
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(t.Context(), orderPlaced{}); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(t.Context(), chargeCard{}); err != nil {
		t.Fatal(err)
	}
	<-inWaiting
	<-inSending
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := b.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop: %v", err)
	}
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

func TestManyMessagesConcurrentlyThroughPooledRuns(t *testing.T) {
	const n = 3000
	mismatch := make(chan string, 1)
	check := bus.Middleware{
		Name: "check",
		Incoming: func(ctx context.Context, in *bus.Incoming, next bus.Next) error {
			return next(context.WithValue(ctx, idKey{}, in.Attributes().MessageID))
		},
		Handling: func(ctx context.Context, h *bus.Handling, next bus.Next) error {
			if ctx.Value(idKey{}) != h.Attributes().MessageID {
				select {
				case mismatch <- h.Attributes().MessageID:
				default:
				}
			}
			return next(ctx)
		},
		Outgoing: func(ctx context.Context, out *bus.Outgoing, next bus.Next) error {
			out.SetValue("sent-as", out.MessageID())
			return next(ctx)
		},
	}
	var seen sync.Map
	var count atomic.Int64
	done := make(chan struct{})
	b := bustest.Start(t, bus.WithEndpoint("ep"), bus.WithLogger(discard()), bus.WithConcurrency(8), bus.WithMiddleware(check, check2()),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			if v, _ := a.Value("sent-as"); v != a.MessageID || ctx.Value(idKey{}) != a.MessageID {
				select {
				case mismatch <- a.MessageID:
				default:
				}
			}
			if _, dup := seen.LoadOrStore(a.MessageID, true); !dup && count.Add(1) == n {
				close(done)
			}
			return nil
		}))
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < n; i += 8 {
				if err := b.Send(t.Context(), orderPlaced{ID: strconv.Itoa(i)}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	select {
	case <-done:
	case id := <-mismatch:
		t.Fatalf("message %s saw another message's context", id)
	case <-time.After(30 * time.Second):
		t.Fatalf("handled %d of %d", count.Load(), n)
	}
	select {
	case id := <-mismatch:
		t.Fatalf("message %s saw another message's context", id)
	default:
	}
}

type idKey struct{}

// check2 is a second pass-through layer, so that pooled runs have depth.
func check2() bus.Middleware {
	return bus.Middleware{Name: "check2",
		Incoming: func(ctx context.Context, _ *bus.Incoming, next bus.Next) error { return next(ctx) },
		Handling: func(ctx context.Context, _ *bus.Handling, next bus.Next) error { return next(ctx) },
	}
}

func TestHandlerErrorWrappingADecodeErrorIsRetried(t *testing.T) {
	e := newEnv(t, nil, bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
		return fmt.Errorf("nested: %w", &bus.DecodeError{Message: "inner", Type: "x", Err: errors.New("bad")})
	}))
	if err := e.bus.Send(t.Context(), orderPlaced{}); err != nil {
		t.Fatal(err)
	}
	e.expect("return") // not dead-lettered at once: it is the handler's error
}

func TestUseOutboxMovesWhatWasAlreadySent(t *testing.T) {
	var box collect
	e := newEnv(t, nil,
		bus.WithMiddleware(bus.Middleware{Name: "late-outbox", Handling: func(ctx context.Context, h *bus.Handling, next bus.Next) error {
			if err := next(ctx); err != nil {
				return err
			}
			_, err := h.UseOutbox(ctx, &box) // after the handler sent: its buffer moves to box
			return err
		}}),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			return e0bus(ctx).Send(ctx, chargeCard{OrderID: "moved"}, bus.To("elsewhere"))
		}))
	if err := e.bus.Send(t.Context(), orderPlaced{}); err != nil {
		t.Fatal(err)
	}
	e.expect("delete")
	if len(box) != 1 || box[0].Envelope.Name != "shop.charge_card" || box[0].Options.Destination != "elsewhere" {
		t.Fatalf("outbox got %+v", box)
	}
	if n := e.broker.Depth("elsewhere"); n != 0 {
		t.Fatalf("%d messages reached the transport although they moved to the outbox", n)
	}
}

func TestDuplicateHandlerNamesRefused(t *testing.T) {
	h := func(ctx context.Context, m orderPlaced, a bus.Attributes) error { return nil }
	_, err := bus.New(bus.WithEndpoint("ep"), bus.WithHandler(h, bus.HandlerName("x")), bus.WithHandler(h, bus.HandlerName("x")))
	if err == nil || !strings.Contains(err.Error(), "bus.HandlerName") {
		t.Fatalf("New with two handlers named x: %v", err)
	}
}

func TestUseOutboxRestoreSendsLaterOnesToTheBuffer(t *testing.T) {
	l := newBrokerWithListener(t)
	var box collect
	e := newEnv(t, l.broker,
		bus.WithMiddleware(
			bus.Middleware{Name: "outer", Handling: func(ctx context.Context, h *bus.Handling, next bus.Next) error {
				err := next(ctx)
				// after the inner outbox's transaction ended: back to the bus's buffer
				return errors.Join(err, e0bus(ctx).Send(ctx, chargeCard{OrderID: "after"}, bus.To("listener")))
			}},
			bus.Middleware{Name: "tx", Handling: func(ctx context.Context, h *bus.Handling, next bus.Next) error {
				restore, err := h.UseOutbox(ctx, &box)
				defer restore()
				if err != nil {
					return err
				}
				return next(ctx)
			}}),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			return e0bus(ctx).Send(ctx, chargeCard{OrderID: "inside"}, bus.To("listener"))
		}))
	if err := e.bus.Send(t.Context(), orderPlaced{}); err != nil {
		t.Fatal(err)
	}
	e.expect("delete")
	if len(box) != 1 {
		t.Fatalf("outbox got %d messages, want the one sent inside", len(box))
	}
	if got := l.take(t); got != "after" {
		t.Fatalf("listener got %s", got)
	}
	l.expectEmpty(t)
}

// A handler waiting for a message on its instance queue (a reply) must get
// it although it holds the bus's only worker.
func TestInstanceQueueReceivedBesideBusyWorkers(t *testing.T) {
	tr := memory.New()
	replies := make(chan string, 1)
	resolver := bus.Middleware{Name: "replies", InstanceQueue: true,
		Incoming: func(ctx context.Context, in *bus.Incoming, next bus.Next) error {
			if in.Name() == "shop.charge_card" {
				replies <- in.Attributes().MessageID
				return nil // resolved without handlers
			}
			return next(ctx)
		}}
	got := make(chan string, 1)
	b := bustest.Start(t, bus.WithEndpoint("ep"), bus.WithTransport(tr), bus.WithLogger(discard()), bus.WithConcurrency(1),
		bus.WithMiddleware(resolver),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			b, _, _ := bus.MessageContext(ctx)
			if err := b.Send(ctx, chargeCard{}, bus.To(tr.InstanceAddress()), bus.Immediately(), bus.WithMessageID("reply-1")); err != nil {
				return err
			}
			select { // the only worker waits here
			case id := <-replies:
				got <- id
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}))
	if err := b.Send(t.Context(), orderPlaced{}); err != nil {
		t.Fatal(err)
	}
	if id := recv(t, got); id != "reply-1" {
		t.Fatalf("got %s", id)
	}
}

// An outgoing middleware that drops a message (does not call next), or
// returns an error after next: inside a handler and into a context's
// outbox, Send returns nil or that error and nothing is buffered or
// stored, while the handler's other sends go out.
func TestOutgoingDropOrErrorAfterNextStoresNothing(t *testing.T) {
	for _, c := range []struct {
		name    string
		mw      func(ctx context.Context, next bus.Next) error // for chargeCard
		wantErr string                                         // "" for nil
	}{
		{"drop", func(context.Context, bus.Next) error { return nil }, ""},
		{"error after next", func(ctx context.Context, next bus.Next) error {
			if err := next(ctx); err != nil {
				return err
			}
			return errors.New("audit write failed")
		}, "audit write failed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			check := func(err error) error {
				if (c.wantErr == "" && err != nil) || (c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr))) {
					return fmt.Errorf("Send = %v, want %q", err, c.wantErr)
				}
				return nil
			}
			broker := memory.NewBroker()
			mw := bus.Middleware{Name: "mw", Outgoing: func(ctx context.Context, out *bus.Outgoing, next bus.Next) error {
				if out.Name() == (chargeCard{}).MessageName() {
					return c.mw(ctx, next)
				}
				return next(ctx)
			}}
			var b *bus.Bus
			b, err := bus.New(bus.WithEndpoint("ep"), bus.WithLogger(discard()), bus.WithTransport(memory.New(memory.WithBroker(broker))),
				bus.WithMiddleware(mw),
				bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
					if err := check(b.Send(ctx, chargeCard{}, bus.To("billing"))); err != nil {
						return err
					}
					return b.Send(ctx, orderShipped{}, bus.To("shipping")) // the handler goes on
				}))
			if err != nil {
				t.Fatal(err)
			}
			defer b.Stop(context.Background())
			if err := b.Deliver(t.Context(), bustest.Delivery(orderPlaced{ID: "1"}, bus.Attributes{})); err != nil {
				t.Fatal(err)
			}
			if billing, shipping := broker.Depth("billing"), broker.Depth("shipping"); billing != 0 || shipping != 1 {
				t.Fatalf("billing %d, shipping %d after the handler succeeded; want 0 and 1", billing, shipping)
			}
			var box collect
			if err := check(b.Send(bus.ContextWithOutbox(t.Context(), b, &box), chargeCard{}, bus.To("billing"))); err != nil {
				t.Fatal(err)
			}
			if len(box) != 0 {
				t.Fatalf("the outbox stored %d message(s)", len(box))
			}
		})
	}
}

// blockingValidator holds header validation (part of the outgoing terminal
// step) until released.
type blockingValidator struct {
	bus.Transport
	in, release chan struct{}
}

func (v *blockingValidator) ValidateHeaders(bus.Headers) error {
	close(v.in)
	<-v.release
	return nil
}

// An outgoing middleware that returns nil while the next it called still
// runs on another goroutine: a send into the handler's buffer says it was
// not stored, and nothing is sent.
func TestOutgoingMiddlewareReturningBeforeItsNextStoresNothing(t *testing.T) {
	broker := memory.NewBroker()
	tr := &blockingValidator{Transport: memory.New(memory.WithBroker(broker)), in: make(chan struct{}), release: make(chan struct{})}
	detached := make(chan error, 1)
	early := bus.Middleware{Name: "early", Outgoing: func(ctx context.Context, out *bus.Outgoing, next bus.Next) error {
		out.Headers()["x-audit"] = "1"
		go func() { detached <- next(ctx) }()
		<-tr.in // the terminal step runs
		return nil
	}}
	var b *bus.Bus
	b, err := bus.New(bus.WithEndpoint("ep"), bus.WithLogger(discard()), bus.WithTransport(tr), bus.WithMiddleware(early),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			err := b.Send(ctx, chargeCard{}, bus.To("billing"))
			close(tr.release)
			if err == nil || !strings.Contains(err.Error(), "returned before the next it called did") {
				return fmt.Errorf("Send = %v, want the message reported not stored", err)
			}
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop(context.Background())
	if err := b.Deliver(t.Context(), bustest.Delivery(orderPlaced{ID: "1"}, bus.Attributes{})); err != nil {
		t.Fatal(err)
	}
	if err := <-detached; err != nil {
		t.Fatalf("the detached next: %v", err)
	}
	if n := broker.Depth("billing"); n != 0 {
		t.Fatalf("billing depth %d; want nothing sent", n)
	}
}
