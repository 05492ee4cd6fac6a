package breaker_test

import (
	"context"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
	"github.com/plugbus/plugbus/middleware/breaker"
)

// BenchmarkHandling measures a closed breaker around a handler that
// succeeds, given to the bus (a breaker looked up by handler name) and to
// one handler.
func BenchmarkHandling(b *testing.B) {
	for _, c := range []struct {
		name    string
		handler string
	}{{"bus", ""}, {"handler", "charge"}} {
		b.Run(c.name, func(b *testing.B) {
			mw, err := breaker.New().Instantiate(bus.PluginInfo{Handler: c.handler})
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
		})
	}
}
