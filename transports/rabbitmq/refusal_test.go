package rabbitmq_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
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

// reconnections counts the connection losses a transport logged into
// logs, for tests that check what it did not do (reconnect).
func reconnections(logs *testenv.LogBuffer) int {
	return strings.Count(logs.String(), "connection to RabbitMQ lost")
}

// textLogger is a logger writing text into logs.
func textLogger(logs *testenv.LogBuffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(logs, nil))
}

func message(name, id string) *bus.Envelope {
	return &bus.Envelope{Name: name, ContentType: "application/json", Body: []byte(`{}`), Attributes: bus.NewAttributes(id, id, time.Now(), nil, nil)}
}

// sendTo sends env to endpoint on tr, failing the test if it cannot.
func sendTo(ctx context.Context, t *testing.T, tr *rabbitmq.Transport, endpoint string, env *bus.Envelope) {
	t.Helper()
	if err := tr.Send(ctx, env, endpoint); err != nil {
		t.Fatalf("Send of %s to %s: %v", env.Name, endpoint, err)
	}
}

func receive(ctx context.Context, t *testing.T, tr *rabbitmq.Transport, within time.Duration) *bus.Delivery {
	t.Helper()
	rctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	d, err := tr.Receive(rctx)
	if err != nil {
		t.Fatalf("Receive: %v", err)
	}
	return d
}

// A Return or Fail whose copy the broker refuses requeues the original:
// left unacknowledged, it would hold its prefetch slot for good and, with
// prefetch 1, stall the consumer.
func TestRefusedResendRequeuesOriginal(t *testing.T) {
	t.Run("Return nacked", func(t *testing.T) {
		e := newEnv(t)
		tr := e.transport(t, rabbitmq.WithPrefetch(1),
			rabbitmq.WithQueueArguments(amqp.Table{"x-max-length": int32(1), "x-overflow": "reject-publish"}))
		ctx := testContext(t, 30*time.Second)
		if err := tr.Setup(ctx, bus.Topology{Endpoint: e.endpoint, Concurrency: 1, MaxAttempts: 5}); err != nil {
			t.Fatal(err)
		}
		sendTo(ctx, t, tr, e.endpoint, message("A", "a"))
		a := receive(ctx, t, tr, 5*time.Second)
		sendTo(ctx, t, tr, e.endpoint, message("B", "b"))
		// The queue is full (B): the copy of A is nacked.
		if err := tr.Return(ctx, a, errors.New("handler failed")); !errors.Is(err, rabbitmq.ErrNacked) {
			t.Fatalf("Return into a full queue: %v, want rabbitmq.ErrNacked", err)
		}
		got := map[string]int{}
		for range 2 {
			d := receive(ctx, t, tr, 5*time.Second)
			got[d.Name] = d.Attempt
			if err := tr.Delete(ctx, d); err != nil {
				t.Fatal(err)
			}
		}
		if got["A"] != 1 || got["B"] != 1 {
			t.Errorf("after the refused Return received %v, want A (requeued, attempt 1) and B", got)
		}
	})
	t.Run("Fail nacked", func(t *testing.T) {
		e := newEnv(t)
		tr := e.transport(t, rabbitmq.WithPrefetch(1),
			rabbitmq.WithDeadLetterQueueArguments(amqp.Table{"x-max-length": int32(1), "x-overflow": "reject-publish"}))
		ctx := testContext(t, 30*time.Second)
		if err := tr.Setup(ctx, bus.Topology{Endpoint: e.endpoint, Concurrency: 1, MaxAttempts: 1}); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{"a", "b"} {
			sendTo(ctx, t, tr, e.endpoint, message("A", id))
		}
		if err := tr.Fail(ctx, receive(ctx, t, tr, 5*time.Second), bus.Failure{Reason: "boom", Attempts: 1}); err != nil {
			t.Fatal(err) // a fills the dead-letter queue
		}
		if err := tr.Fail(ctx, receive(ctx, t, tr, 5*time.Second), bus.Failure{Reason: "boom", Attempts: 1}); !errors.Is(err, rabbitmq.ErrNacked) {
			t.Fatalf("Fail into a full dead-letter queue: %v, want rabbitmq.ErrNacked", err)
		}
		d := receive(ctx, t, tr, 5*time.Second)
		if d.Name != "A" || d.Attributes.MessageID != "b" {
			t.Errorf("after the refused Fail received %s (id %s), want b redelivered", d.Name, d.Attributes.MessageID)
		}
		if err := tr.Delete(ctx, d); err != nil {
			t.Fatal(err)
		}
	})
}

