package bus_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
)

// batchingTransport is a recording transport that takes batches: it
// records the size of each batch, refuses the messages whose body
// contains "refuse" and sends the others one by one through the
// recording transport.
type batchingTransport struct {
	*bustest.Transport
	mu      sync.Mutex
	batches []int
}

var errRefusedByBroker = errors.New("refused by the broker")

func (t *batchingTransport) SendBatch(ctx context.Context, batch []bus.Outbound) error {
	t.mu.Lock()
	t.batches = append(t.batches, len(batch))
	t.mu.Unlock()
	be := &bus.BatchError{Len: len(batch)}
	for i, m := range batch {
		err := errRefusedByBroker
		switch {
		case strings.Contains(string(m.Envelope.Body), "refuse"):
		case m.Kind == bus.KindPublish:
			err = t.Publish(ctx, m.Envelope)
		default:
			err = t.Send(ctx, m.Envelope, m.Destination)
		}
		if err != nil {
			be.Failures = append(be.Failures, bus.BatchFailure{Index: i, Err: err})
		}
	}
	if be.Failures != nil {
		return be
	}
	return nil
}

func (t *batchingTransport) batchSizes() []int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]int(nil), t.batches...)
}

func newBatchingEnv(t *testing.T, opts ...bus.Option) (*env, *batchingTransport) {
	var bt *batchingTransport
	e := newEnvOver(t, nil, func(r *bustest.Transport) bus.Transport {
		bt = &batchingTransport{Transport: r}
		return bt
	}, opts...)
	return e, bt
}

// SendBatch runs each message through the outgoing stage and hands the
// transport one batch; the failures name the indexes in the caller's
// slice, whether the stage refused a message or the broker did, and
// every other message was sent (one dropped by middleware counts as
// sent, as for Send).
func TestSendBatchReportsFailuresByIndex(t *testing.T) {
	rejected := errors.New("rejected by middleware")
	e, bt := newBatchingEnv(t, bus.WithMiddleware(bus.Middleware{
		Name: "stamp",
		Outgoing: func(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
			switch out.Message().(chargeCard).OrderID {
			case "drop":
				return nil
			case "reject":
				return rejected
			}
			out.SetValue("stamped", "yes")
			return next.Call(ctx)
		},
	}))
	msgs := []bus.Message{chargeCard{"drop"}, chargeCard{"1"}, chargeCard{"reject"}, chargeCard{"refuse"}, chargeCard{"2"}}
	err := e.bus.SendBatch(t.Context(), msgs, bus.To("billing"))
	var be *bus.BatchError
	if !errors.As(err, &be) || !errors.Is(err, bus.ErrBatchIncomplete) {
		t.Fatalf("SendBatch = %v, want a *bus.BatchError", err)
	}
	if be.Len != 5 || len(be.Failures) != 2 || be.Failures[0].Index != 2 || be.Failures[1].Index != 3 {
		t.Fatalf("failures %+v of %d, want indexes 2 and 3 of 5", be.Failures, be.Len)
	}
	if !errors.Is(be.Failures[0].Err, rejected) || !errors.Is(be.Failures[1].Err, errRefusedByBroker) {
		t.Errorf("failure errors %v, %v", be.Failures[0].Err, be.Failures[1].Err)
	}
	if !be.Failed(2) || be.Failed(1) || !errors.Is(err, errRefusedByBroker) {
		t.Errorf("Failed(2) %v Failed(1) %v, errors.Is(broker) %v", be.Failed(2), be.Failed(1), errors.Is(err, errRefusedByBroker))
	}
	if got := bt.batchSizes(); len(got) != 1 || got[0] != 3 {
		t.Errorf("batches of %v, want one of the 3 messages the stage passed", got)
	}
	if got := e.chargesSentTo("billing"); strings.Join(got, ",") != "1,2" {
		t.Errorf("sent %v, want 1,2", got)
	}
	for _, s := range e.rec.Sent() {
		if v, _ := s.Envelope.Attributes.Value("stamped"); v != "yes" {
			t.Errorf("message %s sent without the outgoing stage's attribute", s.Envelope.Attributes.MessageID)
		}
	}
}

// A transport without bus.Batcher gets the batch one message at a time;
// a failure does not stop the rest.
func TestSendBatchWithoutBatcherSendsOneByOne(t *testing.T) {
	e := newEnv(t, nil, bus.WithRoute("billing", chargeCard{}))
	err := e.bus.SendBatch(t.Context(), []bus.Message{chargeCard{"1"}, orderShipped{"no route"}, chargeCard{"2"}})
	var be *bus.BatchError
	if !errors.As(err, &be) || len(be.Failures) != 1 || be.Failures[0].Index != 1 || !errors.Is(err, bus.ErrNoRoute) {
		t.Fatalf("SendBatch without a route for index 1 = %v", err)
	}
	if got := e.chargesSentTo("billing"); strings.Join(got, ",") != "1,2" {
		t.Errorf("sent %v, want 1,2", got)
	}
}

