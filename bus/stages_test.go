package bus_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/memory"
)

// trace records the order in which stage code runs.
type trace struct {
	mu  sync.Mutex
	log []string
}

func (tr *trace) add(s string) {
	tr.mu.Lock()
	tr.log = append(tr.log, s)
	tr.mu.Unlock()
}

func (tr *trace) get() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return slices.Clone(tr.log)
}

// layer is a pass-through middleware on all three stages that records
// entering and leaving each.
func layer(name string, tr *trace) bus.Middleware {
	return bus.Middleware{
		Name: name,
		Incoming: func(ctx context.Context, in *bus.Incoming, next bus.Next) error {
			tr.add("in>" + name)
			err := next(ctx)
			tr.add("in<" + name)
			return err
		},
		Handling: func(ctx context.Context, h *bus.Handling, next bus.Next) error {
			tr.add("h>" + name)
			err := next(ctx)
			tr.add("h<" + name)
			return err
		},
		Outgoing: func(ctx context.Context, out *bus.Outgoing, next bus.Next) error {
			tr.add("out>" + name)
			err := next(ctx)
			tr.add("out<" + name)
			return err
		},
	}
}

func TestOrderFirstRegisteredIsOutermost(t *testing.T) {
	tr := &trace{}
	e := newEnv(t, nil,
		bus.WithMiddleware(layer("a", tr), layer("b", tr), layer("c", tr)),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			tr.add("handler")
			return nil
		}))
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}); err != nil {
		t.Fatal(err)
	}
	e.expect("delete")
	want := []string{
		"out>a", "out>b", "out>c", "out<c", "out<b", "out<a",
		"in>a", "in>b", "in>c", "h>a", "h>b", "h>c", "handler", "h<c", "h<b", "h<a", "in<c", "in<b", "in<a",
	}
	if got := tr.get(); !slices.Equal(got, want) {
		t.Fatalf("order:\n got %v\nwant %v", got, want)
	}
}

func TestIncomingRunsForPolledPushedAndUnhandled(t *testing.T) {
	seen := make(chan string, 10)
	mw := bus.Middleware{Name: "seen", Incoming: func(ctx context.Context, in *bus.Incoming, next bus.Next) error {
		seen <- in.Name()
		return next(ctx)
	}}
	handled := make(chan string, 10)
	e := newEnv(t, nil, bus.WithMiddleware(mw), bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
		handled <- m.ID
		return nil
	}))
	ctx := t.Context()

	// polled
	if err := e.bus.Send(ctx, orderPlaced{ID: "polled"}); err != nil {
		t.Fatal(err)
	}
	if got := recv(t, seen); got != "shop.order_placed" {
		t.Fatalf("incoming saw %s", got)
	}
	if got := recv(t, handled); got != "polled" {
		t.Fatalf("handled %s", got)
	}
	e.expect("delete")

	// pushed
	d := &bus.Delivery{Envelope: bus.Envelope{Name: "shop.order_placed", Body: []byte(`{"id":"pushed"}`),
		Attributes: bus.NewAttributes("m-push", "c-push", e0(), nil, nil)}}
	if err := e.bus.Deliver(ctx, d); err != nil {
		t.Fatalf("Deliver: %v", err)
	}
	if got := recv(t, seen); got != "shop.order_placed" {
		t.Fatalf("incoming saw %s", got)
	}
	if got := recv(t, handled); got != "pushed" {
		t.Fatalf("handled %s", got)
	}

	// no handler: incoming still runs, then the message is dead-lettered
	if err := e.bus.Send(ctx, unhandled{}, bus.To("ep")); err != nil {
		t.Fatal(err)
	}
	if got := recv(t, seen); got != "shop.unhandled" {
		t.Fatalf("incoming saw %s", got)
	}
	if s := e.expect("fail"); s.d.Name != "shop.unhandled" {
		t.Fatalf("dead-lettered %s", s.d.Name)
	}
}

