package timeout_test

import (
	"context"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
	"github.com/plugbus/plugbus/middleware/timeout"
)

// BenchmarkHandling measures the handler stage around a handler that
// returns at once: the cost of the deadline.
func BenchmarkHandling(b *testing.B) {
	mw, err := timeout.New(time.Minute).Instantiate(bus.PluginInfo{})
	if err != nil {
		b.Fatal(err)
	}
	h := bustest.Handling("charge", chargeCard{}, bus.Attributes{})
	next := bus.NewHandlingNext(func(context.Context) error { return nil })
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		next.Reset()
		if err := mw.Handling(ctx, h, next); err != nil {
			b.Fatal(err)
		}
	}
}
