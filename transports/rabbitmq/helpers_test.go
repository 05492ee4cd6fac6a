package rabbitmq_test

import (
	"context"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/rabbitmq"
)

// admin is a plain amqp091 connection for what tests do behind the
// transport's back: deleting queues, reading dead letters, raw publishes.
// It reconnects when the broker was restarted.
type admin struct {
	url  string
	mu   sync.Mutex
	conn *amqp.Connection
}

func newAdmin(t testing.TB, url string) *admin {
	t.Helper()
	a := &admin{url: url}
	t.Cleanup(func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.conn != nil {
			_ = a.conn.Close()
		}
	})
	if _, err := a.channel(); err != nil {
		t.Fatalf("admin connection: %v", err)
	}
	return a
}

func (a *admin) channel() (*amqp.Channel, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.conn == nil || a.conn.IsClosed() {
		conn, err := amqp.Dial(a.url)
		if err != nil {
			return nil, err
		}
		a.conn = conn
	}
	return a.conn.Channel()
}

// do runs f on a fresh channel: a failed AMQP method closes its channel.
func (a *admin) do(t testing.TB, f func(ch *amqp.Channel) error) {
	t.Helper()
	ch, err := a.channel()
	if err != nil {
		t.Errorf("admin channel: %v", err)
		return
	}
	defer ch.Close()
	if err := f(ch); err != nil {
		t.Errorf("admin: %v", err)
	}
}

// deleteEndpoint removes an endpoint's queue and dead-letter queue.
func (a *admin) deleteEndpoint(t testing.TB, endpoint string) {
	for _, q := range []string{endpoint, rabbitmq.DeadLetterQueue(endpoint)} {
		a.do(t, func(ch *amqp.Channel) error { _, err := ch.QueueDelete(q, false, false, false); return err })
	}
}

func (a *admin) deleteExchange(t testing.TB, name string) {
	a.do(t, func(ch *amqp.Channel) error { return ch.ExchangeDelete(name, false, false) })
}

// publish publishes a raw message to queue and waits for its confirmation.
func (a *admin) publish(t testing.TB, queue string, msg amqp.Publishing) {
	t.Helper()
	a.do(t, func(ch *amqp.Channel) error {
		if err := ch.Confirm(false); err != nil {
			return err
		}
		dc, err := ch.PublishWithDeferredConfirm("", queue, true, false, msg)
		if err != nil {
			return err
		}
		if !dc.Wait() {
			t.Errorf("raw publish to %s nacked", queue)
		}
		return nil
	})
}

// deadLetters reads endpoint's dead-letter queue without removing anything:
// it consumes until it has n messages or ctx ends, then closes its channel
// without acknowledging, which puts them back.
func (a *admin) deadLetters(ctx context.Context, t testing.TB, endpoint string, n int) []bus.DeadLetter {
	t.Helper()
	ch, err := a.channel()
	if err != nil {
		t.Fatalf("admin channel: %v", err)
	}
	defer ch.Close()
	dl, err := ch.Consume(rabbitmq.DeadLetterQueue(endpoint), "", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("consuming the dead-letter queue of %s: %v", endpoint, err)
	}
	var out []bus.DeadLetter
	for len(out) < n {
		select {
		case m, ok := <-dl:
			if !ok {
				t.Fatalf("dead-letter consumer of %s closed", endpoint)
			}
			d, err := rabbitmq.DeadLetter(m)
			if err != nil {
				t.Errorf("decoding dead letter: %v", err)
			}
			out = append(out, d)
		case <-ctx.Done():
			return out
		}
	}
	return out
}

// open returns a transport on exchange whose endpoint queues are deleted
// at cleanup.
func open(t testing.TB, url string, adm *admin, opts ...rabbitmq.Option) *rabbitmq.Transport {
	t.Helper()
	tr, err := rabbitmq.New(url, append([]rabbitmq.Option{rabbitmq.WithReconnectBackoff(20*time.Millisecond, 500*time.Millisecond)}, opts...)...)
	if err != nil {
		t.Fatalf("rabbitmq.New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := tr.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
		if ep := tr.Endpoint(); ep != "" {
			adm.deleteEndpoint(t, ep)
		}
	})
	return tr
}

func testContext(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
