package concurrency_test

import (
	"context"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
	"github.com/plugbus/plugbus/middleware/concurrency"
)

// BenchmarkIncoming measures taking and giving back a free slot.
func BenchmarkIncoming(b *testing.B) {
	mw, err := concurrency.New(4).Instantiate(bus.PluginInfo{Handles: []string{"reports.export"}})
	if err != nil {
		b.Fatal(err)
	}
	in := bustest.Incoming(bustest.Delivery(exportReport{}, bus.Attributes{}))
	next := bus.NewIncomingNext(func(context.Context) error { return nil })
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		next.Reset()
		if err := mw.Incoming(ctx, in, next); err != nil {
			b.Fatal(err)
		}
	}
}
