package rabbitmq_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/dltest"
	"github.com/plugbus/plugbus/internal/testenv"
	"github.com/plugbus/plugbus/transports/rabbitmq"
	"github.com/plugbus/plugbus/transports/transporttest"
)

// An endpoint exists when either of its queues does: one whose
// dead-letter queue is gone (deleted by an operator; Fail declares it
// again) has no dead letters, and one whose queue is gone still has its
// dead letters. Neither is an unknown endpoint.
func TestDeadLettersOfAnEndpointWithOneOfItsQueues(t *testing.T) {
	url := testenv.RabbitMQ(t)
	adm := newAdmin(t, url)
	exchange := transporttest.Name("plugbus-unknown")
	t.Cleanup(func() { adm.deleteExchange(t, exchange) })
	ctx := testContext(t, 60*time.Second)
	noDLQ, noQueue := transporttest.Name("no-dlq"), transporttest.Name("no-queue")
	for _, ep := range []string{noDLQ, noQueue} {
		tr := open(t, url, adm, rabbitmq.WithExchange(exchange)) // deletes both queues at cleanup
		if err := tr.Setup(ctx, bus.Topology{Endpoint: ep, Handles: []string{"unknown.msg"}, MaxAttempts: 1, Concurrency: 1}); err != nil {
			t.Fatal(err)
		}
		if ep == noQueue {
			deadLetter(ctx, t, tr, ep, "unknown.msg", 2, "failed")
		}
		// Closed before its queue is deleted, so that the deletion does
		// not cancel its consumer (it would declare the queue again).
		if err := tr.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	adm.do(t, func(ch *amqp.Channel) error {
		_, err := ch.QueueDelete(rabbitmq.DeadLetterQueue(noDLQ), false, false, false)
		return err
	})
	adm.do(t, func(ch *amqp.Channel) error { _, err := ch.QueueDelete(noQueue, false, false, false); return err })
	m := open(t, url, adm, rabbitmq.WithExchange(exchange))

	dltest.CheckOneQueueLeft(ctx, t, m, noDLQ, noQueue)
}

// A replay to a queue named like an instance queue that does not exist
// (its instance stopped) is refused and leaves the dead letter: Send
// drops a message to such a queue with a warning, and the replay then
// removed the dead letter of a copy that went nowhere.
func TestReplayToAMissingInstanceQueueKeepsTheDeadLetter(t *testing.T) {
	url := testenv.RabbitMQ(t)
	adm := newAdmin(t, url)
	exchange, ep := transporttest.Name("plugbus-unknown"), transporttest.Name("replay-instance")
	t.Cleanup(func() { adm.deleteExchange(t, exchange) })
	ctx := testContext(t, 60*time.Second)
	tr := open(t, url, adm, rabbitmq.WithExchange(exchange))
	if err := tr.Setup(ctx, bus.Topology{Endpoint: ep, Handles: []string{"unknown.msg"}, MaxAttempts: 1, Concurrency: 1}); err != nil {
		t.Fatal(err)
	}
	deadLetter(ctx, t, tr, ep, "unknown.msg", 1, "failed")
	gone := rabbitmq.InstanceQueuePrefix + transporttest.Name("stopped")
	n, err := tr.ReplayDeadLetters(ctx, bus.DeadLetterFilter{Endpoint: ep}, bus.Replay{To: gone}, nil)
	var ue *bus.UnknownEndpointError
	if n != 0 || !errors.As(err, &ue) || ue.Endpoint != gone {
		t.Errorf("replay to %s = %d, %v; want 0 and a *bus.UnknownEndpointError naming it", gone, n, err)
	}
	if c, err := tr.CountDeadLetters(ctx, ep); err != nil || c != 1 {
		t.Errorf("after the replay %d dead letters (%v), want the 1 as it was", c, err)
	}
}

// An endpoint name too long to name its queues (AMQP names are at most
// 255 bytes) is an unknown endpoint, or one without dead letters when a
// queue of that name exists and only ".dlq" makes it too long. Asking the
// broker about such a name failed the call with an encoding error and
// closed the transport's connection, and a replay or a console page in
// progress on it.
func TestDeadLettersOfAnOverlongEndpoint(t *testing.T) {
	url := testenv.RabbitMQ(t)
	adm := newAdmin(t, url)
	ctx := testContext(t, 60*time.Second)
	base := transporttest.Name("overlong")
	withQueue := base + "-" + strings.Repeat("q", 253-len(base)-1) // 253 bytes: its ".dlq" is 257
	adm.declareQueue(t, withQueue)
	m := open(t, url, adm)
	for _, ep := range []string{strings.Repeat("x", 300), base + "-" + strings.Repeat("n", 253-len(base)-1)} {
		for _, op := range []struct {
			name string
			call func() (int, error)
		}{
			{"ListDeadLetters", func() (int, error) {
				dls, err := m.ListDeadLetters(ctx, bus.DeadLetterFilter{Endpoint: ep})
				return len(dls), err
			}},
			{"CountDeadLetters", func() (int, error) { return m.CountDeadLetters(ctx, ep) }},
			{"QueueDepth", func() (int, error) { return m.QueueDepth(ctx, ep) }},
			{"ReplayDeadLetters", func() (int, error) {
				return m.ReplayDeadLetters(ctx, bus.DeadLetterFilter{Endpoint: ep}, bus.Replay{}, nil)
			}},
			{"DeleteDeadLetters", func() (int, error) { return m.DeleteDeadLetters(ctx, bus.DeadLetterFilter{Endpoint: ep}, nil) }},
		} {
			var ue *bus.UnknownEndpointError
			if n, err := op.call(); n != 0 || !errors.As(err, &ue) || ue.Endpoint != ep {
				t.Errorf("%s of a %d-byte endpoint = %d, %v; want 0 and a *bus.UnknownEndpointError naming it", op.name, len(ep), n, err)
			}
		}
	}
	if n, err := m.CountDeadLetters(ctx, withQueue); err != nil || n != 0 {
		t.Errorf("CountDeadLetters of a %d-byte endpoint with its queue = %d, %v; want 0", len(withQueue), n, err)
	}
	if dls, err := m.ListDeadLetters(ctx, bus.DeadLetterFilter{Endpoint: withQueue}); err != nil || len(dls) != 0 {
		t.Errorf("ListDeadLetters of a %d-byte endpoint with its queue = %d dead letters, %v; want none", len(withQueue), len(dls), err)
	}
	if n, err := m.DeleteDeadLetters(ctx, bus.DeadLetterFilter{Endpoint: withQueue}, nil); err != nil || n != 0 {
		t.Errorf("DeleteDeadLetters of a %d-byte endpoint with its queue = %d, %v; want 0", len(withQueue), n, err)
	}
}
