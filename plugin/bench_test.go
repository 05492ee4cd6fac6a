package plugin_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugin"
	"github.com/plugbus/plugbus/plugin/internal/scenarios"
)

// BenchmarkIncoming measures one incoming middleware ("pass": return
// next.Call(ctx)) in process and out of process, before-only and around.
// workers=16 reports throughput (msg/s) with 16 concurrent deliveries;
// workers=1 reports the latency one delivery takes unloaded. Both report
// p50 and p99 of a delivery through the bus (a no-op handler included):
// the latency the plugin adds is the difference with in-process.
//
//	go test -run '^$' -bench Incoming -benchmem -benchtime 3s ./plugin/
func BenchmarkIncoming(b *testing.B) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelWarn}))
	cfg, _ := json.Marshal(map[string]string{"scenario": "pass"})
	variants := []struct {
		name string
		mk   func(b *testing.B) bus.Plugin
	}{
		{"in-process", func(*testing.B) bus.Plugin { return scenarios.New("pass") }},
		{"before-only", func(b *testing.B) bus.Plugin {
			p, err := plugin.Load(bins.before, plugin.WithSHA256(bins.beforeSum), plugin.WithConfig(cfg), plugin.WithLogger(quiet))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { p.Close() })
			return p
		}},
		{"around", func(b *testing.B) bus.Plugin {
			p, err := plugin.Load(bins.around, plugin.WithSHA256(bins.aroundSum), plugin.WithConfig(cfg), plugin.WithLogger(quiet))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { p.Close() })
			return p
		}},
	}
	for _, v := range variants {
		for _, workers := range []int{16, 1} {
			b.Run(v.name+"/workers="+strconv.Itoa(workers), func(b *testing.B) {
				p := v.mk(b)
				bb, err := bus.New(bus.WithEndpoint("bench"), bus.WithMiddleware(p), bus.WithLogger(quiet),
					bus.WithHandler(func(context.Context, Ping, bus.Attributes) error { return nil }))
				if err != nil {
					b.Fatal(err)
				}
				ctx := context.Background()
				lat := make([][]time.Duration, workers)
				var n atomic.Int64
				var wg sync.WaitGroup
				b.ReportAllocs()
				b.ResetTimer()
				start := time.Now()
				for w := range workers {
					d := delivery(b, Ping{N: w}, bus.Headers{"x-tenant": "acme"})
					lat[w] = make([]time.Duration, 0, b.N/workers+1)
					wg.Go(func() {
						for n.Add(1) <= int64(b.N) {
							t0 := time.Now()
							if err := bb.Deliver(ctx, d); err != nil {
								b.Error(err)
								return
							}
							lat[w] = append(lat[w], time.Since(t0))
						}
					})
				}
				wg.Wait()
				elapsed := time.Since(start)
				b.StopTimer()
				all := slices.Concat(lat...)
				slices.Sort(all)
				if len(all) > 0 {
					b.ReportMetric(float64(len(all))/elapsed.Seconds(), "msg/s")
					b.ReportMetric(float64(all[len(all)/2].Nanoseconds())/1e3, "p50-µs")
					b.ReportMetric(float64(all[len(all)*99/100].Nanoseconds())/1e3, "p99-µs")
				}
				if err := bb.Stop(ctx); err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}
