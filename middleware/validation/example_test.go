package validation_test

import (
	"context"
	"fmt"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/middleware/validation"
)

// Send refuses a message whose Validate method finds it invalid.
func Example() {
	b, err := bus.New(bus.WithMiddleware(validation.New()), bus.WithRoute("shop", placeOrder{}))
	if err != nil {
		panic(err)
	}
	err = b.Send(context.Background(), placeOrder{Quantity: 0})
	fmt.Println(err)
	// Output: validation: message shop.place_order is invalid: quantity 0: order at least 1
}