// A dead-letter queue deleted behind the transport's back is declared
// again by the Fail that finds it gone: the message is dead-lettered, not
// redelivered at once at the same attempt (a loop).
func TestFailDeclaresADeletedDeadLetterQueueAgain(t *testing.T) {
	e := newEnv(t)
	var logs testenv.LogBuffer
	tr := e.transport(t, rabbitmq.WithLogger(textLogger(&logs)))
	ctx := testContext(t, 30*time.Second)
	if err := tr.Setup(ctx, bus.Topology{Endpoint: e.endpoint, Concurrency: 1, MaxAttempts: 1}); err != nil {
		t.Fatal(err)
	}
	sendTo(ctx, t, tr, e.endpoint, message("A", "a"))
	a := receive(ctx, t, tr, 5*time.Second)
	e.adm.do(t, func(ch *amqp.Channel) error {
		_, err := ch.QueueDelete(rabbitmq.DeadLetterQueue(e.endpoint), false, false, false)
		return err
	})
	if err := tr.Fail(ctx, a, bus.Failure{Reason: "boom", Attempts: 1}); err != nil {
		t.Fatalf("Fail with the dead-letter queue deleted: %v", err)
	}
	if got := e.adm.deadLetters(ctx, t, e.endpoint, 1); len(got) != 1 || got[0].Envelope.Attributes.MessageID != "a" || got[0].Failure.Reason != "boom" {
		t.Fatalf("dead letters %+v, want a with its reason", got)
	}
	if !strings.Contains(logs.String(), "declared it again") {
		t.Errorf("no warning about the queue declared again; logs:\n%s", logs.String())
	}
}

// RabbitMQ refuses a user-id property other than the publishing user's:
// Return and Fail move a foreign one to a header instead of copying it,
// which would close the channel and loop the message at attempt 1.
func TestResendOfForeignUserID(t *testing.T) {
	e := newEnv(t)
	var logs testenv.LogBuffer
	tr := e.transport(t, rabbitmq.WithLogger(textLogger(&logs)))
	ctx := testContext(t, 30*time.Second)
	if err := tr.Setup(ctx, bus.Topology{Endpoint: e.endpoint, Concurrency: 1, MaxAttempts: 2}); err != nil {
		t.Fatal(err)
	}
	// As if user alice had published it (RabbitMQ validates user-id, so
	// the test cannot publish it as guest): rewrite the delivery.
	foreign := func(d *bus.Delivery) *bus.Delivery {
		m := d.Raw.(*amqp.Delivery)
		m.UserId = "alice"
		d.Raw = m
		return d
	}
	sendTo(ctx, t, tr, e.endpoint, message("A", "a"))
	d := foreign(receive(ctx, t, tr, 5*time.Second))
	if err := tr.Return(ctx, d, errors.New("boom")); err != nil {
		t.Fatalf("Return of a message with another user's user-id: %v", err)
	}
	d = receive(ctx, t, tr, 5*time.Second)
	if d.Attempt != 2 {
		t.Errorf("returned copy has attempt %d, want 2", d.Attempt)
	}
	raw := d.Raw.(*amqp.Delivery)
	if raw.UserId != "" || raw.Headers[rabbitmq.HeaderUserID] != "alice" {
		t.Errorf("returned copy: user-id %q, header %s = %v; want no user-id and the header alice", raw.UserId, rabbitmq.HeaderUserID, raw.Headers[rabbitmq.HeaderUserID])
	}
	if err := tr.Fail(ctx, foreign(d), bus.Failure{Reason: "boom", Attempts: 2}); err != nil {
		t.Fatalf("Fail of a message with another user's user-id: %v", err)
	}
	if dl := e.adm.deadLetters(testContext(t, 5*time.Second), t, e.endpoint, 1); len(dl) != 1 || dl[0].Failure.Reason != "boom" {
		t.Errorf("dead letters: %+v, want the message failed with reason boom", dl)
	}
	if n := reconnections(&logs); n != 0 {
		t.Errorf("the connection was lost %d times", n)
	}
}

