package plugin_test

import (
	"context"
	"encoding/json"
	"runtime"
	"sync"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugin"
)

// Invocations made side by side (the batching session) of a before-only
// stage that holds a context each send a Release on a pool stream that
// nothing else uses: the host keeps no memory per message for them. gRPC
// kept every frame such a stream sent, for a replay, until the stream
// first received: a pooled buffer of several KiB per Release, gigabytes
// under a steady load (found by the soak).
func TestConcurrentHoldingInvocationsKeepNoMemory(t *testing.T) {
	cfg, err := json.Marshal(map[string]string{"scenario": "who"})
	if err != nil {
		t.Fatal(err)
	}
	p, err := plugin.Load(bins.before, plugin.WithSHA256(bins.beforeSum), plugin.WithConfig(cfg), plugin.WithLogger(testLogger(t)), plugin.WithSessionFrom(1))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	b, err := bus.New(bus.WithEndpoint("svc"), bus.WithMiddleware(p), bus.WithLogger(testLogger(t)),
		bus.WithHandler(func(context.Context, Ping, bus.Attributes) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer b.Stop(ctx)
	heap := func() float64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return float64(ms.HeapInuse) / (1 << 20)
	}
	deliver := func(n int) {
		var wg sync.WaitGroup
		for range 32 {
			wg.Go(func() {
				for range n / 32 {
					d := delivery(t, Ping{N: 1}, nil)
					d.Attributes = bus.NewAttributes("id", "corr", d.Attributes.SentAt, map[string]string{"who": "w"}, nil)
					if err := b.Deliver(ctx, d); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
	}
	deliver(2_000) // warm-up: the pools fill
	before := heap()
	const n = 16_000
	deliver(n)
	after := heap()
	// Kept at several KiB each, 16,000 Releases would be 30 MiB and more.
	if after-before > 12 {
		t.Fatalf("heap in use %.1f MiB → %.1f MiB after %d invocations that held a context", before, after, n)
	}
	t.Logf("heap in use %.1f MiB → %.1f MiB after %d invocations that held a context", before, after, n)
}
