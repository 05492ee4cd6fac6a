package bus_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
	"github.com/plugbus/plugbus/transports/memory"
)

// validationError is a user's error type that a classifier marks permanent.
type validationError struct{ field string }

func (e *validationError) Error() string { return "invalid " + e.field }

// isValidation is a classifier for bus.WithPermanentErrors.
func isValidation(err error) bool {
	var v *validationError
	return errors.As(err, &v)
}

// expectPermanent waits for the next settlement and checks that it is a
// dead letter on the first attempt whose reason holds cause and says the
// failure was permanent, also in the dead-letter queue.
func (e *env) expectPermanent(cause string) bustest.Settlement {
	e.t.Helper()
	s := e.expect(bustest.DeadLettered)
	if s.Attempt != 1 || s.Failure.Attempts != 1 {
		e.t.Fatalf("dead-lettered at attempt %d (failure says %d), want 1: no retries", s.Attempt, s.Failure.Attempts)
	}
	if !strings.Contains(s.Failure.Reason, cause) || !strings.Contains(s.Failure.Reason, "permanent") {
		e.t.Fatalf("reason %q, want %q and that it was permanent", s.Failure.Reason, cause)
	}
	if dl := e.broker.DeadLetters("ep"); len(dl) != 1 || dl[0].Failure.Reason != s.Failure.Reason {
		e.t.Fatalf("dead letters %+v, want the message with its reason", dl)
	}
	return s
}

func (e *env) sendOrder() {
	e.t.Helper()
	if err := e.bus.Send(e.t.Context(), orderPlaced{ID: "o-1"}); err != nil {
		e.t.Fatal(err)
	}
}

func TestPermanentErrorFromHandlerDeadLettersAtOnce(t *testing.T) {
	e := newEnv(t, nil, bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error {
		return bus.Permanent(errors.New("order o-1 has a negative total"))
	}))
	e.sendOrder()
	e.expectPermanent("order o-1 has a negative total")
	e.stop() // the bus logs once the transport settled the message
	logs := e.records("message dead-lettered")
	if len(logs) != 1 || logs[0]["permanent"] != true {
		t.Fatalf("want one log record with permanent=true, got %v", logs)
	}
}

func TestPermanentErrorFromIncomingMiddlewareDeadLettersAtOnce(t *testing.T) {
	handled := make(chan struct{}, 1)
	e := newEnv(t, nil,
		bus.WithMiddleware(bus.Middleware{Name: "tenancy", Incoming: func(context.Context, *bus.Incoming, *bus.IncomingNext) error {
			return bus.Permanent(errors.New("no tenant"))
		}}),
		bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error { handled <- struct{}{}; return nil }))
	e.sendOrder()
	e.expectPermanent("no tenant")
	if len(handled) != 0 {
		t.Fatal("the handler ran although the incoming middleware failed")
	}
}

func TestPermanentErrorFromHandlerMiddlewareDeadLettersAtOnce(t *testing.T) {
	e := newEnv(t, nil,
		bus.WithMiddleware(bus.Middleware{Name: "validate", Handling: func(context.Context, *bus.Handling, *bus.HandlingNext) error {
			return bus.Permanent(&validationError{field: "total"})
		}}),
		bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error { return nil }))
	e.sendOrder()
	e.expectPermanent("invalid total")
}

// A permanent error wrapped by the handler and by middleware in both
// stages stays permanent.
func TestPermanentErrorWrappedByMiddlewareDeadLettersAtOnce(t *testing.T) {
	wrap := bus.Middleware{Name: "wrap",
		Incoming: func(ctx context.Context, _ *bus.Incoming, next *bus.IncomingNext) error {
			if err := next.Call(ctx); err != nil {
				return fmt.Errorf("incoming wrap: %w", err)
			}
			return nil
		},
		Handling: func(ctx context.Context, _ *bus.Handling, next *bus.HandlingNext) error {
			if err := next.Call(ctx); err != nil {
				return fmt.Errorf("handler wrap: %w", err)
			}
			return nil
		}}
	e := newEnv(t, nil, bus.WithMiddleware(wrap), bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error {
		return fmt.Errorf("charge: %w", bus.Permanent(errors.New("card number malformed")))
	}))
	e.sendOrder()
	s := e.expectPermanent("card number malformed")
	if !strings.HasPrefix(s.Failure.Reason, "incoming wrap: bus: 1 handler(s)") || !strings.Contains(s.Failure.Reason, "handler wrap: charge: card number malformed") {
		t.Fatalf("reason %q, want the whole wrapped error", s.Failure.Reason)
	}
}