// A publish the broker refuses by closing its channel — here, to the topic
// exchange deleted behind the transport's back (404 NOT_FOUND) — replaces
// that channel only: the connection and its deliveries stay. The exchange
// is declared again with the endpoint's bindings and the publish goes
// through.
func TestRefusedPublishKeepsConnection(t *testing.T) {
	e := newEnv(t)
	var logs testenv.LogBuffer
	tr := e.transport(t, rabbitmq.WithLogger(textLogger(&logs)), rabbitmq.WithPublisherChannels(1))
	ctx := testContext(t, 30*time.Second)
	if err := tr.Setup(ctx, bus.Topology{Endpoint: e.endpoint, Handles: []string{"test.gone"}, Concurrency: 1, MaxAttempts: 2}); err != nil {
		t.Fatal(err)
	}
	sendTo(ctx, t, tr, e.endpoint, message("A", "a"))
	d := receive(ctx, t, tr, 5*time.Second)
	e.adm.deleteExchange(t, e.exchange)
	if err := tr.Publish(testContext(t, 10*time.Second), message("test.gone", "g")); err != nil {
		t.Fatalf("Publish to the deleted exchange: %v, want it declared again and the publish through", err)
	}
	if !strings.Contains(logs.String(), "declared it again") {
		t.Errorf("no warning about the exchange declared again; logs:\n%s", logs.String())
	}
	// The publisher channel was replaced: a send works, and the delivery
	// of the same connection can still be settled.
	if err := tr.Send(ctx, message("B", "b"), e.endpoint); err != nil {
		t.Errorf("Send after a refusal: %v", err)
	}
	if err := tr.Delete(ctx, d); err != nil {
		t.Errorf("Delete of a delivery received before the refusal: %v", err)
	}
	got := map[string]bool{}
	for range 2 { // the publish (through the binding declared again) and B
		d := receive(ctx, t, tr, 10*time.Second)
		got[d.Attributes.MessageID] = true
		if err := tr.Delete(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	if !got["g"] || !got["b"] {
		t.Errorf("received %v, want g and b", got)
	}
	if n := reconnections(&logs); n != 0 {
		t.Errorf("the connection was lost %d times", n)
	}
}

// Publishes racing on the channel the broker closes for a refusal: amqp091
// marks it closed before it reports why, and a publish refused in between
// must still see a refusal of that channel, not a lost connection.
func TestConcurrentRefusalKeepsConnection(t *testing.T) {
	const senders, before, after = 32, 200, 400
	for round := range 10 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			e := newEnv(t)
			var logs testenv.LogBuffer
			tr := e.transport(t, rabbitmq.WithLogger(textLogger(&logs)), rabbitmq.WithPublisherChannels(1))
			ctx := testContext(t, 60*time.Second)
			if err := tr.Setup(ctx, bus.Topology{Endpoint: e.endpoint, Handles: []string{"test.gone"}, Concurrency: 1, MaxAttempts: 2}); err != nil {
				t.Fatal(err)
			}
			var published, afterDelete atomic.Int64
			deleted, enough, stop := make(chan struct{}), make(chan struct{}), make(chan struct{})
			var once sync.Once
			var wg sync.WaitGroup
			for w := range senders {
				wg.Go(func() {
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						_ = tr.Publish(ctx, message("test.gone", fmt.Sprintf("%d-%d", w, i)))
						if published.Add(1) == before {
							close(enough)
						}
						select {
						case <-deleted:
							if afterDelete.Add(1) == after {
								once.Do(func() { close(stop) })
							}
						default:
						}
					}
				})
			}
			<-enough
			e.adm.deleteExchange(t, e.exchange)
			close(deleted)
			wg.Wait()
			if !strings.Contains(logs.String(), "declared it again") {
				t.Errorf("no publish was refused for the deleted exchange (no warning about it declared again): nothing raced on a refused channel; logs:\n%s", logs.String())
			}
			if n := reconnections(&logs); n != 0 {
				t.Errorf("the connection was lost %d times; logs:\n%s", n, logs.String())
			}
		})
	}
}

