package ratelimit_test

import (
	"context"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
	"github.com/plugbus/plugbus/middleware/ratelimit"
	"golang.org/x/time/rate"
)

// BenchmarkHandling measures a run that finds its token at once, with one
// bucket and with a bucket per key.
func BenchmarkHandling(b *testing.B) {
	for _, c := range []struct {
		name string
		opts []ratelimit.Option
	}{
		{"endpoint", nil},
		{"key", []ratelimit.Option{ratelimit.PerKey(func(m bus.Message, _ bus.Attributes) string { return m.(callPartner).Customer })}},
	} {
		b.Run(c.name, func(b *testing.B) {
			mw, err := ratelimit.New(rate.Inf, 1, c.opts...).Instantiate(bus.PluginInfo{})
			if err != nil {
				b.Fatal(err)
			}
			h := bustest.Handling("call", callPartner{Customer: "c-1"}, bus.Attributes{})
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
