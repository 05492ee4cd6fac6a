package bus_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
)

// A handler middleware's error fails that handler alone: its sends are
// discarded, its sibling's go out, and the message is retried.
func TestHandlerStageErrorFailsOnlyThatHandler(t *testing.T) {
	e := newEnv(t, nil,
		bus.WithMiddleware(bus.Middleware{Name: "reject-a", Handling: func(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
			err := next.Call(ctx) // handler a runs and sends, then its middleware fails it
			if h.HandlerName() == "a" {
				return errors.New("rejected a")
			}
			return err
		}}),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			return handlingBus(ctx).Send(ctx, chargeCard{OrderID: "from-a"}, bus.To("listener"))
		}, bus.HandlerName("a")),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			return handlingBus(ctx).Send(ctx, chargeCard{OrderID: "from-b"}, bus.To("listener"))
		}, bus.HandlerName("b")))
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}); err != nil {
		t.Fatal(err)
	}
	s := e.expect(bustest.Returned)
	var rej *bus.HandlerDispatchRejectedError
	if !errors.As(s.Cause, &rej) || len(rej.Failures) != 1 || rej.Failures[0].Handler != "a" {
		t.Fatalf("cause %v, want only handler a rejected", s.Cause)
	}
	// each retry runs both handlers again: b sends again, a's send is discarded again
	e.expect(bustest.Returned)
	e.expect(bustest.DeadLettered)
	if got := e.chargesSentTo("listener"); !slices.Equal(got, []string{"from-b", "from-b", "from-b"}) {
		t.Fatalf("sent %v, want from-b once per attempt and never from-a", got)
	}
}

// A handler middleware that does not call next skips that handler alone,
// which counts as succeeded; a debug log names the middleware.
func TestHandlerStageNotCallingNextSkipsHandler(t *testing.T) {
	ran := make(chan string, 2)
	e := newEnv(t, nil,
		bus.WithMiddleware(bus.Middleware{Name: "skip-a", Handling: func(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
			if h.HandlerName() == "a" {
				return nil
			}
			return next.Call(ctx)
		}}),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error { ran <- "a"; return nil }, bus.HandlerName("a")),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error { ran <- "b"; return nil }, bus.HandlerName("b")))
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}); err != nil {
		t.Fatal(err)
	}
	e.expect(bustest.Deleted)
	if got := await(t, ran); got != "b" {
		t.Fatalf("ran %s, want only b", got)
	}
	if len(ran) != 0 {
		t.Fatal("skipped handler ran")
	}
	if logs := e.logs.String(); !strings.Contains(logs, `"middleware":"skip-a"`) || !strings.Contains(logs, "handler skipped") {
		t.Fatalf("no debug log naming the middleware that skipped the handler:\n%s", logs)
	}
}

// The handler stage context reports the handler, the message, its
// attributes and the attempt.
func TestHandlingSeesHandlerAndMessage(t *testing.T) {
	type seen struct {
		handler, name, id string
		msg               bus.Message
		attempt           int
	}
	got := make(chan seen, 1)
	e := newEnv(t, nil,
		bus.WithMiddleware(bus.Middleware{Name: "look", Handling: func(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
			got <- seen{h.HandlerName(), h.MessageName(), h.Attributes().MessageID, h.Message(), h.Attempt()}
			return next.Call(ctx)
		}}),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error { return nil }, bus.HandlerName("charge")))
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "o-9", Total: 12}, bus.WithMessageID("m-9")); err != nil {
		t.Fatal(err)
	}
	s := await(t, got)
	if s.handler != "charge" || s.name != "shop.order_placed" || s.id != "m-9" || s.attempt != 1 || s.msg != (orderPlaced{ID: "o-9", Total: 12}) {
		t.Fatalf("handling saw %+v", s)
	}
	e.expect(bustest.Deleted)
}

// A handler of a pointer type gets, and its middleware sees, a pointer.
func TestHandlingSeesAPointerMessageAsAPointer(t *testing.T) {
	seen, handled := make(chan bus.Message, 1), make(chan *orderPlaced, 1)
	e := newEnv(t, nil,
		bus.WithMiddleware(bus.Middleware{Name: "look", Handling: func(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
			seen <- h.Message()
			return next.Call(ctx)
		}}),
		bus.WithHandler(func(ctx context.Context, m *orderPlaced, a bus.Attributes) error { handled <- m; return nil }))
	if err := e.bus.Send(t.Context(), &orderPlaced{ID: "o-7", Total: 3}); err != nil {
		t.Fatal(err)
	}
	m, ok := await(t, seen).(*orderPlaced)
	if !ok || *m != (orderPlaced{ID: "o-7", Total: 3}) {
		t.Fatalf("middleware saw %#v", m)
	}
	if h := await(t, handled); h != m {
		t.Fatalf("handler got %p, middleware saw %p: want the same message", h, m)
	}
	e.expect(bustest.Deleted)
}
