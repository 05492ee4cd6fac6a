package rabbitmq_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/testenv"
	"github.com/plugbus/plugbus/transports/rabbitmq"
	"github.com/plugbus/plugbus/transports/transporttest"
)

// In a batch, a send to a queue that does not exist and a message over the
// size limit fail alone, each with the error Send gives it; the other
// messages are confirmed and arrive in order.
func TestBatchFailuresStayWithTheirMessage(t *testing.T) {
	url := testenv.RabbitMQ(t)
	adm := newAdmin(t, url)
	queue := transporttest.Name("batch-target")
	adm.declareQueue(t, queue)
	tr := open(t, url, adm, rabbitmq.WithMaxMessageSize(64))
	ctx := testContext(t, 30*time.Second)
	var batch []bus.Outbound
	for i := range 6 {
		env := &bus.Envelope{Name: "batch.msg", ContentType: "application/json", Body: []byte(strconv.Itoa(i)),
			Attributes: bus.NewAttributes(transporttest.Name("id"), "c", time.Now().UTC().Truncate(time.Millisecond), nil, nil)}
		dest := queue
		switch i {
		case 2:
			dest = transporttest.Name("no-such-queue")
		case 4:
			env.Body = make([]byte, 65)
		}
		batch = append(batch, bus.Outbound{Kind: bus.KindSend, Envelope: env, Destination: dest})
	}
	err := tr.SendBatch(ctx, batch)
	var be *bus.BatchError
	if !errors.As(err, &be) || len(be.Failures) != 2 {
		t.Fatalf("SendBatch = %v, want a *bus.BatchError with 2 failures", err)
	}
	var unroutable *rabbitmq.UnroutableError
	if be.Failures[0].Index != 2 || !errors.As(be.Failures[0].Err, &unroutable) {
		t.Errorf("first failure %d %v, want index 2, unroutable", be.Failures[0].Index, be.Failures[0].Err)
	}
	if be.Failures[1].Index != 4 || !errors.Is(be.Failures[1].Err, bus.ErrMessageTooLarge) {
		t.Errorf("second failure %d %v, want index 4, too large", be.Failures[1].Index, be.Failures[1].Err)
	}
	got := adm.get(t, queue, 10)
	var bodies string
	for _, m := range got {
		bodies += string(m.Body)
	}
	if bodies != "0135" {
		t.Errorf("queue holds %q, want 0135", bodies)
	}
}

