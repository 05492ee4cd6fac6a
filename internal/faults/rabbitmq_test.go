package faults_test

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/faults"
	"github.com/plugbus/plugbus/internal/testenv"
	"github.com/plugbus/plugbus/transports/rabbitmq"
	"github.com/plugbus/plugbus/transports/transporttest"
)

// work is the message every case streams.
type work struct {
	ID int `json:"id"`
}

func (work) MessageName() string { return "faults.Work" }

// heartbeat is the RabbitMQ heartbeat of the cases: amqp091 declares a
// connection dead after 1.5 heartbeats without a byte from the broker,
// so a silent connection is noticed within 1.5 s here (15 s with the
// default 10 s heartbeat).
const heartbeat = time.Second

// rabbitCases are the faults injected between the bus and RabbitMQ.
func rabbitCases() []faults.Case {
	return []faults.Case{
		{Name: "latency 2s±1s", Toxics: faults.Latency(2000, 1000), Hold: 3 * time.Second},
		{Name: "reset while publishing", Toxics: faults.Reset(), UntilLogs: []string{"connection to RabbitMQ lost"}, MaxDetection: 10 * time.Second,
			ReplacedLog: "connected to RabbitMQ"},
		{Name: "silent stall", Toxics: faults.Stall(), UntilLogs: []string{"connection to RabbitMQ lost"}, MaxDetection: 3*heartbeat/2 + 2*time.Second,
			ReplacedLog: "connected to RabbitMQ"},
		{Name: "trickle 2KB/s", Toxics: faults.Trickle(2), Hold: 3 * time.Second},
	}
}

// TestRabbitMQFaultsLoseNothing streams messages through a proxy to
// RabbitMQ and injects each fault in turn: every message sent is
// handled, none is dead-lettered.
func TestRabbitMQFaultsLoseNothing(t *testing.T) {
	skipUnderRace(t)
	brokerURL := testenv.RabbitMQ(t)
	for _, c := range rabbitCases() {
		t.Run(c.Name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			proxy := faults.Start(t, "rabbitmq", testenv.Getenv("PLUGBUS_AMQP_ADDR", "127.0.0.1:5672"))
			u, err := url.Parse(brokerURL)
			if err != nil {
				t.Fatal(err)
			}
			u.Host = proxy.Addr()
			logs := faults.NewLogs()
			exchange, endpoint := transporttest.Name("faults"), transporttest.Name("faults")
			tr, err := rabbitmq.New(u.String(), rabbitmq.WithExchange(exchange), rabbitmq.WithLogger(logs.Logger()),
				rabbitmq.WithConfig(amqp.Config{Heartbeat: heartbeat}),
				rabbitmq.WithBackoff(bus.Backoff{Initial: 50 * time.Millisecond, Max: 500 * time.Millisecond}))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				testenv.DeleteRabbitMQ(t, brokerURL, exchange, endpoint, rabbitmq.DeadLetterQueue(endpoint))
			})
			n := count()
			tally := faults.NewTally(n)
			b := startBus(ctx, t, tr, logs, bus.WithEndpoint(endpoint), bus.WithConcurrency(8),
				bus.WithHandler(func(_ context.Context, w work, _ bus.Attributes) error {
					tally.Handled(w.ID)
					return nil
				}))
			defer func() {
				// The loss is logged with its cause: a missed heartbeat or
				// a reset, not a cancelled consumer.
				for _, r := range logs.Matching("connection to RabbitMQ lost") {
					if strings.Contains(r.Attrs, "cancelled the consumer") {
						t.Errorf("%s: the lost connection is logged as %q", c.Name, r.Attrs)
					}
				}
			}()
			faults.Run(ctx, t, c, faults.Target{
				Proxy: proxy, Logs: logs, Tally: tally, PerSecond: float64(n) / 10, InFlight: 256,
				Send:    func(ctx context.Context, id int) error { return b.Send(ctx, work{ID: id}, bus.To(endpoint)) },
				LostLog: "connection to RabbitMQ lost",
				DeadLettered: func(context.Context) (int, error) {
					return rabbitDepth(brokerURL, rabbitmq.DeadLetterQueue(endpoint))
				},
			})
		})
	}
}
