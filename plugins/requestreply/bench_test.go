package requestreply_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugins/requestreply"
)

// BenchmarkRequest measures one request/reply round trip on the memory
// transport, with requests in flight from parallel goroutines.
func BenchmarkRequest(b *testing.B) {
	newT := memoryTransports()
	quiet := slog.New(slog.DiscardHandler)
	responder, err := bus.New(bus.WithEndpoint("calc"), bus.WithTransport(newT(b)), bus.WithLogger(quiet),
		bus.WithHandler(func(ctx context.Context, m add, _ bus.Attributes) error {
			return requestreply.Reply(ctx, sum{Seq: m.Seq, Value: m.A + m.B})
		}))
	if err != nil {
		b.Fatal(err)
	}
	requester, err := bus.New(bus.WithTransport(newT(b)), bus.WithLogger(quiet), bus.WithMiddleware(requestreply.New()),
		bus.WithRoute("calc", add{}))
	if err != nil {
		b.Fatal(err)
	}
	for _, bb := range []*bus.Bus{responder, requester} {
		if err := bb.Start(context.Background()); err != nil {
			b.Fatal(err)
		}
		defer bb.Stop(context.Background())
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			got, err := requestreply.Request[sum](ctx, requester, add{A: 1, B: 2})
			if err != nil || got.Value != 3 {
				b.Errorf("Request = %+v, %v", got, err)
				return
			}
		}
	})
}
