package rabbitmq_test

import (
	"testing"

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
	}, transporttest.LatenessOptions{})
}