// One handler failing for good dead-letters the message, even when a
// sibling failed transiently: retrying cannot make it succeed.
func TestPermanentErrorOfOneHandlerAmongTransientFailuresDeadLetters(t *testing.T) {
	e := newEnv(t, nil,
		bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error { return errors.New("database timeout") }, bus.HandlerName("store")),
		bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error {
			return bus.Permanent(errors.New("unknown customer"))
		}, bus.HandlerName("notify")))
	e.sendOrder()
	e.expectPermanent("unknown customer")
}

func TestClassifiedErrorDeadLettersAtOnceAndOthersAreRetried(t *testing.T) {
	e := newEnv(t, nil, bus.WithPermanentErrors(isValidation),
		bus.WithHandler(func(_ context.Context, m orderPlaced, _ bus.Attributes) error {
			if m.ID == "invalid" {
				return fmt.Errorf("checking: %w", &validationError{field: "id"})
			}
			return errors.New("database timeout")
		}))
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "invalid"}); err != nil {
		t.Fatal(err)
	}
	e.expectPermanent("checking: invalid id")

	if err := e.bus.Send(t.Context(), orderPlaced{ID: "ok"}); err != nil {
		t.Fatal(err)
	}
	e.expect(bustest.Returned)
	e.expect(bustest.Returned)
	s := e.expect(bustest.DeadLettered)
	if s.Attempt != 3 || strings.Contains(s.Failure.Reason, "permanent") {
		t.Fatalf("dead-lettered at attempt %d with %q, want attempt 3 and no permanent mark", s.Attempt, s.Failure.Reason)
	}
}

// With several classifiers, an error is permanent when any says so.
func TestPermanentErrorsClassifiersAddUp(t *testing.T) {
	errGone := errors.New("customer deleted")
	e := newEnv(t, nil,
		bus.WithPermanentErrors(isValidation),
		bus.WithPermanentErrors(func(err error) bool { return errors.Is(err, errGone) }),
		bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error { return errGone }))
	e.sendOrder()
	e.expectPermanent("customer deleted")
}

func TestWithPermanentErrorsRefusesNil(t *testing.T) {
	if _, err := bus.New(bus.WithPermanentErrors(nil)); err == nil || !strings.Contains(err.Error(), "WithPermanentErrors") {
		t.Fatalf("bus.New = %v, want an error naming WithPermanentErrors", err)
	}
}

// A handler's own *bus.DecodeError (decoding something of its own) is
// that handler's failure: retried, unless marked.
func TestHandlerDecodeErrorIsRetriedUnlessMarked(t *testing.T) {
	decodeErr := &bus.DecodeError{Message: "inner", Type: "x", Err: errors.New("bad")}
	e := newEnv(t, nil, bus.WithHandler(func(_ context.Context, m orderPlaced, _ bus.Attributes) error {
		if m.ID == "marked" {
			return bus.Permanent(decodeErr)
		}
		return decodeErr
	}))
	e.sendOrder()
	e.expect(bustest.Returned)
	e.expect(bustest.Returned)
	e.expect(bustest.DeadLettered)
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "marked"}); err != nil {
		t.Fatal(err)
	}
	if s := e.expect(bustest.DeadLettered); s.Attempt != 1 {
		t.Fatalf("marked decode error dead-lettered at attempt %d, want 1", s.Attempt)
	}
}

// A classifier is not asked about an attempt Stop interrupted: the
// message is returned, not dead-lettered.
func TestClassifierNotAskedAboutAnAttemptStopInterrupted(t *testing.T) {
	broker := memory.NewBroker()
	started := make(chan struct{})
	b := startBus(t, bus.WithEndpoint("ep"), bus.WithTransport(memory.New(memory.WithBroker(broker))),
		bus.WithPermanentErrors(func(error) bool { return true }),
		bus.WithHandler(func(ctx context.Context, _ orderPlaced, _ bus.Attributes) error {
			close(started)
			<-ctx.Done()
			return ctx.Err()
		}))
	if err := b.Send(t.Context(), orderPlaced{}); err != nil {
		t.Fatal(err)
	}
	<-started
	stopAtDeadline(t, b)
	if dl := broker.DeadLetters("ep"); len(dl) != 0 {
		t.Fatalf("Stop dead-lettered %+v", dl[0].Failure)
	}
	if n := broker.Depth("ep"); n != 1 {
		t.Fatalf("queue depth %d after Stop; want the interrupted message back (1)", n)
	}
}

