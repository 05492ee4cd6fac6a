package rabbitmq_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/testenv"
	"github.com/plugbus/plugbus/transports/rabbitmq"
	"github.com/plugbus/plugbus/transports/transporttest"
)

// BenchmarkSchedulingLateness schedules 10,000 messages with random
// delays of 0-30 s through the delay queues and reports how late they
// arrive (none may be early). One iteration lasts over 30 s:
//
//	go test -run '^$' -bench SchedulingLateness -benchtime 1x ./transports/rabbitmq/
func BenchmarkSchedulingLateness(b *testing.B) {
	url := testenv.RabbitMQ(b)
	adm := newAdmin(b, url)
	exchange := transporttest.Name("plugbus-bench")
	b.Cleanup(func() { adm.deleteExchange(b, exchange) })
	transporttest.SchedulingLateness(b, func(tb testing.TB) bus.Transport {
		return open(tb, url, adm, rabbitmq.WithExchange(exchange))
	}, transporttest.LatenessOptions{Group: func(delay time.Duration) string {
		return fmt.Sprintf("%02d delay queues", rabbitmq.DelayHops(delay))
	}})
}

// BenchmarkSchedulingLatenessDLXPrefetch is BenchmarkSchedulingLateness
// on a node of its own, with RabbitMQ's default prefetch of the workers
// that move dead letters between quorum queues at least once (32) and a
// raised one: the delay queues' hops are such moves, and a burst of
// messages expiring together in one level waits for its worker.
//
//	go test -run '^$' -bench SchedulingLatenessDLXPrefetch -benchtime 1x ./transports/rabbitmq/
func BenchmarkSchedulingLatenessDLXPrefetch(b *testing.B) {
	for _, prefetch := range []int{32, 512} {
		b.Run(fmt.Sprintf("prefetch=%d", prefetch), func(b *testing.B) {
			url, node := testenv.StartRabbitMQNode(b)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := node.Ctl(ctx, "eval", fmt.Sprintf("application:set_env(rabbit, dead_letter_worker_consumer_prefetch, %d).", prefetch)); err != nil {
				b.Fatal(err)
			}
			adm := newAdmin(b, url)
			transporttest.SchedulingLateness(b, func(tb testing.TB) bus.Transport { return open(tb, url, adm) }, transporttest.LatenessOptions{})
		})
	}
}
