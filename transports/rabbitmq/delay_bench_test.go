package rabbitmq_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/testenv"
	"github.com/plugbus/plugbus/transports/rabbitmq"
	"github.com/plugbus/plugbus/transports/transporttest"
)

// BenchmarkReturnAfter compares what a retry costs the consumer with
// Return (a copy into the endpoint queue) and with ReturnAfter (a copy
// into the delay queues, quorum queues, here for 10 ms): each op receives
// a delivery, gives it back and releases it, as the bus does. Copies come
// back for later ops; a delayed one carries the broker's x-death headers,
// which amqp091 decodes.
func BenchmarkReturnAfter(b *testing.B) {
	failed := errors.New("handler failed")
	for _, c := range []struct {
		name string
		give func(ctx context.Context, tr *rabbitmq.Transport, d *bus.Delivery) error
	}{
		{"Return", func(ctx context.Context, tr *rabbitmq.Transport, d *bus.Delivery) error {
			return tr.Return(ctx, d, failed)
		}},
		{"ReturnAfter", func(ctx context.Context, tr *rabbitmq.Transport, d *bus.Delivery) error {
			return tr.ReturnAfter(ctx, d, failed, 10*time.Millisecond)
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			url := testenv.RabbitMQ(b)
			adm := newAdmin(b, url)
			endpoint := transporttest.Name("bench-delay")
			quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
			const inFlight = 256
			tr := open(b, url, adm, rabbitmq.WithPrefetch(inFlight), rabbitmq.WithLogger(quiet))
			ctx := testContext(b, 10*time.Minute)
			if err := tr.Setup(ctx, bus.Topology{Endpoint: endpoint, Concurrency: 1, MaxAttempts: math.MaxInt32}); err != nil {
				b.Fatal(err)
			}
			for i := range inFlight {
				if err := tr.Send(ctx, message(delayTestName+"-bench", "m-"+strconv.Itoa(i)), endpoint); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				d, err := tr.Receive(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if err := c.give(ctx, tr, d); err != nil {
					b.Fatal(err)
				}
				tr.ReleaseDelivery(d)
			}
			b.StopTimer()
			// Every message is either received or on its way back: take
			// them all, so that no delayed copy outlives the endpoint queue.
			for range inFlight {
				d, err := tr.Receive(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if err := tr.Delete(ctx, d); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
