// Package dltest makes dead letters for the tests of `plugbus dlq` and
// the web console: real ones, failed through a transport as the bus
// fails them.
package dltest

import (
	"context"
	"errors"
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
	// FailedOn is the endpoint the failure names, where a replay to its
	// own endpoint sends the dead letter; empty means the endpoint it is
	// made on. Naming one without a queue makes a dead letter whose
	// replay is refused.
	FailedOn string
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
		failedOn := endpoint
		if m.FailedOn != "" {
			failedOn = m.FailedOn
		}
		if err := tr.Fail(ctx, d, bus.Failure{Reason: m.Reason, Attempts: d.Attempt, Endpoint: failedOn, Time: m.At}); err != nil {
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
		withChannel(t, url, func(ch *amqp.Channel) {
			for _, q := range []string{endpoint, rabbitmq.DeadLetterQueue(endpoint)} {
				if _, err := ch.QueueDelete(q, false, false, false); err != nil {
					t.Errorf("dltest: deleting queue %s: %v", q, err)
				}
			}
			if err := ch.ExchangeDelete(exchange, false, false); err != nil {
				t.Errorf("dltest: deleting exchange %s: %v", exchange, err)
			}
		})
	})
	return tr
}

// DeleteQueue closes tr, then deletes the queue of its endpoint on the
// RabbitMQ broker at url, as an operator would behind the transports'
// backs; the endpoint's dead-letter queue remains. tr is closed first so
// that the deletion does not cancel its consumer, which would declare the
// queue again.
func DeleteQueue(ctx context.Context, t testing.TB, url string, tr *rabbitmq.Transport) {
	t.Helper()
	queue := tr.Endpoint()
	if err := tr.Close(ctx); err != nil {
		t.Fatalf("dltest: closing the transport of %s: %v", queue, err)
	}
	withChannel(t, url, func(ch *amqp.Channel) {
		if _, err := ch.QueueDelete(queue, false, false, false); err != nil {
			t.Errorf("dltest: deleting queue %s: %v", queue, err)
		}
	})
}

// withChannel runs fn on a channel of a connection of its own to url.
func withChannel(t testing.TB, url string, fn func(*amqp.Channel)) {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Errorf("dltest: %v", err)
		return
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		t.Errorf("dltest: %v", err)
		return
	}
	fn(ch)
}

// CheckOneQueueLeft checks m on two endpoints of which one queue was
// deleted behind the transport's back: noDLQ has its queue and no
// dead-letter queue, noQueue its dead-letter queue holding two dead
// letters and no queue. Neither is an unknown endpoint: each has its dead
// letters (or none) and a depth of 0; a replay of noQueue's to itself is
// refused, naming it, and leaves them; deleting them works.
func CheckOneQueueLeft(ctx context.Context, t testing.TB, m bus.DeadLetterManager, noDLQ, noQueue string) {
	t.Helper()
	for ep, want := range map[string]int{noDLQ: 0, noQueue: 2} {
		if n, err := m.CountDeadLetters(ctx, ep); err != nil || n != want {
			t.Errorf("CountDeadLetters(%s) = %d, %v; want %d", ep, n, err, want)
		}
		if dls, err := m.ListDeadLetters(ctx, bus.DeadLetterFilter{Endpoint: ep}); err != nil || len(dls) != want {
			t.Errorf("ListDeadLetters(%s) = %d dead letters, %v; want %d", ep, len(dls), err, want)
		}
		if n, err := m.QueueDepth(ctx, ep); err != nil || n != 0 {
			t.Errorf("QueueDepth(%s) = %d, %v; want 0", ep, n, err)
		}
	}
	// Its dead-letter queue cannot receive the copy.
	n, err := m.ReplayDeadLetters(ctx, bus.DeadLetterFilter{Endpoint: noQueue}, bus.Replay{}, nil)
	var ue *bus.UnknownEndpointError
	if n != 0 || !errors.As(err, &ue) || ue.Endpoint != noQueue {
		t.Errorf("replay of %s to itself = %d, %v; want 0 and a *bus.UnknownEndpointError naming it", noQueue, n, err)
	}
	if n, err := m.DeleteDeadLetters(ctx, bus.DeadLetterFilter{Endpoint: noDLQ}, nil); err != nil || n != 0 {
		t.Errorf("DeleteDeadLetters(%s) = %d, %v; want 0", noDLQ, n, err)
	}
	if n, err := m.DeleteDeadLetters(ctx, bus.DeadLetterFilter{Endpoint: noQueue}, nil); err != nil || n != 2 {
		t.Errorf("DeleteDeadLetters(%s) = %d, %v; want the 2 dead letters the replay left", noQueue, n, err)
	}
}
