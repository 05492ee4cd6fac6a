package rabbitmq_test

import (
	"log/slog"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/testenv"
	"github.com/plugbus/plugbus/transports/rabbitmq"
	"github.com/plugbus/plugbus/transports/transporttest"
)

// BenchmarkBatchOfTen is what a handler's flush of 10 sends costs the
// transport (one op: SendBatch of 10 persistent messages, until the broker
// confirmed them), beside one Send (one confirm round trip): the ratio of
// the two is the flush's cost in round trips.
func BenchmarkBatchOfTen(b *testing.B) {
	url := testenv.RabbitMQ(b)
	adm := newAdmin(b, url)
	queue := transporttest.Name("bench-batch-ten")
	adm.declareQueue(b, queue)
	tr := open(b, url, adm, rabbitmq.WithLogger(slog.New(slog.DiscardHandler)))
	ctx := testContext(b, 10*time.Minute)
	msg := func(i int) bus.Outbound {
		env := &bus.Envelope{Name: "orders.placed", ContentType: "application/json", Body: []byte(`{"id":` + strconv.Itoa(i) + `,"customer":"c-1","amount":12.5}`),
			Attributes: bus.NewAttributes(transporttest.Name("id"), "c", time.Now().UTC(), nil, nil)}
		return bus.Outbound{Kind: bus.KindSend, Envelope: env, Destination: queue}
	}
	for _, n := range []int{1, 10} {
		b.Run("messages="+strconv.Itoa(n), func(b *testing.B) {
			batch := make([]bus.Outbound, n)
			for i := range batch {
				batch[i] = msg(i)
			}
			for b.Loop() {
				if err := tr.SendBatch(ctx, batch); err != nil {
					b.Fatal(err)
				}
			}
			adm.do(b, func(ch *amqp.Channel) error { _, err := ch.QueuePurge(queue, false); return err })
		})
	}
}
