package requestreply_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/testenv"
	"github.com/plugbus/plugbus/plugins/requestreply"
	"github.com/plugbus/plugbus/transports/rabbitmq"
)

func rabbitTransports(t *testing.T) func(testing.TB) bus.Transport {
	url := testenv.RabbitMQ(t)
	quiet := slog.New(slog.DiscardHandler)
	return func(tb testing.TB) bus.Transport {
		tr, err := rabbitmq.New(url, rabbitmq.WithLogger(quiet), rabbitmq.WithBackoff(bus.Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond}))
		if err != nil {
			tb.Fatal(err)
		}
		return tr
	}
}

// queueCleanup returns a function that records an endpoint whose durable
// queues (its own and its dead-letter queue) are deleted when t ends.
// Call it before anything that stops at cleanup: cleanups run in reverse,
// so the queues go after the buses that consume them.
func queueCleanup(t *testing.T) (keep func(endpoint string)) {
	var endpoints []string
	t.Cleanup(func() {
		conn, err := amqp.Dial(testenv.RabbitMQ(t))
		if err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
		for _, ep := range endpoints {
			_, _ = ch.QueueDelete(ep, false, false, false)
			_, _ = ch.QueueDelete(rabbitmq.DeadLetterQueue(ep), false, false, false)
		}
	})
	return func(endpoint string) { endpoints = append(endpoints, endpoint) }
}

func TestRabbitMQ(t *testing.T) {
	newT := rabbitTransports(t)
	keep := queueCleanup(t)
	keep(runScenarios(t, newT).endpoint)
}

// TestRabbitMQReconnect: a requester whose connection drops declares its
// instance queue again under the same address and keeps receiving replies;
// a reply sent while the queue is gone is dropped and the request times out.
func TestRabbitMQReconnect(t *testing.T) {
	newT := rabbitTransports(t)
	keep := queueCleanup(t)
	w := newWorld(t, newT)
	keep(w.endpoint)
	// The requester reaches the broker through a proxy that can cut its connection.
	px := testenv.StartProxy(t, testenv.Getenv("PLUGBUS_AMQP_ADDR", "127.0.0.1:5672"))
	tr, err := rabbitmq.New("amqp://guest:guest@"+px.Addr()+"/", rabbitmq.WithLogger(slog.New(slog.DiscardHandler)),
		rabbitmq.WithBackoff(bus.Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	p := requestreply.New()
	rb := start(t, p, bus.WithName("cut-requester"), bus.WithTransport(tr), bus.WithLogger(slog.New(slog.DiscardHandler)))
	w.openAllOnCleanup(t)
	addr := p.Stats(rb).Address
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if _, err := requestreply.Request[sum](ctx, rb, add{A: 1}, requestreply.To(w.endpoint)); err != nil {
		t.Fatal(err)
	}
	// Hold a request at a responder, cut the requester's connection (its
	// exclusive queue goes with it), then let the responder reply.
	const seq = 3003
	done := make(chan error, 1)
	go func() {
		_, err := requestreply.Request[sum](ctx, rb, slow{Seq: seq}, requestreply.To(w.endpoint), requestreply.WithTimeout(2*time.Second))
		done <- err
	}()
	w.waitStarted(t, seq)
	px.Cut()
	w.open(seq) // the reply is dropped, or received after the reconnection
	if err := <-done; err != nil && !errors.Is(err, requestreply.ErrTimeout) {
		t.Fatalf("request across the reconnection: %v, want its reply or a clean timeout", err)
	}
	if n := p.Stats(rb).Pending; n != 0 {
		t.Fatalf("%d pending after the reconnection", n)
	}
	// Once reconnected, the same address serves again.
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := requestreply.Request[sum](ctx, rb, add{A: 2}, requestreply.To(w.endpoint), requestreply.WithTimeout(time.Second))
		if err == nil {
			break
		}
		if !errors.Is(err, requestreply.ErrTimeout) || time.Now().After(deadline) {
			t.Fatalf("request after the reconnection: %v", err)
		}
	}
	if got := p.Stats(rb).Address; got != addr {
		t.Fatalf("reply address changed from %s to %s", addr, got)
	}
	if n := p.Stats(rb).Pending; n != 0 {
		t.Fatalf("%d pending", n)
	}
}

// TestRabbitMQDefaultTimeoutBoundsTheSend: a request whose context has no
// deadline is bounded by the plugin's default timeout also while its
// send waits for a connection to the broker, as one with WithTimeout is:
// it fails once the timeout passed rather than wait for the broker to
// come back.
func TestRabbitMQDefaultTimeoutBoundsTheSend(t *testing.T) {
	px := testenv.StartProxy(t, testenv.Getenv("PLUGBUS_AMQP_ADDR", "127.0.0.1:5672"))
	tr, err := rabbitmq.New("amqp://guest:guest@"+px.Addr()+"/", rabbitmq.WithLogger(slog.New(slog.DiscardHandler)),
		rabbitmq.WithBackoff(bus.Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	rb := start(t, requestreply.New(requestreply.WithDefaultTimeout(300*time.Millisecond)), bus.WithTransport(tr),
		bus.WithLogger(slog.New(slog.DiscardHandler)))
	px.Refuse() // no new connection gets through
	px.Cut()
	done := make(chan error, 1)
	go func() {
		_, err := requestreply.Request[sum](context.Background(), rb, add{A: 1}, requestreply.To("nobody"))
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Request while the broker is unreachable: %v, want the send's error wrapping context.DeadlineExceeded", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Request without a deadline still waits for the broker 20s later: the default timeout of 300ms does not bound its send")
	}
}
