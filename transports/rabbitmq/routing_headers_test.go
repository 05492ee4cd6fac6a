package rabbitmq_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/rabbitmq"
	"github.com/plugbus/plugbus/transports/transporttest"
)

// attemptLog records the attempts of each message id that the incoming
// stage saw.
type attemptLog struct {
	mu       sync.Mutex
	attempts map[string][]int
}

func (l *attemptLog) middleware() bus.Middleware {
	return bus.Middleware{
		Name: "attempts",
		Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
			l.mu.Lock()
			if l.attempts == nil {
				l.attempts = map[string][]int{}
			}
			id := in.Attributes().MessageID
			l.attempts[id] = append(l.attempts[id], in.Attempt())
			l.mu.Unlock()
			return next.Call(ctx)
		},
	}
}

func (l *attemptLog) of(id string) []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Sorted(slices.Values(l.attempts[id]))
}

// A message published straight onto an endpoint's queue with the CC
// header (RabbitMQ's sender-selected distribution) is retried and
// dead-lettered like any other: the copies Return and Fail make carry the
// CC under another name, so that the broker routes them nowhere else —
// neither back into the endpoint's queue (a loop) nor into the queues it
// names once more.
func TestCCHeaderNeverRoutesCopies(t *testing.T) {
	e := newEnv(t)
	other := transporttest.Name("rmq-cc-other")
	e.adm.declareQueue(t, other)
	const maxAttempts = 3
	var attempts attemptLog
	b := e.start(t, bus.WithMaxAttempts(maxAttempts), bus.WithMiddleware(attempts.middleware()),
		bus.WithHandler(func(context.Context, order, bus.Attributes) error { return errors.New("always fails") }))

	ccs := map[string][]any{"cc-own-queue": {e.endpoint}, "cc-other-queue": {other}}
	for id, cc := range ccs {
		e.adm.publish(t, e.endpoint, amqp.Publishing{Type: "test.order", MessageId: id, ContentType: "application/json", Body: []byte(`{"id":1}`),
			Headers: amqp.Table{"CC": cc}})
	}
	ctx := testContext(t, 30*time.Second)
	if got := e.adm.deadLetters(ctx, t, e.endpoint, len(ccs)); len(got) != len(ccs) {
		t.Fatalf("%d dead letters, want %d", len(got), len(ccs))
	}
	// Stopped, the bus settles what it holds: whatever a copy put back
	// into a queue is counted below.
	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	for id := range ccs {
		if got := attempts.of(id); !slices.Equal(got, []int{1, 2, 3}) {
			t.Errorf("%s was received at attempts %v, want [1 2 3]", id, got)
		}
	}
	if n := e.adm.depth(t, e.endpoint); n != 0 {
		t.Errorf("%d messages back in the endpoint's queue, want 0", n)
	}
	if n := e.adm.depth(t, other); n != 1 {
		t.Errorf("%d messages in the queue named by CC, want 1 (the publisher's own copy)", n)
	}
	dead := e.adm.get(t, rabbitmq.DeadLetterQueue(e.endpoint), 10)
	if len(dead) != len(ccs) {
		t.Fatalf("%d messages in the dead-letter queue, want %d", len(dead), len(ccs))
	}
	for _, m := range dead {
		dl, err := rabbitmq.DecodeDeadLetter(m)
		if err != nil {
			t.Fatal(err)
		}
		want := ccs[m.MessageId]
		if _, ok := m.Headers["CC"]; ok || !slices.Equal(m.Headers[rabbitmq.HeaderOriginalCC].([]any), want) {
			t.Errorf("dead letter %s: CC %v, %s %v; want no CC and the original %v kept", m.MessageId, m.Headers["CC"], rabbitmq.HeaderOriginalCC, m.Headers[rabbitmq.HeaderOriginalCC], want)
		}
		if !strings.Contains(dl.Failure.Reason, "always fails") || dl.Failure.Attempts != maxAttempts || dl.Failure.Endpoint != e.endpoint {
			t.Errorf("dead letter %s: failure %+v, want the handler's error after %d attempts", m.MessageId, dl.Failure, maxAttempts)
		}
		if _, ok := dl.Envelope.Headers["CC"]; ok {
			t.Errorf("dead letter %s decodes with a CC header", m.MessageId)
		}
	}
	if kept := e.adm.get(t, other, 1); len(kept) == 1 && kept[0].MessageId != "cc-other-queue" {
		t.Errorf("the queue named by CC holds %s, want the publisher's copy of cc-other-queue", kept[0].MessageId)
	}
}

// A CC that is not an array of strings never reaches a queue: the broker
// refuses the publish (it closes the channel).
func TestCCOfAnotherTypeIsRefusedByTheBroker(t *testing.T) {
	e := newEnv(t)
	e.adm.declareQueue(t, e.endpoint)
	ch, err := e.adm.channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirm("", e.endpoint, false, false, amqp.Publishing{Type: "test.order", Body: []byte(`{}`), Headers: amqp.Table{"CC": e.endpoint}})
	if err == nil && dc.Wait() {
		t.Error("the broker accepted a CC that is a string")
	}
	if n := e.adm.depth(t, e.endpoint); n != 0 {
		t.Errorf("%d messages in the queue, want 0", n)
	}
}
