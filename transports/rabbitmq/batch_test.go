package rabbitmq_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
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

// A message whose id, correlation id or content type is longer than an
// AMQP short string (255 bytes) fails alone, before it is sent: amqp091
// would write its publish method, fail on its content header and close
// the connection, and every message in flight on it would be published
// again.
func TestBatchWithAnOverlongPropertyKeepsConnection(t *testing.T) {
	url := testenv.RabbitMQ(t)
	adm := newAdmin(t, url)
	queue := transporttest.Name("batch-overlong")
	adm.declareQueue(t, queue)
	var logs testenv.LogBuffer
	tr := open(t, url, adm, rabbitmq.WithLogger(textLogger(&logs)))
	ctx := testContext(t, 30*time.Second)
	long := strings.Repeat("x", 256)
	var batch []bus.Outbound
	for i := range 7 {
		id, corr := transporttest.Name("id"), "c"
		env := &bus.Envelope{Name: "batch.msg", ContentType: "application/json", Body: []byte(strconv.Itoa(i))}
		switch i {
		case 1:
			id = long
		case 3:
			corr = long
		case 5:
			env.ContentType = long
		}
		env.Attributes = bus.NewAttributes(id, corr, time.Now().UTC().Truncate(time.Millisecond), nil, nil)
		batch = append(batch, bus.Outbound{Kind: bus.KindSend, Envelope: env, Destination: queue})
	}
	err := tr.SendBatch(ctx, batch)
	var be *bus.BatchError
	if !errors.As(err, &be) || len(be.Failures) != 3 {
		t.Fatalf("SendBatch = %v, want a *bus.BatchError with 3 failures", err)
	}
	for i, want := range []int{1, 3, 5} {
		if f := be.Failures[i]; f.Index != want || !strings.Contains(f.Err.Error(), "255") {
			t.Errorf("failure %d: index %d %v, want index %d, naming the 255-byte limit", i, f.Index, f.Err, want)
		}
	}
	if err := tr.Send(ctx, batch[1].Envelope, queue); err == nil || !strings.Contains(err.Error(), "255") {
		t.Errorf("Send of an overlong message id = %v, want an error naming the 255-byte limit", err)
	}
	if err := tr.Send(ctx, batch[0].Envelope, queue); err != nil { // its frames follow the refused one's
		t.Fatalf("Send after the refused one: %v", err)
	}
	if n := reconnections(&logs); n != 0 {
		t.Errorf("the connection was lost %d times; logs:\n%s", n, logs.String())
	}
	var bodies string
	for _, m := range adm.get(t, queue, 10) {
		bodies += string(m.Body)
	}
	if bodies != "02460" {
		t.Errorf("queue holds %q, want 02460 (each message once, the refused ones never)", bodies)
	}
}

// Returns of a batch's unroutable messages reach their messages, and
// nothing stalls, when the broker confirms the batch's first message after
// over a thousand returns of the messages behind it (here, a large
// persistent message the queue writes to disk first): amqp091 hands each
// return over on a channel of 1,024 and, after waiting 5 s for room,
// drops it, while the batch awaited its first confirmation before it read
// any return. Each dropped return was a message reported confirmed, and
// the connection read nothing else meanwhile.
func TestBatchReturnsBehindASlowConfirmation(t *testing.T) {
	url := testenv.RabbitMQ(t)
	adm := newAdmin(t, url)
	queue := transporttest.Name("batch-slow-first")
	adm.declareQueue(t, queue)
	tr := open(t, url, adm, rabbitmq.WithPublisherChannels(1))
	ctx := testContext(t, 20*time.Second)
	if err := tr.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	const unroutable = 1100
	nowhere := transporttest.Name("nowhere")
	var batch []bus.Outbound
	for i := range 1 + unroutable {
		env := &bus.Envelope{Name: "batch.msg", ContentType: "application/json", Body: []byte(strconv.Itoa(i)),
			Attributes: bus.NewAttributes(transporttest.Name("id"), "c", time.Now().UTC().Truncate(time.Millisecond), nil, nil)}
		dest := nowhere
		if i == 0 {
			env.Body, dest = make([]byte, 8<<20), queue
		}
		batch = append(batch, bus.Outbound{Kind: bus.KindSend, Envelope: env, Destination: dest})
	}
	err := tr.SendBatch(ctx, batch)
	var be *bus.BatchError
	if !errors.As(err, &be) {
		t.Fatalf("SendBatch = %v, want a *bus.BatchError", err)
	}
	failed := map[int]error{}
	for _, f := range be.Failures {
		failed[f.Index] = f.Err
	}
	if err := failed[0]; err != nil {
		t.Errorf("the routed message failed: %v", err)
	}
	var missed, other int
	for i := 1; i <= unroutable; i++ {
		var ue *rabbitmq.UnroutableError
		switch err := failed[i]; {
		case err == nil:
			missed++
		case !errors.As(err, &ue):
			if other++; other == 1 {
				t.Errorf("message %d: %v, want an *rabbitmq.UnroutableError", i, err)
			}
		}
	}
	if missed > 0 || other > 0 {
		t.Errorf("of %d unroutable messages, %d reported confirmed and %d failed otherwise", unroutable, missed, other)
	}
	if n := adm.depth(t, queue); n != 1 {
		t.Errorf("queue holds %d messages, want 1", n)
	}
}
