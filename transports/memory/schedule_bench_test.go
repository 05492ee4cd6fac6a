package memory_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/memory"
	"github.com/plugbus/plugbus/transports/transporttest"
)

// BenchmarkSchedulingLateness schedules 10,000 messages with random
// delays of 0-30 s and reports how late they arrive (none may be early).
// One iteration lasts over 30 s:
//
//	go test -run '^$' -bench SchedulingLateness -benchtime 1x ./transports/memory/
func BenchmarkSchedulingLateness(b *testing.B) {
	broker := memory.NewBroker()
	transporttest.SchedulingLateness(b, func(testing.TB) bus.Transport { return memory.New(memory.WithBroker(broker)) }, transporttest.LatenessOptions{})
}

type reminder struct{ N int }

func (reminder) MessageName() string { return "bench.reminder" }

// BenchmarkScheduled100k schedules 100,000 messages an hour ahead on one
// bus and reports the heap each takes beyond its envelope, and the
// goroutines the bus runs while they wait (one timer, no goroutine of its
// own until it fires):
//
//	go test -run '^$' -bench Scheduled100k -benchtime 1x ./transports/memory/
func BenchmarkScheduled100k(b *testing.B) {
	const n = 100_000
	for range b.N {
		broker := memory.NewBroker()
		bs, err := bus.New(bus.WithTransport(memory.New(memory.WithBroker(broker))), bus.WithRoute("later", reminder{}))
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		if err := bs.Start(ctx); err != nil {
			b.Fatal(err)
		}
		// The envelopes alone, as the broker keeps them: the baseline.
		before := heap()
		envs := make([]bus.Envelope, n)
		for i := range envs {
			envs[i] = bus.Envelope{Name: "bench.reminder", ContentType: "application/json", Body: []byte(`{"N":12345}`),
				Attributes: bus.NewAttributes("0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", time.Now(), nil, nil),
				Due:        time.Now().Add(time.Hour)}
		}
		envelopes := heap() - before
		runtime.KeepAlive(envs)
		envs = nil
		goroutines := runtime.NumGoroutine()
		before = heap()
		b.ResetTimer()
		for i := range n {
			if err := bs.Send(ctx, reminder{N: i}, bus.Delay(time.Hour)); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		scheduled := heap() - before
		if got := broker.Delayed(); got != n {
			b.Fatalf("%d messages delayed, want %d", got, n)
		}
		extra := runtime.NumGoroutine() - goroutines
		perMsg, perEnv := float64(scheduled)/n, float64(envelopes)/n
		b.ReportMetric(perMsg, "heap-B/scheduled")
		b.ReportMetric(perMsg-perEnv, "B-beyond-envelope/scheduled")
		b.ReportMetric(float64(extra), "extra-goroutines")
		b.Logf("%d scheduled: %.0f B of heap each, of which its envelope %.0f B and the scheduling %.0f B; %d goroutines before, %d more while they wait",
			n, perMsg, perEnv, perMsg-perEnv, goroutines, extra)
		if err := bs.Stop(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// heap returns the bytes of live heap after a collection.
func heap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
