package rabbitmq_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/testenv"
	"github.com/plugbus/plugbus/transports/rabbitmq"
	"github.com/plugbus/plugbus/transports/transporttest"
)

// The benchmarks measure send → consume → ack throughput: senders send
// messages one at a time, each waiting for its publisher confirmation; a
// consumer with the same prefetch and concurrency decodes each message
// from JSON and acknowledges it. Both sides use persistent messages, the
// mandatory flag, publisher confirms and the same number of confirm channels.
const (
	benchSenders     = 16
	benchConcurrency = 8
	benchPrefetch    = 2 * benchConcurrency
	benchPublishers  = 2
	benchRound       = 1000
)

type benchMsg struct {
	ID       int     `json:"id"`
	Customer string  `json:"customer"`
	Amount   float64 `json:"amount"`
}

func (benchMsg) MessageName() string { return "bench.order" }

// roundRunner sends n messages and returns once all of them were handled.
type roundRunner func(b *testing.B, n int)

// plugbusRunner is a full bus with a typed handler over the transport.
func plugbusRunner(b *testing.B, url string, adm *admin) roundRunner {
	endpoint := transporttest.Name("bench-plugbus")
	exchange := transporttest.Name("bench-exchange")
	b.Cleanup(func() { adm.deleteExchange(b, exchange) })
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	tr := open(b, url, adm, rabbitmq.WithExchange(exchange), rabbitmq.WithPrefetch(benchPrefetch), rabbitmq.WithPublisherChannels(benchPublishers), rabbitmq.WithLogger(quiet))
	var handled, target atomic.Int64
	done := make(chan struct{}, 1)
	bu, err := bus.New(bus.WithEndpoint(endpoint), bus.WithTransport(tr), bus.WithConcurrency(benchConcurrency), bus.WithLogger(quiet),
		bus.WithHandler(func(_ context.Context, m benchMsg, _ bus.Attributes) error {
			if handled.Add(1) == target.Load() {
				done <- struct{}{}
			}
			return nil
		}))
	if err != nil {
		b.Fatal(err)
	}
	if err := bu.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = bu.Stop(context.Background()) })
	return func(b *testing.B, n int) {
		target.Store(handled.Load() + int64(n))
		sendAll(b, n, func(ctx context.Context, i int) error {
			return bu.Send(ctx, benchMsg{ID: i, Customer: "customer-42", Amount: 12.5})
		})
		<-done
	}
}

// rawRunner is the amqp091-go client doing the same work by hand.
func rawRunner(b *testing.B, url string, adm *admin) roundRunner {
	queue := transporttest.Name("bench-raw")
	conn, err := amqp.Dial(url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = conn.Close()
		adm.deleteEndpoint(b, queue)
	})
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		b.Fatal(err)
	}
	pubs := make([]*amqp.Channel, benchPublishers)
	for i := range pubs {
		if pubs[i], err = conn.Channel(); err != nil {
			b.Fatal(err)
		}
		if err := pubs[i].Confirm(false); err != nil {
			b.Fatal(err)
		}
	}
	if err := ch.Qos(benchPrefetch, 0, false); err != nil {
		b.Fatal(err)
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	var handled, target atomic.Int64
	done := make(chan struct{}, 1)
	for range benchConcurrency {
		go func() {
			for d := range deliveries {
				var m benchMsg
				if err := json.Unmarshal(d.Body, &m); err != nil {
					b.Error(err)
				}
				if err := d.Ack(false); err != nil {
					b.Error(err)
				}
				if handled.Add(1) == target.Load() {
					done <- struct{}{}
				}
			}
		}()
	}
	var rr atomic.Uint32
	return func(b *testing.B, n int) {
		target.Store(handled.Load() + int64(n))
		sendAll(b, n, func(ctx context.Context, i int) error {
			body, err := json.Marshal(benchMsg{ID: i, Customer: "customer-42", Amount: 12.5})
			if err != nil {
				return err
			}
			p := pubs[int(rr.Add(1))%len(pubs)]
			dc, err := p.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, amqp.Publishing{
				ContentType: "application/json", DeliveryMode: amqp.Persistent, Type: "bench.order", Body: body,
			})
			if err != nil {
				return err
			}
			if !dc.Wait() {
				b.Error("nacked")
			}
			return nil
		})
		<-done
	}
}

func sendAll(b *testing.B, n int, send func(ctx context.Context, i int) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range benchSenders {
		wg.Go(func() {
			for {
				i := int(next.Add(1))
				if i > n {
					return
				}
				if err := send(context.Background(), i); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// BenchmarkSendConsumeAck measures each side alone; one op is one message.
func BenchmarkSendConsumeAck(b *testing.B) {
	url := testenv.RabbitMQ(b)
	adm := newAdmin(b, url)
	for _, c := range []struct {
		name string
		run  func(*testing.B, string, *admin) roundRunner
	}{{"raw", rawRunner}, {"plugbus", plugbusRunner}} {
		b.Run(c.name, func(b *testing.B) {
			run := c.run(b, url, adm)
			run(b, 200) // warm up: connections, channels, first messages
			b.ReportAllocs()
			b.ResetTimer()
			run(b, b.N)
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msg/s")
		})
	}
}

// BenchmarkCompare alternates rounds of the raw client and of plugbus in
// one run, so that both see the same machine load, and reports both
// throughputs and their ratio. One op is one round of each.
func BenchmarkCompare(b *testing.B) {
	url := testenv.RabbitMQ(b)
	adm := newAdmin(b, url)
	raw, pb := rawRunner(b, url, adm), plugbusRunner(b, url, adm)
	raw(b, 200)
	pb(b, 200)
	var rawTime, pbTime time.Duration
	b.ResetTimer()
	for i := range b.N {
		// Alternate which goes first so neither always follows the other.
		first, second := raw, pb
		firstT, secondT := &rawTime, &pbTime
		if i%2 == 1 {
			first, second, firstT, secondT = pb, raw, &pbTime, &rawTime
		}
		start := time.Now()
		first(b, benchRound)
		*firstT += time.Since(start)
		start = time.Now()
		second(b, benchRound)
		*secondT += time.Since(start)
	}
	rawRate := float64(b.N*benchRound) / rawTime.Seconds()
	pbRate := float64(b.N*benchRound) / pbTime.Seconds()
	b.ReportMetric(rawRate, "raw-msg/s")
	b.ReportMetric(pbRate, "plugbus-msg/s")
	b.ReportMetric(pbRate/rawRate*100, "plugbus-%-of-raw")
}
