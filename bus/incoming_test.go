package bus_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
)

// Incoming middleware runs for a polled message, a pushed one (Deliver)
// and one no handler handles.
func TestIncomingRunsForPolledPushedAndUnhandled(t *testing.T) {
	seen := make(chan string, 10)
	mw := bus.Middleware{Name: "seen", Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
		seen <- in.Name()
		return next.Call(ctx)
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
	if got := await(t, seen); got != "shop.order_placed" {
		t.Fatalf("incoming saw %s", got)
	}
	if got := await(t, handled); got != "polled" {
		t.Fatalf("handled %s", got)
	}
	e.expect(bustest.Deleted)

	// pushed
	d := &bus.Delivery{Envelope: bus.Envelope{Name: "shop.order_placed", Body: []byte(`{"id":"pushed"}`),
		Attributes: bus.NewAttributes("m-push", "c-push", fixedTime(), nil, nil)}}
	if err := e.bus.Deliver(ctx, d); err != nil {
		t.Fatalf("Deliver: %v", err)
	}
	if got := await(t, seen); got != "shop.order_placed" {
		t.Fatalf("incoming saw %s", got)
	}
	if got := await(t, handled); got != "pushed" {
		t.Fatalf("handled %s", got)
	}

	// no handler: incoming still runs, then the message is dead-lettered
	if err := e.bus.Send(ctx, unhandled{}, bus.To("ep")); err != nil {
		t.Fatal(err)
	}
	if got := await(t, seen); got != "shop.unhandled" {
		t.Fatalf("incoming saw %s", got)
	}
	if s := e.expect(bustest.DeadLettered); s.Envelope.Name != "shop.unhandled" {
		t.Fatalf("dead-lettered %s", s.Envelope.Name)
	}
}

// An incoming middleware that does not call next handles the message:
// handlers are skipped, the message is deleted, a debug log names the
// middleware.
func TestIncomingNotCallingNextDeletes(t *testing.T) {
	ran := make(chan struct{}, 1)
	e := newEnv(t, nil,
		bus.WithMiddleware(bus.Middleware{Name: "gate", Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
			return nil
		}}),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			ran <- struct{}{}
			return nil
		}))
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}); err != nil {
		t.Fatal(err)
	}
	e.expect(bustest.Deleted)
	select {
	case <-ran:
		t.Fatal("handler ran although incoming middleware did not call next")
	default:
	}
	if logs := e.logs.String(); !strings.Contains(logs, `"middleware":"gate"`) || !strings.Contains(logs, "handlers skipped") {
		t.Fatalf("no debug log naming the middleware that handled the message:\n%s", logs)
	}
}

// An incoming middleware's error returns the message for retry, with the
// same id each time, and dead-letters it after the maximum attempts.
func TestIncomingErrorReturnsForRetryThenDeadLetters(t *testing.T) {
	boom := errors.New("incoming boom")
	e := newEnv(t, nil,
		bus.WithMiddleware(bus.Middleware{Name: "fails", Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
			return boom
		}}),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error { return nil }))
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}); err != nil {
		t.Fatal(err)
	}
	var id string
	for attempt := 1; attempt <= 2; attempt++ {
		s := e.expect(bustest.Returned)
		if s.Attempt != attempt || !errors.Is(s.Cause, boom) {
			t.Fatalf("return: attempt %d cause %v", s.Attempt, s.Cause)
		}
		if id == "" {
			id = s.Envelope.Attributes.MessageID
		} else if s.Envelope.Attributes.MessageID != id {
			t.Fatalf("message id changed across retries: %s then %s", id, s.Envelope.Attributes.MessageID)
		}
	}
	s := e.expect(bustest.DeadLettered)
	if s.Failure.Attempts != 3 || s.Failure.Endpoint != "ep" || !strings.Contains(s.Failure.Reason, "incoming boom") || s.Failure.Time.IsZero() {
		t.Fatalf("failure metadata: %+v", s.Failure)
	}
	dl := e.broker.DeadLetters("ep")
	if len(dl) != 1 || dl[0].Envelope.Attributes.MessageID != id || dl[0].Failure.Reason != s.Failure.Reason {
		t.Fatalf("dead letters: %+v", dl)
	}
}

// An incoming middleware that catches the handlers' failure from next and
// returns nil marks the message handled: it is deleted.
func TestIncomingCatchingNextErrorMarksHandled(t *testing.T) {
	caught := make(chan error, 1)
	e := newEnv(t, nil,
		bus.WithMiddleware(bus.Middleware{Name: "catch", Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
			caught <- next.Call(ctx)
			return nil
		}}),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error { return errors.New("handler boom") }, bus.HandlerName("charge")))
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}); err != nil {
		t.Fatal(err)
	}
	err := await(t, caught)
	var rej *bus.HandlerDispatchRejectedError
	if !errors.As(err, &rej) || len(rej.Failures) != 1 || rej.Failures[0].Handler != "charge" || !errors.Is(err, bus.ErrHandlerDispatchRejected) {
		t.Fatalf("next returned %v, want a HandlerDispatchRejectedError naming charge", err)
	}
	e.expect(bustest.Deleted)
}

// Incoming middleware cannot change the attributes the handlers see.
func TestIncomingIsReadOnly(t *testing.T) {
	got := make(chan bus.Attributes, 1)
	e := newEnv(t, nil,
		bus.WithMiddleware(bus.Middleware{Name: "tries-to-mutate", Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
			a := in.Attributes()
			a.MessageID = "changed"
			_ = a.With("k", "changed").WithSticky("s", "changed")
			return next.Call(ctx)
		}}),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			got <- a
			return nil
		}))
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}, bus.WithAttribute("k", "orig"), bus.WithStickyAttribute("s", "orig")); err != nil {
		t.Fatal(err)
	}
	a := await(t, got)
	k, _ := a.Value("k")
	s, _ := a.StickyValue("s")
	if a.MessageID == "changed" || k != "orig" || s != "orig" {
		t.Fatalf("handler saw attributes changed by incoming middleware: id %s k %s s %s", a.MessageID, k, s)
	}
	e.expect(bustest.Deleted)
}
