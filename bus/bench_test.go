package bus_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
)

// noop returns a pass-through middleware on all three stages.
func noop(i int) bus.Middleware {
	return bus.Middleware{
		Name:     fmt.Sprintf("noop-%d", i),
		Incoming: func(ctx context.Context, _ *bus.Incoming, next *bus.IncomingNext) error { return next.Call(ctx) },
		Handling: func(ctx context.Context, _ *bus.Handling, next *bus.HandlingNext) error { return next.Call(ctx) },
		Outgoing: func(ctx context.Context, _ *bus.Outgoing, next *bus.OutgoingNext) error { return next.Call(ctx) },
	}
}

func noops(n int) []bus.Plugin {
	ps := make([]bus.Plugin, n)
	for i := range ps {
		ps[i] = noop(i)
	}
	return ps
}

// BenchmarkSendHandle measures send → receive → decode → handle → ack over
// the memory transport, with 0 and 3 no-op middleware on every stage.
func BenchmarkSendHandle(b *testing.B) {
	for _, layers := range []int{0, 3} {
		b.Run(fmt.Sprintf("middleware=%d", layers), func(b *testing.B) {
			var handled atomic.Int64
			done := make(chan struct{})
			target := int64(b.N)
			bs, err := bus.New(bus.WithEndpoint("bench"), bus.WithLogger(discard()), bus.WithConcurrency(4),
				bus.WithMiddleware(noops(layers)...),
				bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
					if handled.Add(1) == target {
						close(done)
					}
					return nil
				}))
			if err != nil {
				b.Fatal(err)
			}
			if err := bs.Start(context.Background()); err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			msg := orderPlaced{ID: "o-1", Total: 42}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if err := bs.Send(ctx, msg); err != nil {
					b.Fatal(err)
				}
			}
			<-done
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
			if err := bs.Stop(ctx); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkIncomingChain measures the incoming stage alone with N no-op
// layers: the difference between N and N+1 is the cost of one layer. The
// message has no handler and the bus discards it (with its INFO log off),
// so that the terminal step costs next to nothing.
func BenchmarkIncomingChain(b *testing.B) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelWarn}))
	for _, layers := range []int{0, 1, 2, 4, 8, 16} {
		b.Run(fmt.Sprintf("layers=%d", layers), func(b *testing.B) {
			bs, err := bus.New(bus.WithEndpoint("bench"), bus.WithLogger(quiet), bus.WithUnhandled(bus.UnhandledDiscard), bus.WithMiddleware(noops(layers)...))
			if err != nil {
				b.Fatal(err)
			}
			defer bs.Stop(context.Background())
			d := bustest.Delivery(unhandled{}, bus.Attributes{})
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if err := bs.Deliver(ctx, d); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// nullTransport accepts every message and does nothing: it isolates the
// outgoing pipeline's cost.
type nullTransport struct{ bus.Transport }

func (nullTransport) Send(context.Context, *bus.Envelope, string) error { return nil }
func (nullTransport) Publish(context.Context, *bus.Envelope) error      { return nil }
func (nullTransport) Close(context.Context) error                       { return nil }

// BenchmarkOutgoingChain measures Publish with N no-op outgoing layers to a
// transport that does nothing.
func BenchmarkOutgoingChain(b *testing.B) {
	for _, layers := range []int{0, 1, 2, 4, 8, 16} {
		b.Run(fmt.Sprintf("layers=%d", layers), func(b *testing.B) {
			bs, err := bus.New(bus.WithLogger(discard()), bus.WithTransport(nullTransport{}), bus.WithMiddleware(noops(layers)...))
			if err != nil {
				b.Fatal(err)
			}
			defer bs.Stop(context.Background())
			ctx := context.Background()
			msg := unhandled{}
			b.ReportAllocs()
			for b.Loop() {
				if err := bs.Publish(ctx, msg); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkHandlerChain measures a handled message pushed through
// Deliver with N no-op handler-stage layers, given to the bus
// (WithMiddleware) or to the handler (HandlerMiddleware): the difference
// between N and N+1 is the cost of one layer at each level, and the
// allocations do not grow with N.
func BenchmarkHandlerChain(b *testing.B) {
	handling := func(n int) []bus.Plugin {
		ps := make([]bus.Plugin, n)
		for i := range ps {
			ps[i] = bus.Middleware{Name: fmt.Sprintf("noop-%d", i), Handling: func(ctx context.Context, _ *bus.Handling, next *bus.HandlingNext) error { return next.Call(ctx) }}
		}
		return ps
	}
	for _, level := range []string{"bus", "handler"} {
		for _, layers := range []int{0, 1, 4, 16} {
			b.Run(fmt.Sprintf("level=%s/layers=%d", level, layers), func(b *testing.B) {
				var hopts []bus.HandlerOption
				opts := []bus.Option{bus.WithEndpoint("bench"), bus.WithLogger(discard())}
				if level == "bus" {
					opts = append(opts, bus.WithMiddleware(handling(layers)...))
				} else {
					hopts = append(hopts, bus.HandlerMiddleware(handling(layers)...))
				}
				opts = append(opts, bus.WithHandler(func(context.Context, *orderPlaced, bus.Attributes) error { return nil }, hopts...))
				bs, err := bus.New(opts...)
				if err != nil {
					b.Fatal(err)
				}
				defer bs.Stop(context.Background())
				d := bustest.Delivery(orderPlaced{ID: "o-1"}, bus.Attributes{})
				ctx := context.Background()
				b.ReportAllocs()
				for b.Loop() {
					if err := bs.Deliver(ctx, d); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