func TestIncomingNotCallingNextDeletes(t *testing.T) {
	ran := make(chan struct{}, 1)
	e := newEnv(t, nil,
		bus.WithMiddleware(bus.Middleware{Name: "gate", Incoming: func(ctx context.Context, in *bus.Incoming, next bus.Next) error {
			return nil
		}}),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			ran <- struct{}{}
			return nil
		}))
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}); err != nil {
		t.Fatal(err)
	}
	e.expect("delete")
	select {
	case <-ran:
		t.Fatal("handler ran although incoming middleware did not call next")
	default:
	}
	if logs := e.logs.String(); !strings.Contains(logs, `"middleware":"gate"`) || !strings.Contains(logs, "handlers skipped") {
		t.Fatalf("no debug log naming the middleware that handled the message:\n%s", logs)
	}
}

func TestIncomingErrorReturnsForRetryThenDeadLetters(t *testing.T) {
	boom := errors.New("incoming boom")
	e := newEnv(t, nil,
		bus.WithMiddleware(bus.Middleware{Name: "fails", Incoming: func(ctx context.Context, in *bus.Incoming, next bus.Next) error {
			return boom
		}}),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error { return nil }))
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}); err != nil {
		t.Fatal(err)
	}
	var id string
	for attempt := 1; attempt <= 2; attempt++ {
		s := e.expect("return")
		if s.d.Attempt != attempt || !errors.Is(s.cause, boom) {
			t.Fatalf("return: attempt %d cause %v", s.d.Attempt, s.cause)
		}
		if id == "" {
			id = s.d.Attributes.MessageID
		} else if s.d.Attributes.MessageID != id {
			t.Fatalf("message id changed across retries: %s then %s", id, s.d.Attributes.MessageID)
		}
	}
	s := e.expect("fail")
	if s.failure.Attempts != 3 || s.failure.Endpoint != "ep" || !strings.Contains(s.failure.Reason, "incoming boom") || s.failure.Time.IsZero() {
		t.Fatalf("failure metadata: %+v", s.failure)
	}
	dl := e.broker.DeadLetters("ep")
	if len(dl) != 1 || dl[0].Envelope.Attributes.MessageID != id || dl[0].Failure.Reason != s.failure.Reason {
		t.Fatalf("dead letters: %+v", dl)
	}
}

func TestIncomingCatchingNextErrorMarksHandled(t *testing.T) {
	caught := make(chan error, 1)
	e := newEnv(t, nil,
		bus.WithMiddleware(bus.Middleware{Name: "catch", Incoming: func(ctx context.Context, in *bus.Incoming, next bus.Next) error {
			caught <- next(ctx)
			return nil
		}}),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error { return errors.New("handler boom") }, bus.HandlerName("charge")))
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}); err != nil {
		t.Fatal(err)
	}
	err := recv(t, caught)
	var rej *bus.HandlerDispatchRejectedError
	if !errors.As(err, &rej) || len(rej.Failures) != 1 || rej.Failures[0].Handler != "charge" || !errors.Is(err, bus.ErrHandlerDispatchRejected) {
		t.Fatalf("next returned %v, want a HandlerDispatchRejectedError naming charge", err)
	}
	e.expect("delete")
}

func TestIncomingIsReadOnly(t *testing.T) {
	got := make(chan bus.Attributes, 1)
	e := newEnv(t, nil,
		bus.WithMiddleware(bus.Middleware{Name: "tries-to-mutate", Incoming: func(ctx context.Context, in *bus.Incoming, next bus.Next) error {
			a := in.Attributes()
			a.MessageID = "changed"
			_ = a.With("k", "changed").WithSticky("s", "changed")
			return next(ctx)
		}}),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			got <- a
			return nil
		}))
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}, bus.WithAttribute("k", "orig"), bus.WithStickyAttribute("s", "orig")); err != nil {
		t.Fatal(err)
	}
	a := recv(t, got)
	k, _ := a.Value("k")
	s, _ := a.StickyValue("s")
	if a.MessageID == "changed" || k != "orig" || s != "orig" {
		t.Fatalf("handler saw attributes changed by incoming middleware: id %s k %s s %s", a.MessageID, k, s)
	}
	e.expect("delete")
}

