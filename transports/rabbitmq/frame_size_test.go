package rabbitmq_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/testenv"
	"github.com/plugbus/plugbus/transports/rabbitmq"
)

// frameMax is the frame size the broker at url negotiates with a client
// that asks for none (RabbitMQ's frame_max, 131072 by default).
func frameMax(t *testing.T, url string) int {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.Config.FrameSize
}

// filling returns a header value that makes msg's content header frame
// (its properties and headers, under key) slack bytes short of a frame
// of frameMax bytes, the most a publisher may send.
func filling(msg amqp.Publishing, key string, frameMax, slack int) string {
	short := func(s string) int {
		if s == "" {
			return 0
		}
		return 1 + len(s)
	}
	// frame header and end (8), class, weight, body size, property flags (14)
	size := 8 + 14 + short(msg.ContentType) + short(msg.MessageId) + short(msg.Type)
	if msg.DeliveryMode > 0 {
		size++
	}
	size += 4 + 1 + len(key) + 1 + 4 // the table's length, the key, 'S' and the value's length
	return strings.Repeat("h", frameMax-slack-size)
}

// A header too large for an AMQP frame is refused before sending with an
// error that says so: sent, it makes the broker close the whole
// connection (FRAME_ERROR), and the transport, taking that for a lost
// connection, published it again and again until the context ended,
// cutting off every consumer and publisher of the connection each time.
func TestHeadersOverTheFrameSizeAreRefusedBeforeSending(t *testing.T) {
	e := newEnv(t)
	logs := &testenv.LogBuffer{}
	tr := e.transport(t, rabbitmq.WithLogger(textLogger(logs)))
	ctx := testContext(t, 30*time.Second)
	setUp(ctx, t, tr, e.endpoint, "test.order")
	big := message("test.order", "big-header")
	big.Headers = bus.Headers{"x-big": strings.Repeat("h", frameMax(t, e.url))}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err := tr.Send(sctx, big, e.endpoint)
	if !errors.Is(err, bus.ErrMessageTooLarge) || !errors.Is(err, rabbitmq.ErrHeadersTooLarge) || !strings.Contains(err.Error(), "x-big") {
		t.Errorf("Send of a header larger than a frame: %v, want an error matching bus.ErrMessageTooLarge and rabbitmq.ErrHeadersTooLarge naming the header", err)
	}
	bctx, bcancel := context.WithTimeout(ctx, 5*time.Second)
	defer bcancel()
	if err := tr.SendBatch(bctx, []bus.Outbound{{Kind: bus.KindSend, Destination: e.endpoint, Envelope: big}}); !errors.Is(err, rabbitmq.ErrHeadersTooLarge) {
		t.Errorf("SendBatch of a header larger than a frame: %v, want rabbitmq.ErrHeadersTooLarge", err)
	}
	if n := reconnections(logs); n != 0 {
		t.Errorf("the connection was lost %d times; logs:\n%s", n, logs)
	}
	sendTo(ctx, t, tr, e.endpoint, message("test.order", "after"))
	if d := receive(ctx, t, tr, 5*time.Second); d.Attributes.MessageID != "after" {
		t.Errorf("received %s, want the message sent after", d.Attributes.MessageID)
	} else if err := tr.Delete(ctx, d); err != nil {
		t.Fatal(err)
	}
}

// A message another producer published with headers that nearly fill a
// frame fits no copy the transport makes of it with headers of its own
// (a retry, a dead letter). Such copies made the broker close the
// connection, and the message, never settled, came back at the same
// attempt for ever. It is dead-lettered instead, with the failure, and
// the headers the dead letter cannot hold are named in its reason.
func TestForeignHeadersFillingTheFrameAreDeadLettered(t *testing.T) {
	e := newEnv(t)
	logs := &testenv.LogBuffer{}
	limit := frameMax(t, e.url)
	b, err := bus.New(bus.WithEndpoint(e.endpoint), bus.WithTransport(e.transport(t, rabbitmq.WithLogger(textLogger(logs)))),
		bus.WithMaxAttempts(3), bus.WithHandler(func(context.Context, order, bus.Attributes) error { return errors.New("always fails") }))
	if err != nil {
		t.Fatal(err)
	}
	ctx := testContext(t, 60*time.Second)
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop(context.Background()) })
	for _, msg := range []amqp.Publishing{
		{Type: "test.order", MessageId: "full-retried", ContentType: "application/json", Body: []byte(`{"id":1}`)}, // Return's copy
		{Type: "test.unhandled", MessageId: "full-unhandled", ContentType: "application/json", Body: []byte(`{}`)}, // Fail's copy
	} {
		msg.Headers = amqp.Table{"x-big": filling(msg, "x-big", limit, 16)}
		e.adm.publish(t, e.endpoint, msg)
	}
	dls := e.adm.deadLetters(testContext(t, 20*time.Second), t, e.endpoint, 2)
	if len(dls) != 2 {
		t.Fatalf("%d dead letters, want 2; connection lost %d times; logs:\n%.3000s", len(dls), reconnections(logs), logs)
	}
	for _, dl := range dls {
		f := dl.Failure
		if f.Endpoint != e.endpoint || !strings.Contains(f.Reason, "x-big") || !strings.Contains(f.Reason, "frame") {
			t.Errorf("%s: failure %+v, want a reason naming the header x-big and the frame size", dl.Envelope.Attributes.MessageID, f)
		}
	}
	if n := reconnections(logs); n != 0 {
		t.Errorf("the connection was lost %d times", n)
	}
}

