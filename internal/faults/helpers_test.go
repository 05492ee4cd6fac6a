package faults_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/faults"
	"github.com/plugbus/plugbus/transports/rabbitmq"
)

// rabbitTransport returns a RabbitMQ transport straight to the broker.
func rabbitTransport(t testing.TB, brokerURL, exchange string, logs *faults.Logs) *rabbitmq.Transport {
	t.Helper()
	tr, err := rabbitmq.New(brokerURL, rabbitmq.WithExchange(exchange), rabbitmq.WithLogger(logs.Logger()))
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// closer is a transport that the test closes after its bus stopped.
type closer interface {
	bus.Transport
	Close(ctx context.Context) error
}

// startBus starts a bus on tr, logging to logs; the bus is stopped and
// tr closed when t ends.
func startBus(ctx context.Context, t testing.TB, tr closer, logs *faults.Logs, opts ...bus.Option) *bus.Bus {
	t.Helper()
	b, err := bus.New(append([]bus.Option{bus.WithTransport(tr), bus.WithLogger(logs.Logger())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := b.Stop(stopCtx); err != nil {
			t.Errorf("Stop: %v", err)
		}
		if err := tr.Close(stopCtx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return b
}

// rabbitDepth returns how many messages wait in queue, asked of the
// broker directly (not through the proxy).
func rabbitDepth(brokerURL, queue string) (int, error) {
	conn, err := amqp.Dial(brokerURL)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return 0, fmt.Errorf("queue %s: %w", queue, err)
	}
	return q.Messages, nil
}
