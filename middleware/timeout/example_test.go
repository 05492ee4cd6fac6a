package timeout_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/middleware/timeout"
)

// A handler given its own deadline with bus.HandlerMiddleware: the
// message is dead-lettered with the handler, the message and the
// deadline in the reason.
func Example() {
	ctx := context.Background()
	b, err := bus.New(bus.WithEndpoint("billing"), bus.WithMaxAttempts(1),
		bus.WithHandler(func(ctx context.Context, m chargeCard, _ bus.Attributes) error {
			<-ctx.Done() // a call that respects ctx, running late
			return ctx.Err()
		}, bus.HandlerName("charge"), bus.HandlerMiddleware(timeout.New(10*time.Millisecond))))
	if err != nil {
		panic(err)
	}
	err = b.Deliver(ctx, &bus.Delivery{Envelope: bus.Envelope{Name: "billing.charge_card", Body: []byte(`{"OrderID":"o-1"}`)}})
	var te *timeout.Error
	fmt.Println(errors.As(err, &te), te.Handler, te.After)
	// Output: true charge 10ms
}
