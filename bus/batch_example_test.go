package bus_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/plugbus/plugbus/bus"
)

// A batch: every message runs through the outgoing stage, the transport
// gets them at once, and the error names the messages that were not sent.
func ExampleBus_SendBatch() {
	b, err := bus.New(bus.WithLogger(discard()), bus.WithRoute("billing", ChargeCard{}))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	msgs := []bus.Message{ChargeCard{OrderID: "o-1"}, OrderPlaced{OrderID: "o-2"}, ChargeCard{OrderID: "o-3"}}
	err = b.SendBatch(ctx, msgs) // OrderPlaced has no route
	var be *bus.BatchError
	if errors.As(err, &be) {
		for _, f := range be.Failures {
			fmt.Printf("message %d not sent: %v\n", f.Index, errors.Is(f.Err, bus.ErrNoRoute))
		}
		fmt.Println("message 0 sent:", !be.Failed(0))
	}
	// Output:
	// message 1 not sent: true
	// message 0 sent: true
}