func TestHandlerStageErrorFailsOnlyThatHandler(t *testing.T) {
	broker := newBrokerWithListener(t)
	e := newEnv(t, broker.broker,
		bus.WithMiddleware(bus.Middleware{Name: "reject-a", Handling: func(ctx context.Context, h *bus.Handling, next bus.Next) error {
			err := next(ctx) // handler a runs and sends, then its middleware fails it
			if h.HandlerName() == "a" {
				return errors.New("rejected a")
			}
			return err
		}}),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			return e0bus(ctx).Send(ctx, chargeCard{OrderID: "from-a"}, bus.To("listener"))
		}, bus.HandlerName("a")),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			return e0bus(ctx).Send(ctx, chargeCard{OrderID: "from-b"}, bus.To("listener"))
		}, bus.HandlerName("b")))
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}); err != nil {
		t.Fatal(err)
	}
	s := e.expect("return")
	var rej *bus.HandlerDispatchRejectedError
	if !errors.As(s.cause, &rej) || len(rej.Failures) != 1 || rej.Failures[0].Handler != "a" {
		t.Fatalf("cause %v, want only handler a rejected", s.cause)
	}
	if got := broker.take(t); got != "from-b" {
		t.Fatalf("listener got %s first, want from-b (a's send must be discarded)", got)
	}
	// the retry runs both handlers again: b sends again, a's send is dropped again
	e.expect("return")
	if got := broker.take(t); got != "from-b" {
		t.Fatalf("listener got %s, want from-b", got)
	}
	e.expect("fail")
	if got := broker.take(t); got != "from-b" {
		t.Fatalf("listener got %s, want from-b", got)
	}
	broker.expectEmpty(t)
}

func TestHandlerStageNotCallingNextSkipsHandler(t *testing.T) {
	ran := make(chan string, 2)
	e := newEnv(t, nil,
		bus.WithMiddleware(bus.Middleware{Name: "skip-a", Handling: func(ctx context.Context, h *bus.Handling, next bus.Next) error {
			if h.HandlerName() == "a" {
				return nil
			}
			return next(ctx)
		}}),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error { ran <- "a"; return nil }, bus.HandlerName("a")),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error { ran <- "b"; return nil }, bus.HandlerName("b")))
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}); err != nil {
		t.Fatal(err)
	}
	e.expect("delete")
	if got := recv(t, ran); got != "b" {
		t.Fatalf("ran %s, want only b", got)
	}
	if len(ran) != 0 {
		t.Fatal("skipped handler ran")
	}
	if logs := e.logs.String(); !strings.Contains(logs, `"middleware":"skip-a"`) || !strings.Contains(logs, "handler skipped") {
		t.Fatalf("no debug log naming the middleware that skipped the handler:\n%s", logs)
	}
}

func TestHandlingSeesHandlerAndMessage(t *testing.T) {
	type seen struct {
		handler, name, id string
		msg               bus.Message
		attempt           int
	}
	got := make(chan seen, 1)
	e := newEnv(t, nil,
		bus.WithMiddleware(bus.Middleware{Name: "look", Handling: func(ctx context.Context, h *bus.Handling, next bus.Next) error {
			got <- seen{h.HandlerName(), h.MessageName(), h.Attributes().MessageID, h.Message(), h.Attempt()}
			return next(ctx)
		}}),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error { return nil }, bus.HandlerName("charge")))
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "o-9", Total: 12}, bus.WithMessageID("m-9")); err != nil {
		t.Fatal(err)
	}
	s := recv(t, got)
	if s.handler != "charge" || s.name != "shop.order_placed" || s.id != "m-9" || s.attempt != 1 || s.msg != (orderPlaced{ID: "o-9", Total: 12}) {
		t.Fatalf("handling saw %+v", s)
	}
	e.expect("delete")
}