// A batch whose channel the broker closes mid-flight (a publish to the
// topic exchange deleted behind the transport's back) loses nothing: the
// messages it did not confirm are published again one by one, the
// exchange is declared again, and every message of the batch arrives.
func TestBatchRefusedMidFlightLosesNothing(t *testing.T) {
	e := newEnv(t)
	tr := e.transport(t, rabbitmq.WithPublisherChannels(1))
	ctx := testContext(t, 30*time.Second)
	if err := tr.Setup(ctx, bus.Topology{Endpoint: e.endpoint, Handles: []string{"test.gone"}, Concurrency: 8, MaxAttempts: 2}); err != nil {
		t.Fatal(err)
	}
	e.adm.deleteExchange(t, e.exchange)
	batch := []bus.Outbound{
		{Kind: bus.KindSend, Envelope: message("A", "a"), Destination: e.endpoint},
		{Kind: bus.KindPublish, Envelope: message("test.gone", "g")},
		{Kind: bus.KindSend, Envelope: message("B", "b"), Destination: e.endpoint},
		{Kind: bus.KindSend, Envelope: message("C", "c"), Destination: e.endpoint},
	}
	if err := tr.SendBatch(ctx, batch); err != nil {
		t.Fatalf("SendBatch: %v", err)
	}
	got := map[string]int{}
	for len(got) < 4 {
		d := receive(ctx, t, tr, 10*time.Second)
		got[d.Attributes.MessageID]++
		if err := tr.Delete(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"a", "g", "b", "c"} {
		if got[id] == 0 {
			t.Errorf("%s never arrived (received %v)", id, got)
		}
	}
}

// A batch reaches the broker in one write, not one per message, so that
// the broker stores and confirms it together; every message arrives, in
// order.
func TestBatchReachesTheBrokerInOneWrite(t *testing.T) {
	url := testenv.RabbitMQ(t)
	adm := newAdmin(t, url)
	queue := transporttest.Name("batch-one-write")
	adm.declareQueue(t, queue)
	tr := open(t, url, adm)
	ctx := testContext(t, 30*time.Second)
	send := func(i int) bus.Outbound {
		env := &bus.Envelope{Name: "batch.msg", ContentType: "application/json", Body: []byte(strconv.Itoa(i)),
			Attributes: bus.NewAttributes(transporttest.Name("id"), "c", time.Now().UTC().Truncate(time.Millisecond), nil, nil)}
		return bus.Outbound{Kind: bus.KindSend, Envelope: env, Destination: queue}
	}
	if err := tr.SendBatch(ctx, []bus.Outbound{send(-1)}); err != nil { // connects
		t.Fatalf("SendBatch of one: %v", err)
	}
	var batch []bus.Outbound
	for i := range 50 {
		batch = append(batch, send(i))
	}
	n := writesDuring(ctx, t, tr, func() {
		if err := tr.SendBatch(ctx, batch); err != nil {
			t.Fatalf("SendBatch: %v", err)
		}
	})
	// One write carries the batch; a heartbeat may add one.
	if n < 1 || n > 2 {
		t.Errorf("a batch of 50 took %d writes to the socket, want 1 (2 with a heartbeat)", n)
	}
	got := adm.get(t, queue, 60)
	if len(got) != 51 {
		t.Fatalf("queue holds %d messages, want 51", len(got))
	}
	for i, m := range got[1:] {
		if string(m.Body) != strconv.Itoa(i) {
			t.Fatalf("message %d is %q, want %d: the batch's order was lost", i, m.Body, i)
		}
	}
}

// Sends of many goroutines at once share socket writes: those made while
// others publish leave together (without it, one write each). Every send
// is confirmed.
func TestConcurrentSendsShareWrites(t *testing.T) {
	url := testenv.RabbitMQ(t)
	adm := newAdmin(t, url)
	queue := transporttest.Name("send-shared-writes")
	adm.declareQueue(t, queue)
	tr := open(t, url, adm)
	ctx := testContext(t, 60*time.Second)
	env := func() *bus.Envelope {
		return &bus.Envelope{Name: "send.msg", ContentType: "application/json", Body: []byte("{}"),
			Attributes: bus.NewAttributes(transporttest.Name("id"), "c", time.Now().UTC().Truncate(time.Millisecond), nil, nil)}
	}
	if err := tr.Send(ctx, env(), queue); err != nil { // connects
		t.Fatal(err)
	}
	const senders, each = 256, 20
	n := writesDuring(ctx, t, tr, func() {
		var wg sync.WaitGroup
		for range senders {
			wg.Go(func() {
				for range each {
					if err := tr.Send(ctx, env(), queue); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
	})
	if per := float64(n) / (senders * each); per > 0.75 {
		t.Errorf("%.2f socket writes per send from %d goroutines, want well under 1 (0.27-0.37 measured)", per, senders)
	}
	if n := adm.depth(t, queue); n != senders*each+1 {
		t.Errorf("queue holds %d messages, want %d", n, senders*each+1)
	}
}

// writesDuring returns how many writes tr's connection made to its socket
// while f ran.
func writesDuring(ctx context.Context, t *testing.T, tr *rabbitmq.Transport, f func()) int {
	t.Helper()
	before, err := tr.ConnectionWrites(ctx)
	if err != nil {
		t.Fatal(err)
	}
	f()
	after, err := tr.ConnectionWrites(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return after - before
}