// A body over WithMaxMessageSize is refused before it reaches the broker,
// whose refusal would close the channel, with the core's
// *bus.MessageTooLargeError.
func TestBodyOverMaxMessageSizeIsRefusedBeforeSending(t *testing.T) {
	e := newEnv(t)
	tr := e.transport(t, rabbitmq.WithMaxMessageSize(1024))
	ctx := testContext(t, 10*time.Second)
	big := message("Big", "big")
	big.Body = bytes.Repeat([]byte("x"), 1025)
	err := tr.Send(ctx, big, transporttest.Name("anywhere"))
	var te *bus.MessageTooLargeError
	if !errors.As(err, &te) || !errors.Is(err, bus.ErrMessageTooLarge) || te.Transport != "rabbitmq" || te.Message != "Big" || te.Size != 1025 || te.Limit != 1024 {
		t.Errorf("Send of 1025 bytes with a 1024-byte limit: %v, want a *bus.MessageTooLargeError of rabbitmq, Big, 1025 over 1024", err)
	}
	if _, err := rabbitmq.New(e.url, rabbitmq.WithMaxMessageSize(0)); err == nil {
		t.Error("WithMaxMessageSize(0) accepted")
	}
}

// A quorum queue counts redeliveries: a message whose consumer stopped
// without settling it (a crash) comes back with its attempt raised, so
// that it reaches the dead-letter queue after MaxAttempts crashes.
func TestQuorumQueueCountsCrashes(t *testing.T) {
	e := newEnv(t)
	quorum := rabbitmq.WithQueueArguments(amqp.Table{"x-queue-type": "quorum"})
	ctx := testContext(t, 30*time.Second)
	topo := bus.Topology{Endpoint: e.endpoint, Concurrency: 1, MaxAttempts: 3}
	crashed := e.transport(t, quorum)
	if err := crashed.Setup(ctx, topo); err != nil {
		t.Fatal(err)
	}
	sendTo(ctx, t, crashed, e.endpoint, message("A", "a"))
	if d := receive(ctx, t, crashed, 5*time.Second); d.Attempt != 1 {
		t.Fatalf("first delivery has attempt %d", d.Attempt)
	}
	if err := crashed.Close(ctx); err != nil { // without settling
		t.Fatal(err)
	}
	tr := e.transport(t, quorum)
	if err := tr.Setup(ctx, topo); err != nil {
		t.Fatal(err)
	}
	d := receive(ctx, t, tr, 10*time.Second)
	if d.Attempt != 2 {
		t.Errorf("redelivery after a crash has attempt %d, want 2", d.Attempt)
	}
	// A Return of it counts from there, and drops the broker's count.
	if err := tr.Return(ctx, d, errors.New("boom")); err != nil {
		t.Fatal(err)
	}
	d = receive(ctx, t, tr, 5*time.Second)
	if _, ok := d.Raw.(*amqp.Delivery).Headers["x-delivery-count"]; d.Attempt != 3 || ok {
		t.Errorf("returned copy: attempt %d, x-delivery-count present %v; want 3 and absent", d.Attempt, ok)
	}
	if err := tr.Delete(ctx, d); err != nil {
		t.Fatal(err)
	}
}

// A length limit (or a TTL) given for the endpoint queue does not apply to
// its dead-letter queue: the broker would drop dead letters silently.
func TestQueueArgumentsLeaveTheDeadLetterQueueAlone(t *testing.T) {
	e := newEnv(t)
	tr := e.transport(t, rabbitmq.WithQueueArguments(amqp.Table{"x-max-length": int32(1)}))
	ctx := testContext(t, 30*time.Second)
	if err := tr.Setup(ctx, bus.Topology{Endpoint: e.endpoint, Concurrency: 1, MaxAttempts: 1}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b"} {
		sendTo(ctx, t, tr, e.endpoint, message("A", id))
		d := receive(ctx, t, tr, 5*time.Second)
		if err := tr.Fail(ctx, d, bus.Failure{Reason: "boom", Attempts: 1}); err != nil {
			t.Fatal(err)
		}
	}
	// Both were confirmed into it; a second is dropped at once if at all.
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if got := e.adm.deadLetters(lctx, t, e.endpoint, 2); len(got) != 2 {
		t.Fatalf("%d dead letters, want both", len(got))
	}
	// WithDeadLetterQueueArguments is what sets the dead-letter queue's.
	e2 := newEnv(t)
	tr2 := e2.transport(t, rabbitmq.WithDeadLetterQueueArguments(amqp.Table{"x-max-length": int32(5)}))
	if err := tr2.Setup(ctx, bus.Topology{Endpoint: e2.endpoint, Concurrency: 1}); err != nil {
		t.Fatal(err)
	}
	e2.adm.do(t, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(rabbitmq.DeadLetterQueue(e2.endpoint), true, false, false, false, amqp.Table{"x-max-length": int32(5)})
		return err // PRECONDITION_FAILED unless these are its arguments
	})
}