// PublishBatch publishes each message; a closed bus refuses a batch.
func TestPublishBatchPublishesEach(t *testing.T) {
	got := make(chan string, 3)
	e, bt := newBatchingEnv(t, bus.WithConcurrency(1),
		bus.WithHandler(func(ctx context.Context, m orderShipped, _ bus.Attributes) error { got <- m.OrderID; return nil }))
	if err := e.bus.PublishBatch(t.Context(), []bus.Message{orderShipped{"a"}, orderShipped{"b"}, orderShipped{"c"}}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"a", "b", "c"} {
		if id := await(t, got); id != want {
			t.Fatalf("handled %s, want %s", id, want)
		}
	}
	if sizes := bt.batchSizes(); len(sizes) != 1 || sizes[0] != 3 {
		t.Errorf("batches %v, want one of 3", sizes)
	}
	e.stop()
	if err := e.bus.PublishBatch(t.Context(), []bus.Message{orderShipped{"d"}}); !errors.Is(err, bus.ErrClosed) {
		t.Errorf("PublishBatch on a stopped bus = %v, want bus.ErrClosed", err)
	}
}

// One message id for several messages would make them one message to
// an inbox: a batch refuses it.
func TestSendBatchRefusesOneMessageIDForMany(t *testing.T) {
	e := newEnv(t, nil)
	err := e.bus.SendBatch(t.Context(), []bus.Message{chargeCard{"1"}, chargeCard{"2"}}, bus.To("billing"), bus.WithMessageID("same"))
	if err == nil || !strings.Contains(err.Error(), "WithMessageID") {
		t.Fatalf("SendBatch with one id for two = %v, want a refusal naming WithMessageID", err)
	}
	if got := e.chargesSentTo("billing"); len(got) != 0 {
		t.Errorf("sent %v", got)
	}
}

// A handler's sends, one by one or as a batch, are flushed as one batch
// when it succeeds, and not at all when it fails.
func TestHandlerFlushIsOneBatch(t *testing.T) {
	fail := make(chan bool, 2)
	e, bt := newBatchingEnv(t,
		bus.WithHandler(func(ctx context.Context, m orderPlaced, _ bus.Attributes) error {
			b := handlingBus(ctx)
			for i := range 4 {
				if err := b.Send(ctx, chargeCard{m.ID + "-" + string(rune('a'+i))}, bus.To("billing")); err != nil {
					return err
				}
			}
			msgs := []bus.Message{chargeCard{m.ID + "-e"}, chargeCard{m.ID + "-f"}}
			if err := b.SendBatch(ctx, msgs, bus.To("billing")); err != nil {
				return err
			}
			if <-fail {
				return errors.New("handler failed")
			}
			return nil
		}))
	fail <- true
	fail <- false
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "o"}); err != nil {
		t.Fatal(err)
	}
	e.expect(bustest.Returned)
	e.expect(bustest.Deleted)
	if got := e.chargesSentTo("billing"); strings.Join(got, ",") != "o-a,o-b,o-c,o-d,o-e,o-f" {
		t.Errorf("sent %v, want the six of the attempt that succeeded, in order", got)
	}
	// The two attempts' flushes: the failed one sends nothing.
	if sizes := bt.batchSizes(); len(sizes) != 1 || sizes[0] != 6 {
		t.Errorf("batches %v, want one flush of 6", sizes)
	}
}

// A flush with a message the broker refuses fails the handler, so that
// the message is retried; the error names the message.
func TestHandlerFlushFailureFailsTheHandler(t *testing.T) {
	e, _ := newBatchingEnv(t,
		bus.WithHandler(func(ctx context.Context, m orderPlaced, _ bus.Attributes) error {
			return handlingBus(ctx).SendBatch(ctx, []bus.Message{chargeCard{"ok"}, chargeCard{"refuse"}}, bus.To("billing"))
		}))
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "o"}); err != nil {
		t.Fatal(err)
	}
	s := e.expect(bustest.Returned)
	if !errors.Is(s.Cause, errRefusedByBroker) || !strings.Contains(s.Cause.Error(), "message 2 of 2 (shop.charge_card)") {
		t.Errorf("cause %v, want the broker's refusal naming message 2 of 2", s.Cause)
	}
}

// A delayed batch carries the due time on each envelope, and the
// transport's delay path delivers it no earlier.
func TestSendBatchKeepsDueTimes(t *testing.T) {
	got := make(chan time.Time, 2)
	e, _ := newBatchingEnv(t,
		bus.WithHandler(func(ctx context.Context, m chargeCard, _ bus.Attributes) error { got <- time.Now(); return nil }))
	due := time.Now().Add(30 * time.Millisecond)
	if err := e.bus.SendBatch(t.Context(), []bus.Message{chargeCard{"1"}, chargeCard{"2"}}, bus.To("ep"), bus.At(due)); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if at := await(t, got); at.Before(due) {
			t.Errorf("delivered %v before it was due", due.Sub(at))
		}
	}
	sent := 0
	for _, s := range e.rec.Sent() {
		if s.Envelope.Name == (chargeCard{}).MessageName() {
			sent++
			if !s.Envelope.Due.Equal(due) {
				t.Errorf("envelope due %v, want %v", s.Envelope.Due, due)
			}
		}
	}
	if sent != 2 {
		t.Errorf("the transport recorded %d envelopes of the batch, want 2", sent)
	}
}
