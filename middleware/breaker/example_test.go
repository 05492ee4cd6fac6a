package breaker_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
	"github.com/plugbus/plugbus/middleware/breaker"
	"github.com/sony/gobreaker/v2"
)

// Two failures in a row open the breaker of the charge handler; the next
// message is held back and returned to be tried after the breaker's
// timeout, instead of failing.
func Example() {
	mw, err := breaker.New(breaker.WithSettings(gobreaker.Settings{
		Timeout:     time.Minute,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= 2 },
	})).Instantiate(bus.PluginInfo{Handler: "charge"})
	if err != nil {
		panic(err)
	}
	down := func(context.Context) error { return errors.New("provider down") }
	for i := range 3 {
		err := mw.Handling(context.Background(), bustest.Handling("charge", chargeCard{}, bus.Attributes{}), bus.NewHandlingNext(down))
		var ra *bus.RetryAfterError
		if errors.As(err, &ra) {
			fmt.Printf("message %d: held back, returned to be tried within %v\n", i+1, time.Minute)
			continue
		}
		fmt.Printf("message %d: %v\n", i+1, err)
	}
	// Output:
	// message 1: provider down
	// message 2: provider down
	// message 3: held back, returned to be tried within 1m0s
}
