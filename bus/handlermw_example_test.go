package bus_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/plugbus/plugbus/bus"
)

// Middleware for the bus and for one handler: the handler's own is the
// innermost layer of its handler stage, and the other handler does not
// see it.
func ExampleHandlerMiddleware() {
	layer := func(name string) bus.Middleware {
		return bus.Middleware{Name: name, Handling: func(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
			fmt.Printf("%s > %s\n", name, h.HandlerName())
			return next.Call(ctx)
		}}
	}
	b, err := bus.New(bus.WithEndpoint("billing"), bus.WithLogger(discard()),
		bus.WithMiddleware(layer("tracing")),
		bus.WithHandler(func(context.Context, ChargeCard, bus.Attributes) error { fmt.Println("charge"); return nil },
			bus.HandlerName("charge"), bus.HandlerMiddleware(layer("timeout"), layer("breaker"))),
		bus.WithHandler(func(context.Context, ChargeCard, bus.Attributes) error { fmt.Println("receipt"); return nil },
			bus.HandlerName("receipt")))
	if err != nil {
		panic(err)
	}
	_ = b.Deliver(context.Background(), &bus.Delivery{Envelope: bus.Envelope{Name: "billing.charge_card", Body: []byte(`{}`)}})
	// Output:
	// tracing > charge
	// timeout > charge
	// breaker > charge
	// charge
	// tracing > receipt
	// receipt
}

// A handler that cannot try the message now returns it for later: the
// bus hands it back with the delay instead of counting a failure.
func ExampleRetryAfter() {
	err := bus.RetryAfter(errors.New("warehouse API in maintenance"), 5*time.Minute)
	var ra *bus.RetryAfterError
	fmt.Println(errors.As(err, &ra), ra.Delay, errors.Is(err, bus.ErrRetryAfter), bus.IsPermanent(err))
	// Output: true 5m0s true false
}
