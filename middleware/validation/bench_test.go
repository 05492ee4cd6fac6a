package validation_test

import (
	"context"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
	"github.com/plugbus/plugbus/middleware/validation"
)

// BenchmarkHandling measures the check of a valid message.
func BenchmarkHandling(b *testing.B) {
	mw, err := validation.New().Instantiate(bus.PluginInfo{})
	if err != nil {
		b.Fatal(err)
	}
	h := bustest.Handling("place", placeOrder{Quantity: 1}, bus.Attributes{})
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