// A handler of a pointer type gets, and its middleware sees, a pointer.
func TestHandlingSeesAPointerMessageAsAPointer(t *testing.T) {
	seen, handled := make(chan bus.Message, 1), make(chan *orderPlaced, 1)
	e := newEnv(t, nil,
		bus.WithMiddleware(bus.Middleware{Name: "look", Handling: func(ctx context.Context, h *bus.Handling, next bus.Next) error {
			seen <- h.Message()
			return next(ctx)
		}}),
		bus.WithHandler(func(ctx context.Context, m *orderPlaced, a bus.Attributes) error { handled <- m; return nil }))
	if err := e.bus.Send(t.Context(), &orderPlaced{ID: "o-7", Total: 3}); err != nil {
		t.Fatal(err)
	}
	m, ok := recv(t, seen).(*orderPlaced)
	if !ok || *m != (orderPlaced{ID: "o-7", Total: 3}) {
		t.Fatalf("middleware saw %#v", m)
	}
	if h := recv(t, handled); h != m {
		t.Fatalf("handler got %p, middleware saw %p: want the same message", h, m)
	}
	e.expect("delete")
}

func TestOutgoingMutatesAttributesAndHeaders(t *testing.T) {
	type seen struct {
		attrs  bus.Attributes
		header string
	}
	got := make(chan seen, 1)
	var headerInIncoming string
	e := newEnv(t, nil,
		bus.WithMiddleware(bus.Middleware{
			Name: "stamp",
			Outgoing: func(ctx context.Context, out *bus.Outgoing, next bus.Next) error {
				out.SetValue("stamped", "yes")
				out.SetSticky("tenant", "acme")
				out.SetCorrelationID("corr-stamp")
				out.DeleteValue("drop-me")
				out.Headers()["x-tenant"] = "acme"
				return next(ctx)
			},
			Incoming: func(ctx context.Context, in *bus.Incoming, next bus.Next) error {
				headerInIncoming, _ = in.Header("x-tenant")
				return next(ctx)
			},
		}),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			got <- seen{attrs: a, header: headerInIncoming}
			return nil
		}))
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}, bus.WithAttribute("drop-me", "x")); err != nil {
		t.Fatal(err)
	}
	s := recv(t, got)
	v, _ := s.attrs.Value("stamped")
	st, _ := s.attrs.StickyValue("tenant")
	_, dropped := s.attrs.Value("drop-me")
	if v != "yes" || st != "acme" || s.attrs.CorrelationID != "corr-stamp" || dropped || s.header != "acme" {
		t.Fatalf("received attributes %+v (stamped %q tenant %q dropped %v) header %q", s.attrs, v, st, !dropped, s.header)
	}
	e.expect("delete")
}

func TestOutgoingDropAndReject(t *testing.T) {
	ran := make(chan string, 4)
	sendErr := make(chan error, 1)
	reject := errors.New("not allowed")
	e := newEnv(t, nil,
		bus.WithMiddleware(bus.Middleware{Name: "policy", Outgoing: func(ctx context.Context, out *bus.Outgoing, next bus.Next) error {
			switch out.Name() {
			case "shop.charge_card":
				return nil // drop
			case "shop.order_shipped":
				return reject
			}
			return next(ctx)
		}}),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			ran <- "placed"
			sendErr <- e0bus(ctx).Publish(ctx, orderShipped{OrderID: m.ID})
			return nil
		}),
		bus.WithHandler(func(ctx context.Context, m chargeCard, a bus.Attributes) error { ran <- "charge"; return nil }),
		bus.WithHandler(func(ctx context.Context, m orderShipped, a bus.Attributes) error { ran <- "shipped"; return nil }))
	ctx := t.Context()
	if err := e.bus.Send(ctx, chargeCard{OrderID: "1"}); err != nil {
		t.Fatalf("dropped send returned %v, want nil", err)
	}
	if logs := e.logs.String(); !strings.Contains(logs, "outgoing message dropped") || !strings.Contains(logs, `"middleware":"policy"`) {
		t.Fatalf("no debug log naming the middleware that dropped the message:\n%s", logs)
	}
	if err := e.bus.Publish(ctx, orderShipped{OrderID: "1"}); !errors.Is(err, reject) {
		t.Fatalf("rejected publish returned %v", err)
	}
	if err := e.bus.Send(ctx, orderPlaced{ID: "1"}); err != nil {
		t.Fatal(err)
	}
	if got := recv(t, ran); got != "placed" {
		t.Fatalf("ran %s", got)
	}
	if err := recv(t, sendErr); !errors.Is(err, reject) {
		t.Fatalf("publish inside handler returned %v", err)
	}
	e.expect("delete") // the handler ignored the error: nothing buffered, nothing else delivered
	if n := e.broker.Depth("ep"); n != 0 || len(ran) != 0 {
		t.Fatalf("dropped or rejected messages were delivered: depth %d ran %d", n, len(ran))
	}
}