// Deliver returns an error a classifier marks as marked with
// bus.Permanent, so that a caller settling the message itself (the SQS
// Lambda receiver) sees it with bus.IsPermanent.
func TestDeliverMarksClassifiedErrorsPermanent(t *testing.T) {
	invalid := &validationError{field: "total"}
	b, err := bus.New(bus.WithEndpoint("ep"), bus.WithLogger(discard()), bus.WithPermanentErrors(isValidation),
		bus.WithHandler(func(_ context.Context, m orderPlaced, _ bus.Attributes) error {
			if m.ID == "invalid" {
				return invalid
			}
			return errors.New("database timeout")
		}))
	if err != nil {
		t.Fatal(err)
	}
	deliver := func(id string) error {
		body, _ := bus.JSON{}.Marshal(orderPlaced{ID: id})
		return b.Deliver(t.Context(), &bus.Delivery{Envelope: bus.Envelope{Name: "shop.order_placed", Body: body}})
	}
	err = deliver("invalid")
	var v *validationError
	if !bus.IsPermanent(err) || !errors.Is(err, bus.ErrPermanent) || !errors.As(err, &v) || v != invalid {
		t.Fatalf("Deliver = %v, want the validation error marked permanent", err)
	}
	if !errors.Is(errors.Unwrap(err), bus.ErrHandlerDispatchRejected) {
		t.Fatalf("errors.Unwrap(%v) = %v, want the handler dispatch error", err, errors.Unwrap(err))
	}
	if err := deliver("ok"); err == nil || bus.IsPermanent(err) {
		t.Fatalf("Deliver = %v, want a transient error", err)
	}
}

func TestPermanentMarksItsCause(t *testing.T) {
	cause := errors.New("bad input")
	err := bus.Permanent(cause)
	if !errors.Is(err, bus.ErrPermanent) || errors.Unwrap(err) != cause || err.Error() != cause.Error() || !bus.IsPermanent(err) {
		t.Fatalf("Permanent(%v) = %v: want errors.Is ErrPermanent, Unwrap the cause and the cause's text", cause, err)
	}
	if bus.Permanent(nil) != nil {
		t.Fatal("Permanent(nil) is not nil")
	}
	if bus.IsPermanent(cause) || bus.IsPermanent(nil) {
		t.Fatal("an unmarked error is permanent")
	}
	if !bus.IsPermanent(bus.ErrPermanent) || !bus.IsPermanent(fmt.Errorf("x: %w", bus.ErrPermanent)) {
		t.Fatal("ErrPermanent itself is not permanent")
	}
	joined := errors.Join(errors.New("transient"), fmt.Errorf("wrapped: %w", err))
	if !bus.IsPermanent(joined) {
		t.Fatalf("IsPermanent(%v) = false, want true: one of the joined errors is marked", joined)
	}
	rejected := &bus.HandlerDispatchRejectedError{Message: "m", Failures: []bus.HandlerFailure{{Handler: "h", Err: &bus.DecodeError{Message: "m", Err: cause}}}}
	if bus.IsPermanent(rejected) || bus.IsPermanent(fmt.Errorf("wrap: %w", rejected)) {
		t.Fatal("a handler's own DecodeError is permanent")
	}
	if !bus.IsPermanent(fmt.Errorf("wrap: %w", &bus.DecodeError{Message: "m", Err: cause})) {
		t.Fatal("the bus's DecodeError wrapped by middleware is not permanent")
	}
}

// myPermanent is an error type of a user that declares itself permanent.
type myPermanent struct{}

func (myPermanent) Error() string        { return "gone for good" }
func (myPermanent) Is(target error) bool { return target == bus.ErrPermanent }

func TestErrorTypeMatchingErrPermanentDeadLettersAtOnce(t *testing.T) {
	e := newEnv(t, nil, bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error { return myPermanent{} }))
	e.sendOrder()
	e.expectPermanent("gone for good")
}
