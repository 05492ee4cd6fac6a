package saga_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugins/inbox"
	"github.com/plugbus/plugbus/plugins/outbox"
	"github.com/plugbus/plugbus/plugins/saga"
	"github.com/plugbus/plugbus/store/storetest"
	"github.com/plugbus/plugbus/transports/memory"
)

// BenchmarkSagaVersusPlain measures messages handled per second by a saga
// (load the instance, run the handler, save it with its version check,
// one send) against a plain handler doing the same send, both with the
// outbox and the inbox on the same store, 8 workers, on the memory
// transport. The messages go round 1,000 instances, so most are updates.
// Compare the msgs/s of saga and plain for each database.
func BenchmarkSagaVersusPlain(b *testing.B) {
	for _, kind := range storetest.Kinds() {
		for _, mode := range []string{"plain", "saga"} {
			b.Run(kind+"/"+mode, func(b *testing.B) {
				db := storetest.New(b, kind)
				st := db.Open(b)
				broker := memory.NewBroker()
				quiet := slog.New(slog.DiscardHandler)
				ctx := context.Background()
				var handled atomic.Int64
				done := make(chan struct{})
				target := int64(b.N)
				counter := bus.Middleware{Name: "count", Handling: func(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
					if err := next.Call(ctx); err != nil {
						return err
					}
					if handled.Add(1) == target {
						close(done)
					}
					return nil
				}}
				opts := []bus.Option{bus.WithEndpoint("work"), bus.WithTransport(memory.New(memory.WithBroker(broker))), bus.WithLogger(quiet),
					bus.WithConcurrency(8), bus.WithMiddleware(counter, outbox.New(st), inbox.New(st))}
				if mode == "saga" {
					s := saga.New[Triple]("bench", st)
					saga.StartedBy(s, saga.By(func(m StepA) string { return m.ID }), func(c *saga.Context[Triple], m StepA) error {
						if len(c.State.Steps) < 4 {
							c.State.Steps = append(c.State.Steps, "a")
						}
						return c.Send(Done(m), bus.To("sink"))
					})
					opts = append(opts, s.Option())
				} else {
					var self atomic.Pointer[bus.Bus]
					opts = append(opts, bus.WithHandler(func(ctx context.Context, m StepA, _ bus.Attributes) error {
						return self.Load().Send(ctx, Done(m), bus.To("sink"))
					}))
					bb, err := bus.New(opts...)
					if err != nil {
						b.Fatal(err)
					}
					self.Store(bb)
					runBench(b, bb, broker, done, ctx)
					return
				}
				bb, err := bus.New(opts...)
				if err != nil {
					b.Fatal(err)
				}
				runBench(b, bb, broker, done, ctx)
			})
		}
	}
}

func runBench(b *testing.B, bb *bus.Bus, broker *memory.Broker, done chan struct{}, ctx context.Context) {
	b.Helper()
	producer, err := bus.New(bus.WithTransport(memory.New(memory.WithBroker(broker))), bus.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		b.Fatal(err)
	}
	for i := range b.N {
		if err := producer.Send(ctx, StepA{ID: fmt.Sprintf("i-%d", i%1000)}, bus.To("work")); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	began := time.Now()
	if err := bb.Start(ctx); err != nil {
		b.Fatal(err)
	}
	<-done
	elapsed := time.Since(began)
	b.StopTimer()
	if err := bb.Stop(ctx); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
}
