package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
	"github.com/plugbus/plugbus/middleware/ratelimit"
	"golang.org/x/time/rate"
)

// One call per customer per hour: a second call for the same customer is
// returned for later at once rather than hold a worker for an hour.
func Example() {
	perCustomer := ratelimit.New(rate.Every(time.Hour), 1,
		ratelimit.PerKey(func(m bus.Message, _ bus.Attributes) string { return m.(callPartner).Customer }),
		ratelimit.WithMaxWait(time.Second))
	mw, err := perCustomer.Instantiate(bus.PluginInfo{})
	if err != nil {
		panic(err)
	}
	for _, customer := range []string{"c-1", "c-2", "c-1"} {
		h := bustest.Handling("call", callPartner{Customer: customer}, bus.Attributes{})
		err := mw.Handling(context.Background(), h, bus.NewHandlingNext(func(context.Context) error { return nil }))
		var le *ratelimit.LimitedError
		if errors.As(err, &le) {
			fmt.Println(customer, "returned for later, key", le.Key)
			continue
		}
		fmt.Println(customer, "called")
	}
	// Output:
	// c-1 called
	// c-2 called
	// c-1 returned for later, key c-1
}
