// Package dltest makes dead letters for the tests of `plugbus dlq` and
// the web console: real ones, failed through a transport as the bus
// fails them.
package dltest

import (
	"context"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/rabbitmq"
)

// Message is one dead letter to make.
type Message struct {
	Name, Body, Reason string
	Headers            bus.Headers
	// At is the failure time; zero means now.
	At time.Time
}

// Make sends each message to endpoint through tr (set up for endpoint),
// receives it and fails it with its reason. It returns the message ids.
func Make(ctx context.Context, t testing.TB, tr bus.Transport, endpoint string, msgs ...Message) []string {
	t.Helper()
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		id := fmt.Sprintf("%s-%d-%d", endpoint, time.Now().UnixNano(), i)
		env := &bus.Envelope{Name: m.Name, ContentType: "application/json", Body: []byte(m.Body), Headers: m.Headers,
			Attributes: bus.NewAttributes(id, "corr-"+id, time.Now().UTC().Truncate(time.Millisecond), nil, nil)}
		if err := tr.Send(ctx, env, endpoint); err != nil {
			t.Fatalf("dltest: send: %v", err)
		}
		d, err := tr.Receive(ctx)
		if err != nil {
			t.Fatalf("dltest: receive: %v", err)
		}
		if d.Attributes.MessageID != id {
			t.Fatalf("dltest: received %s, want %s: the endpoint's queue was not empty", d.Attributes.MessageID, id)
		}
		if err := tr.Fail(ctx, d, bus.Failure{Reason: m.Reason, Attempts: d.Attempt, Endpoint: endpoint, Time: m.At}); err != nil {
			t.Fatalf("dltest: fail: %v", err)
		}
		ids[i] = id
	}
	return ids
}

// RabbitMQ returns a RabbitMQ transport set up for endpoint on its own
// exchange, and removes the endpoint's queues and the exchange at cleanup.
func RabbitMQ(ctx context.Context, t testing.TB, url, exchange, endpoint string, handles ...string) *rabbitmq.Transport {
	t.Helper()
	tr, err := rabbitmq.New(url, rabbitmq.WithExchange(exchange))
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Setup(ctx, bus.Topology{Endpoint: endpoint, Handles: handles, MaxAttempts: 3, Concurrency: 1}); err != nil {
		t.Fatalf("dltest: setup: %v", err)
	}
	t.Cleanup(func() {
		_ = tr.Close(context.Background())
		conn, err := amqp.Dial(url)
		if err != nil {
			t.Errorf("dltest: cleanup: %v", err)
			return
		}
		defer func() { _ = conn.Close() }()
		ch, err := conn.Channel()
		if err != nil {
			t.Errorf("dltest: cleanup: %v", err)
			return
		}
		for _, q := range []string{endpoint, rabbitmq.DeadLetterQueue(endpoint)} {
			if _, err := ch.QueueDelete(q, false, false, false); err != nil {
				t.Errorf("dltest: deleting queue %s: %v", q, err)
			}
		}
		if err := ch.ExchangeDelete(exchange, false, false); err != nil {
			t.Errorf("dltest: deleting exchange %s: %v", exchange, err)
		}
	})
	return tr
}
