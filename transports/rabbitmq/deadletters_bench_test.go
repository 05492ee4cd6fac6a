package rabbitmq_test

import (
	"context"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/testenv"
	"github.com/plugbus/plugbus/transports/rabbitmq"
	"github.com/plugbus/plugbus/transports/transporttest"
)

// BenchmarkReplayDeadLetters replays b.N dead letters in one bulk
// operation: per dead letter, a basic.get, a confirmed publish (up to
// replayWindow waiting for their confirmation at once) and an ack.
// Run it with a fixed count: -bench ReplayDeadLetters -benchtime 10000x.
func BenchmarkReplayDeadLetters(b *testing.B) {
	url := testenv.RabbitMQ(b)
	adm := newAdmin(b, url)
	exchange, ep := transporttest.Name("plugbus-bench"), transporttest.Name("bench-dlq")
	b.Cleanup(func() { adm.deleteExchange(b, exchange) })
	tr := open(b, url, adm, rabbitmq.WithExchange(exchange))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := tr.Setup(ctx, bus.Topology{Endpoint: ep, Handles: []string{"bench.msg"}, MaxAttempts: 1, Concurrency: 64}); err != nil {
		b.Fatal(err)
	}
	deadLetter(ctx, b, tr, ep, "bench.msg", b.N, "bench")
	_ = tr.Close(ctx) // stop consuming: the replayed copies stay in the queue
	m := open(b, url, adm, rabbitmq.WithExchange(exchange))
	b.ReportAllocs()
	b.ResetTimer()
	n, err := m.ReplayDeadLetters(ctx, bus.DeadLetterFilter{Endpoint: ep}, bus.Replay{By: "bench"}, nil)
	b.StopTimer()
	if err != nil || n != b.N {
		b.Fatalf("replayed %d of %d: %v", n, b.N, err)
	}
}
