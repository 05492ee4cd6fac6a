package rabbitmq_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/testenv"
	"github.com/plugbus/plugbus/transports/rabbitmq"
)

// A delivery received on a connection that has since dropped cannot be
// settled: its delivery tag would name another message on the new
// connection's consumer channel (tags start again at 1). Delete reports
// the lost connection, acknowledges nothing on the new channel, and the
// broker redelivers the message.
func TestSettlingADeliveryOfALostConnectionAcksNothingOnTheNewOne(t *testing.T) {
	broker := testenv.RabbitMQ(t)
	e := newEnv(t)
	px := testenv.StartProxy(t, testenv.Getenv("PLUGBUS_AMQP_ADDR", "127.0.0.1:5672"))
	// A prefetch of 1: the old connection holds "first" alone.
	tr := open(t, px.URL(t, broker), e.adm, rabbitmq.WithExchange(e.exchange), rabbitmq.WithPrefetch(1))
	ctx := testContext(t, 30*time.Second)
	if err := tr.Setup(ctx, bus.Topology{Endpoint: e.endpoint, Handles: []string{"test.order"}, MaxAttempts: 3, Concurrency: 1}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"first", "second"} {
		env := &bus.Envelope{Name: "test.order", ContentType: "application/json", Body: []byte(`{}`), Attributes: bus.NewAttributes(id, id, time.Now(), nil, nil)}
		if err := tr.Send(ctx, env, e.endpoint); err != nil {
			t.Fatal(err)
		}
	}
	old, err := tr.Receive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	px.Cut()
	// The new connection's consumer gets "first" again, with tag 1.
	again, err := tr.Receive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if again.Attributes.MessageID != old.Attributes.MessageID {
		t.Fatalf("after the reconnection received %s, want %s again", again.Attributes.MessageID, old.Attributes.MessageID)
	}
	if err := tr.Delete(ctx, old); !errors.Is(err, rabbitmq.ErrConnectionLost) {
		t.Fatalf("Delete of a delivery of the lost connection: %v, want rabbitmq.ErrConnectionLost", err)
	}
	// Had the stale tag been acknowledged on the new channel, this would
	// fail (an unknown tag closes the channel) and "second" would be lost.
	if err := tr.Delete(ctx, again); err != nil {
		t.Fatalf("Delete of the redelivery: %v", err)
	}
	next, err := tr.Receive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if next.Attributes.MessageID != "second" {
		t.Fatalf("then received %s, want second", next.Attributes.MessageID)
	}
	if err := tr.Delete(ctx, next); err != nil {
		t.Fatal(err)
	}
}

// A Send, or a batch, whose confirmation never arrives because the
// connection dropped is published again on the next connection: it
// returns nil only once a broker confirmed it, and the messages are in
// the queue (maybe twice).
func TestSendWhoseConfirmationIsLostIsPublishedAgain(t *testing.T) {
	for _, n := range []int{1, 3} {
		t.Run(map[int]string{1: "send", 3: "batch"}[n], func(t *testing.T) { sendAcrossALostConfirmation(t, n) })
	}
}

func sendAcrossALostConfirmation(t *testing.T, n int) {
	broker := testenv.RabbitMQ(t)
	e := newEnv(t)
	px := testenv.StartProxy(t, testenv.Getenv("PLUGBUS_AMQP_ADDR", "127.0.0.1:5672"))
	// A send-only transport to a queue nobody consumes: the queue's depth
	// tells when the broker stored the messages.
	e.adm.declareQueue(t, e.endpoint)
	tr := open(t, px.URL(t, broker), e.adm, rabbitmq.WithExchange(e.exchange))
	ctx := testContext(t, 30*time.Second)
	if err := tr.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	px.Stall()
	sent := make(chan error, 1)
	go func() {
		var batch []bus.Outbound
		for i := range n {
			id := fmt.Sprintf("lost-confirm-%d", i)
			env := &bus.Envelope{Name: "test.order", ContentType: "application/json", Body: []byte(`{}`), Attributes: bus.NewAttributes(id, "c", time.Now(), nil, nil)}
			batch = append(batch, bus.Outbound{Kind: bus.KindSend, Envelope: env, Destination: e.endpoint})
		}
		if n == 1 {
			sent <- tr.Send(ctx, batch[0].Envelope, e.endpoint)
			return
		}
		sent <- tr.SendBatch(ctx, batch)
	}()
	// The broker stored them and confirmed; the proxy holds the confirmations.
	for e.adm.depth(t, e.endpoint) < n { // no signal to wait on: poll the broker
		select {
		case err := <-sent:
			t.Fatalf("the send returned %v before its confirmation reached the transport", err)
		case <-ctx.Done():
			t.Fatal("the messages never reached the queue")
		case <-time.After(10 * time.Millisecond):
		}
	}
	px.Cut()
	select {
	case err := <-sent:
		if err != nil {
			t.Fatalf("send across the reconnection: %v, want nil once the next connection confirmed it", err)
		}
	case <-ctx.Done():
		t.Fatal("the send never returned")
	}
	got := map[string]bool{}
	for _, m := range e.adm.get(t, e.endpoint, 2*n+1) {
		got[m.MessageId] = true
	}
	if len(got) != n {
		t.Fatalf("queue holds %v after a successful send of %d messages", got, n)
	}
}
