package concurrency_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
	"github.com/plugbus/plugbus/middleware/concurrency"
)

// One export at a time: a second one arriving meanwhile is returned to be
// tried later, and its worker takes other messages.
func Example() {
	mw, err := concurrency.New(8, concurrency.WithLimit(1, exportReport{})).
		Instantiate(bus.PluginInfo{Handles: []string{"reports.export"}})
	if err != nil {
		panic(err)
	}
	in := func() *bus.Incoming { return bustest.Incoming(bustest.Delivery(exportReport{}, bus.Attributes{})) }
	_ = mw.Incoming(context.Background(), in(), bus.NewIncomingNext(func(ctx context.Context) error {
		// the first export runs; a second arrives meanwhile
		err := mw.Incoming(ctx, in(), bus.NewIncomingNext(func(context.Context) error { return nil }))
		var full *concurrency.FullError
		fmt.Println(errors.As(err, &full), full.Limit, errors.Is(err, bus.ErrRetryAfter))
		return nil
	}))
	// Output: true 1 true
}