func TestFlushDoesNotRerunOutgoing(t *testing.T) {
	var mu sync.Mutex
	var outgoing []string
	inHandler := make(chan bool, 4)
	done := make(chan struct{}, 1)
	e := newEnv(t, nil,
		bus.WithMiddleware(bus.Middleware{Name: "count", Outgoing: func(ctx context.Context, out *bus.Outgoing, next bus.Next) error {
			mu.Lock()
			outgoing = append(outgoing, out.Name())
			mu.Unlock()
			inHandler <- out.InHandler()
			return next(ctx)
		}}),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			if err := e0bus(ctx).Send(ctx, chargeCard{OrderID: m.ID}); err != nil {
				return err
			}
			mu.Lock()
			n := len(outgoing)
			mu.Unlock()
			if n != 2 {
				return errors.New("outgoing did not run at Send time")
			}
			return nil
		}),
		bus.WithHandler(func(ctx context.Context, m chargeCard, a bus.Attributes) error { done <- struct{}{}; return nil }))
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}); err != nil {
		t.Fatal(err)
	}
	recv(t, done)
	e.expect("delete")
	e.expect("delete")
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(outgoing, []string{"shop.order_placed", "shop.charge_card"}) {
		t.Fatalf("outgoing ran for %v, want once per send", outgoing)
	}
	if a, b := <-inHandler, <-inHandler; a || !b {
		t.Fatalf("InHandler: outside %v inside %v", a, b)
	}
}

func TestSendsBufferedUntilHandlerSucceeds(t *testing.T) {
	release := make(chan struct{})
	sent := make(chan struct{})
	delivered := make(chan string, 2)
	e := newEnv(t, nil, bus.WithConcurrency(2),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			if err := e0bus(ctx).Send(ctx, chargeCard{OrderID: m.ID}); err != nil {
				return err
			}
			close(sent)
			<-release
			return nil
		}),
		bus.WithHandler(func(ctx context.Context, m chargeCard, a bus.Attributes) error { delivered <- m.OrderID; return nil }))
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}); err != nil {
		t.Fatal(err)
	}
	recv(t, sent)
	select {
	case id := <-delivered:
		t.Fatalf("%s delivered before its handler returned", id)
	default:
	}
	if n := e.broker.Depth("ep"); n != 0 {
		t.Fatalf("%d messages reached the transport before the handler returned", n)
	}
	close(release)
	if got := recv(t, delivered); got != "1" {
		t.Fatalf("delivered %s", got)
	}
}

