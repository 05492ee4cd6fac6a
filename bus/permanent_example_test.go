package bus_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/memory"
)

// watchAttempts is an incoming middleware printing the outcome of the
// one attempt it expects.
func watchAttempts(done chan<- struct{}) bus.Middleware {
	return bus.Middleware{Name: "watch", Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
		err := next.Call(ctx)
		fmt.Printf("attempt %d: %v (permanent %t)\n", in.Attempt(), err, bus.IsPermanent(err))
		close(done) // the example's message fails once, for good

		return err
	}}
}

// A handler's permanent failure sends the message to the dead-letter queue
// on its first attempt, without retries, with a reason that says so.
func ExamplePermanent() {
	done := make(chan struct{})
	broker := memory.NewBroker()
	b, err := bus.New(bus.WithEndpoint("orders"), bus.WithLogger(discard()),
		bus.WithTransport(memory.New(memory.WithBroker(broker))), bus.WithMiddleware(watchAttempts(done)),
		bus.WithHandler(func(ctx context.Context, m OrderPlaced, a bus.Attributes) error {
			return bus.Permanent(fmt.Errorf("order %s: unknown customer", m.OrderID))
		}, bus.HandlerName("check")))
	if err != nil {
		panic(err)
	}
	run(b, OrderPlaced{OrderID: "o-1"}, nil, done)
	for _, dl := range broker.DeadLetters("orders") {
		fmt.Printf("dead letter after %d attempt: %s\n", dl.Failure.Attempts, dl.Failure.Reason)
	}
	// Output:
	// attempt 1: bus: 1 handler(s) of shop.order_placed failed: check: order o-1: unknown customer (permanent true)
	// dead letter after 1 attempt: bus: 1 handler(s) of shop.order_placed failed: check: order o-1: unknown customer (permanent failure: dead-lettered at once, not retried)
}

// ValidationError is an error type the classifier below marks permanent.
type ValidationError struct{ Field string }

func (e *ValidationError) Error() string { return "invalid " + e.Field }

// A classifier marks every validation error permanent, wherever it is
// returned, without bus.Permanent in the code returning it: the bus
// dead-letters the message at once, and Deliver (for pushed messages)
// returns the error marked.
func ExampleWithPermanentErrors() {
	b, err := bus.New(bus.WithEndpoint("orders"), bus.WithLogger(discard()),
		bus.WithPermanentErrors(func(err error) bool {
			var invalid *ValidationError
			return errors.As(err, &invalid)
		}),
		bus.WithHandler(func(ctx context.Context, m OrderPlaced, a bus.Attributes) error {
			return fmt.Errorf("order %s: %w", m.OrderID, &ValidationError{Field: "total"})
		}, bus.HandlerName("check")))
	if err != nil {
		panic(err)
	}
	body, _ := bus.JSON{}.Marshal(OrderPlaced{OrderID: "o-1"})
	err = b.Deliver(context.Background(), &bus.Delivery{Envelope: bus.Envelope{Name: "shop.order_placed", Body: body}})
	fmt.Printf("%v (permanent %t)\n", err, errors.Is(err, bus.ErrPermanent))
	// Output:
	// bus: 1 handler(s) of shop.order_placed failed: check: order o-1: invalid total (permanent true)
}
