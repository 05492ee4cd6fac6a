package bus_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
	"github.com/plugbus/plugbus/transports/memory"
)

// A message whose handler keeps failing is returned for retry until the
// maximum attempts, then dead-lettered with its id, the reason, the
// attempts, the endpoint and the time.
func TestMaxAttemptsDeadLettersWithMetadata(t *testing.T) {
	calls := atomic.Int32{}
	e := newEnv(t, nil, bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
		calls.Add(1)
		return errors.New("card declined")
	}, bus.HandlerName("charge")))
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}, bus.WithMessageID("m-dl")); err != nil {
		t.Fatal(err)
	}
	e.expect(bustest.Returned)
	e.expect(bustest.Returned)
	s := e.expect(bustest.DeadLettered)
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
	if dl[0].Envelope.Attributes.MessageID != "m-dl" || s.Envelope.Attributes.MessageID != "m-dl" {
		t.Fatalf("dead letter lost the message id: %s", dl[0].Envelope.Attributes.MessageID)
	}
}

// A message that cannot be decoded, or has no name, is dead-lettered on
// its first delivery without running a handler.
func TestUndecodableMessageDeadLettersAtOnce(t *testing.T) {
	ran := make(chan struct{}, 1)
	e := newEnv(t, nil, bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
		ran <- struct{}{}
		return nil
	}))
	raw := memory.New(memory.WithBroker(e.broker))
	poison := &bus.Envelope{Name: "shop.order_placed", ContentType: "application/json", Body: []byte(`{"id": 42`),
		Attributes: bus.NewAttributes("m-poison", "c", fixedTime(), nil, nil)}
	if err := raw.Send(t.Context(), poison, "ep"); err != nil {
		t.Fatal(err)
	}
	noName := &bus.Envelope{Body: []byte(`{}`), Attributes: bus.NewAttributes("m-noname", "c", fixedTime(), nil, nil)}
	if err := raw.Send(t.Context(), noName, "ep"); err != nil {
		t.Fatal(err)
	}
	s := e.expect(bustest.DeadLettered)
	if s.Attempt != 1 || !strings.Contains(s.Failure.Reason, "cannot be decoded into bus_test.orderPlaced") {
		t.Fatalf("poison dead-lettered after %d attempts with %q", s.Attempt, s.Failure.Reason)
	}
	s = e.expect(bustest.DeadLettered)
	if !strings.Contains(s.Failure.Reason, "no name") {
		t.Fatalf("unnamed message reason %q", s.Failure.Reason)
	}
	if len(ran) != 0 {
		t.Fatal("handler ran for an undecodable message")
	}
	if dl := e.broker.DeadLetters("ep"); len(dl) != 2 || dl[0].Envelope.Attributes.MessageID != "m-poison" {
		t.Fatalf("dead letters %+v", dl)
	}
}

// A handler's own error is retried even when it wraps a DecodeError: only
// the bus's decode errors are poison.
func TestHandlerErrorWrappingADecodeErrorIsRetried(t *testing.T) {
	e := newEnv(t, nil, bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
		return fmt.Errorf("nested: %w", &bus.DecodeError{Message: "inner", Type: "x", Err: errors.New("bad")})
	}))
	if err := e.bus.Send(t.Context(), orderPlaced{}); err != nil {
		t.Fatal(err)
	}
	e.expect(bustest.Returned) // not dead-lettered at once: it is the handler's error
}

// A panic in outgoing middleware is returned by the Send as a PanicError;
// one in a handler returns the message for retry with a PanicError.
func TestPanicsAreRecoveredAsErrors(t *testing.T) {
	e := newEnv(t, nil,
		bus.WithMiddleware(bus.Middleware{Name: "panics", Outgoing: func(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
			if out.Name() == "shop.order_shipped" {
				panic("outgoing panic")
			}
			return next.Call(ctx)
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
	s := e.expect(bustest.Returned)
	if !errors.Is(s.Cause, bus.ErrPanic) || !strings.Contains(s.Cause.Error(), "handler panic") {
		t.Fatalf("handler panic surfaced as %v", s.Cause)
	}
}

// A panic in incoming middleware returns the message for retry.
func TestIncomingPanicIsRetried(t *testing.T) {
	e := newEnv(t, nil,
		bus.WithMiddleware(bus.Middleware{Name: "panics", Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
			panic("incoming panic")
		}}),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error { return nil }))
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}); err != nil {
		t.Fatal(err)
	}
	if s := e.expect(bustest.Returned); !errors.Is(s.Cause, bus.ErrPanic) {
		t.Fatalf("cause %v", s.Cause)
	}
}