func TestNextCalledTwice(t *testing.T) {
	errs := make(chan error, 3)
	twice := func(ctx context.Context, next bus.Next) error {
		if err := next(ctx); err != nil {
			return err
		}
		errs <- next(ctx)
		return nil
	}
	var saved bus.Next
	e := newEnv(t, nil,
		bus.WithMiddleware(bus.Middleware{
			Name:     "twice",
			Incoming: func(ctx context.Context, in *bus.Incoming, next bus.Next) error { return twice(ctx, next) },
			Handling: func(ctx context.Context, h *bus.Handling, next bus.Next) error { return twice(ctx, next) },
			Outgoing: func(ctx context.Context, out *bus.Outgoing, next bus.Next) error {
				saved = next
				return twice(ctx, next)
			},
		}),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error { return nil }))
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}); err != nil {
		t.Fatal(err)
	}
	seen := map[bus.Stage]bool{}
	for range 3 {
		err := recv(t, errs)
		var nt *bus.NextMisuseError
		if !errors.Is(err, bus.ErrNextMisused) || !errors.As(err, &nt) || nt.Middleware != "twice" || nt.AfterReturn {
			t.Fatalf("second next returned %v", err)
		}
		if !strings.Contains(err.Error(), nt.Stage.String()) || !strings.Contains(err.Error(), `"twice"`) {
			t.Fatalf("error text %q does not name stage and middleware", err)
		}
		seen[nt.Stage] = true
	}
	if !seen[bus.StageIncoming] || !seen[bus.StageHandler] || !seen[bus.StageOutgoing] {
		t.Fatalf("stages reporting a second next: %v", seen)
	}
	e.expect("delete")
	// next kept past its middleware's return refuses to run
	err := saved(t.Context())
	var nt *bus.NextMisuseError
	if !errors.As(err, &nt) || !nt.AfterReturn || nt.Middleware != "twice" || nt.Stage != bus.StageOutgoing {
		t.Fatalf("next after return: %v", err)
	}
}

func TestStageLoggersAreScoped(t *testing.T) {
	e := newEnv(t, nil,
		bus.WithMiddleware(bus.Middleware{
			Name: "logs",
			Incoming: func(ctx context.Context, in *bus.Incoming, next bus.Next) error {
				in.Logger().Info("from incoming")
				return next(ctx)
			},
			Handling: func(ctx context.Context, h *bus.Handling, next bus.Next) error {
				h.Logger().Info("from handling")
				return next(ctx)
			},
			Outgoing: func(ctx context.Context, out *bus.Outgoing, next bus.Next) error {
				out.Logger().Info("from outgoing")
				return next(ctx)
			},
		}),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error { return nil }, bus.HandlerName("charge")))
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}, bus.WithMessageID("m-1"), bus.WithCorrelationID("c-1")); err != nil {
		t.Fatal(err)
	}
	e.expect("delete")
	logs := e.logs.String()
	for _, want := range []string{
		`"msg":"from incoming","bus":"ep","stage":"incoming","middleware":"logs","message_name":"shop.order_placed","message_id":"m-1","correlation_id":"c-1"`,
		`"msg":"from handling","bus":"ep","stage":"handler","middleware":"logs","message_name":"shop.order_placed","message_id":"m-1","correlation_id":"c-1","handler":"charge"`,
		`"msg":"from outgoing","bus":"ep","stage":"outgoing","middleware":"logs","message_name":"shop.order_placed","message_id":"m-1","correlation_id":"c-1"`,
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %s\n%s", want, logs)
		}
	}
}

func TestFilters(t *testing.T) {
	handled := make(chan string, 4)
	e := newEnv(t, nil,
		bus.WithMiddleware(
			bus.FilterIncoming("needs-tenant", func(ctx context.Context, in *bus.Incoming) bus.FilterResult {
				if _, ok := in.Attributes().StickyValue("tenant"); !ok {
					return bus.FilterStop
				}
				return bus.FilterContinue
			}),
			bus.FilterOutgoing("no-test-orders", func(ctx context.Context, out *bus.Outgoing) bus.FilterResult {
				if m, ok := out.Message().(orderPlaced); ok && m.ID == "test" {
					return bus.FilterStop
				}
				return bus.FilterContinue
			})),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error { handled <- m.ID; return nil }))
	ctx := t.Context()
	if err := e.bus.Send(ctx, orderPlaced{ID: "test"}, bus.WithStickyAttribute("tenant", "t")); err != nil {
		t.Fatal(err)
	}
	if err := e.bus.Send(ctx, orderPlaced{ID: "no-tenant"}); err != nil {
		t.Fatal(err)
	}
	if err := e.bus.Send(ctx, orderPlaced{ID: "ok"}, bus.WithStickyAttribute("tenant", "t")); err != nil {
		t.Fatal(err)
	}
	e.expect("delete")
	e.expect("delete")
	if got := recv(t, handled); got != "ok" {
		t.Fatalf("handled %s", got)
	}
	if len(handled) != 0 {
		t.Fatal("a filtered message was handled")
	}
}