// A delayed send whose headers fit a frame when sent but not with the
// x-death headers the delay queues add to it on the way is refused before
// sending, as a delayed retry's copy is made at once instead: delivered,
// its content header frame would exceed the consumer's frame size, and
// the client, closing the connection on it (frame too large), would get
// it again, unacknowledged, at every reconnection.
func TestDelayedSendWithHeadersFillingTheFrameIsRefused(t *testing.T) {
	e := newEnv(t)
	logs := &testenv.LogBuffer{}
	tr := e.transport(t, rabbitmq.WithLogger(textLogger(logs)))
	ctx := testContext(t, 30*time.Second)
	setUp(ctx, t, tr, e.endpoint, "test.order")
	env := message("test.order", "delayed-full")
	env.Headers = bus.Headers{"x-big": strings.Repeat("h", frameMax(t, e.url)-160)}
	env.Due = time.Now().Add(50 * time.Millisecond)
	err := tr.Send(ctx, env, e.endpoint)
	if err == nil {
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		d, rerr := tr.Receive(rctx)
		if rerr == nil {
			_ = tr.Delete(ctx, d)
		}
		t.Fatalf("delayed Send of headers filling a frame accepted; then Receive: %v; connection lost %d times", rerr, reconnections(logs))
	}
	if !errors.Is(err, rabbitmq.ErrHeadersTooLarge) {
		t.Fatalf("delayed Send of headers filling a frame: %v, want rabbitmq.ErrHeadersTooLarge", err)
	}
	if n := reconnections(logs); n != 0 {
		t.Errorf("the connection was lost %d times", n)
	}
}

// On a connection whose frame size the x-death headers of a long delay
// alone exceed (frame_max 4096, the least AMQP allows, and a delay
// through twenty delay queues), a delayed retry is returned at once, as
// one whose own headers leave no room for them is: computed as the frame
// size minus that room, the limit came out negative, which checkFrame
// reads as no limit at all, and the copy went into the delay queues, to
// close the consumer's connection when delivered, hours later.
func TestDelayedRetryOnASmallFrameIsReturnedAtOnce(t *testing.T) {
	e := newEnv(t)
	tr := e.transport(t, rabbitmq.WithConfig(amqp.Config{FrameSize: 4096}))
	ctx := testContext(t, 30*time.Second)
	setUp(ctx, t, tr, e.endpoint, "test.order")
	env := message("test.order", "small-frame")
	env.Headers = bus.Headers{"x-tenant": strings.Repeat("t", 2000)}
	sendTo(ctx, t, tr, e.endpoint, env)
	d := receive(ctx, t, tr, 5*time.Second)
	const delay = (1<<20-1)*10*time.Millisecond - time.Millisecond // twenty delay levels (a unit of 10 ms, a clock margin of 1 ms)
	if err := tr.ReturnAfter(ctx, d, errors.New("handler failed"), delay); err != nil {
		t.Fatalf("ReturnAfter: %v", err)
	}
	got := receive(ctx, t, tr, 5*time.Second)
	if got.Attributes.MessageID != "small-frame" || got.Attempt != 2 {
		t.Errorf("received %s at attempt %d, want small-frame at attempt 2", got.Attributes.MessageID, got.Attempt)
	}
	if err := tr.Delete(ctx, got); err != nil {
		t.Fatal(err)
	}
}