func TestImmediatelyBypassesTheHandlerOutbox(t *testing.T) {
	l := newBrokerWithListener(t)
	inHandler := make(chan bool, 2)
	e := newEnv(t, l.broker,
		bus.WithMiddleware(bus.Middleware{Name: "see", Outgoing: func(ctx context.Context, out *bus.Outgoing, next bus.Next) error {
			inHandler <- out.InHandler()
			return next(ctx)
		}}),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			b := e0bus(ctx)
			if err := b.Send(ctx, chargeCard{OrderID: "now"}, bus.To("listener"), bus.Immediately()); err != nil {
				return err
			}
			if l.broker.Depth("listener") != 1 {
				return errors.New("the immediate send is not at the transport yet")
			}
			if err := b.Send(ctx, chargeCard{OrderID: "buffered"}, bus.To("listener")); err != nil {
				return err
			}
			return errors.New("handler fails: its buffered send is discarded, the immediate one is out")
		}), bus.WithMaxAttempts(1))
	if err := e.bus.Send(t.Context(), orderPlaced{}, bus.WithStickyAttribute("tenant", "acme")); err != nil {
		t.Fatal(err)
	}
	<-inHandler // the outer send
	s := e.expect("fail")
	if !strings.Contains(s.failure.Reason, "handler fails") {
		t.Fatalf("failed with %q", s.failure.Reason)
	}
	if a, b := <-inHandler, <-inHandler; a || !b {
		t.Fatalf("InHandler: immediate %v, buffered %v", a, b)
	}
	if got := l.take(t); got != "now" {
		t.Fatalf("listener got %s", got)
	}
	l.expectEmpty(t)
}

// failFirst is a memory transport whose Send refuses the message id "first".
type failFirst struct {
	bus.Transport
	mu   sync.Mutex
	sent []string
}

func (f *failFirst) Send(ctx context.Context, env *bus.Envelope, o bus.SendOptions) error {
	if env.Attributes.MessageID == "first" {
		return errors.New("refused")
	}
	f.mu.Lock()
	f.sent = append(f.sent, env.Attributes.MessageID)
	f.mu.Unlock()
	return f.Transport.Send(ctx, env, o)
}

// A next kept after it failed (a middleware that would retry in the
// background) refuses to run once a later message reuses the stage.
func TestNextKeptAfterAFailureDoesNotRunALaterMessage(t *testing.T) {
	tr := &failFirst{Transport: memory.New()}
	var kept bus.Next
	stale := make(chan error, 1)
	b, err := bus.New(bus.WithLogger(discard()), bus.WithTransport(tr),
		bus.WithMiddleware(bus.Middleware{Name: "keeps", Outgoing: func(ctx context.Context, out *bus.Outgoing, next bus.Next) error {
			if out.MessageID() == "first" {
				kept = next
				return next(ctx)
			}
			stale <- kept(ctx)
			return next(ctx)
		}}))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop(context.Background())
	if err := b.Send(t.Context(), orderPlaced{ID: "1"}, bus.To("x"), bus.WithMessageID("first")); err == nil {
		t.Fatal("the refused send returned nil")
	}
	if err := b.Send(t.Context(), orderPlaced{ID: "2"}, bus.To("x"), bus.WithMessageID("second")); err != nil {
		t.Fatalf("Send(second): %v", err)
	}
	var nt *bus.NextMisuseError
	if err := <-stale; !errors.As(err, &nt) || !nt.AfterReturn {
		t.Fatalf("the kept next returned %v; want a *NextMisuseError after return", err)
	}
	if len(tr.sent) != 1 || tr.sent[0] != "second" {
		t.Fatalf("sent %v; want [second] once", tr.sent)
	}
}
