package rabbitmq_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/testenv"
	"github.com/plugbus/plugbus/transports/rabbitmq"
	"github.com/plugbus/plugbus/transports/transporttest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	url := testenv.RabbitMQ(t)
	adm := newAdmin(t, url)
	exchange := transporttest.Name("plugbus-test")
	t.Cleanup(func() { adm.deleteExchange(t, exchange) })
	transporttest.Run(t, func(tb testing.TB) bus.Transport {
		return open(tb, url, adm, rabbitmq.WithExchange(exchange))
	}, transporttest.Features{
		Ordered:           true,
		ReservedHeader:    rabbitmq.HeaderAttempt,
		DeadLetters:       adm.deadLetters,
		DeadLetterManager: true,
		Messages:          2000,
		DurableDelays:     true,
		Batch:             true,
	})
}

type order struct {
	ID int `json:"id"`
}

func (order) MessageName() string { return "test.order" }

// env is a bus endpoint on its own exchange, deleted at cleanup.
type env struct {
	url, exchange, endpoint string
	adm                     *admin
}

func newEnv(t *testing.T) *env { return newEnvAt(t, testenv.RabbitMQ(t)) }

// newEnvAt is newEnv on the broker at url.
func newEnvAt(t *testing.T, url string) *env {
	e := &env{url: url, adm: newAdmin(t, url), exchange: transporttest.Name("plugbus-test"), endpoint: transporttest.Name("rmq-test")}
	t.Cleanup(func() { e.adm.deleteExchange(t, e.exchange) })
	return e
}

func (e *env) transport(t *testing.T, opts ...rabbitmq.Option) *rabbitmq.Transport {
	return open(t, e.url, e.adm, append([]rabbitmq.Option{rabbitmq.WithExchange(e.exchange)}, opts...)...)
}

// start starts a bus on e's endpoint and stops it at cleanup.
func (e *env) start(t *testing.T, opts ...bus.Option) *bus.Bus {
	t.Helper()
	b, err := bus.New(append([]bus.Option{bus.WithEndpoint(e.endpoint), bus.WithTransport(e.transport(t))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(testContext(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Stop(testContext(t, 30*time.Second)); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	return b
}

func TestHeaderArrivesNativelyAndAfterRetry(t *testing.T) {
	e := newEnv(t)
	type seen struct {
		attempt      int
		header, raw  any
		deliveryType string
	}
	var mu sync.Mutex
	var got []seen
	handled := make(chan struct{})
	b := e.start(t,
		bus.WithMaxAttempts(3),
		bus.WithMiddleware(bus.Middleware{
			Name: "tenant",
			Outgoing: func(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
				out.Headers()["x-tenant"] = "acme"
				return next.Call(ctx)
			},
			Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
				h, _ := in.Header("x-tenant")
				raw, ok := in.Raw().(*amqp.Delivery)
				if !ok {
					t.Errorf("Raw is %T, want amqp091.Delivery", in.Raw())
				}
				mu.Lock()
				got = append(got, seen{attempt: in.Attempt(), header: h, raw: raw.Headers["x-tenant"], deliveryType: raw.Type})
				mu.Unlock()
				return next.Call(ctx)
			},
		}),
		bus.WithHandler(func(_ context.Context, o order, _ bus.Attributes) error {
			mu.Lock()
			n := len(got)
			mu.Unlock()
			if n == 1 {
				return errors.New("first attempt fails")
			}
			close(handled)
			return nil
		}),
	)
	ctx := testContext(t, 30*time.Second)
	if err := b.Send(ctx, order{ID: 1}); err != nil {
		t.Fatalf("Send: %v", err)
	}
	select {
	case <-handled:
	case <-ctx.Done():
		t.Fatal("message not handled on its second attempt")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 {
		t.Fatalf("incoming ran %d times, want 2", len(got))
	}
	for i, s := range got {
		if s.attempt != i+1 || s.header != "acme" || s.raw != "acme" || s.deliveryType != "test.order" {
			t.Errorf("delivery %d: attempt %d, header %v, native header %v, type %q; want attempt %d with x-tenant=acme", i, s.attempt, s.header, s.raw, s.deliveryType, i+1)
		}
	}
}

func TestReservedHeaderRefusedThroughBus(t *testing.T) {
	e := newEnv(t)
	for _, name := range []string{rabbitmq.HeaderSentAt, "Plugbus-Anything", "CC"} {
		b, err := bus.New(bus.WithTransport(e.transport(t)), bus.WithMiddleware(bus.Middleware{
			Name: "bad",
			Outgoing: func(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
				out.Headers()[name] = "x"
				return next.Call(ctx)
			},
		}))
		if err != nil {
			t.Fatal(err)
		}
		err = b.Send(testContext(t, 10*time.Second), order{}, bus.To(e.endpoint))
		var hr *bus.HeaderReservedError
		if !errors.As(err, &hr) || hr.Header != name || hr.Transport != "rabbitmq" {
			t.Errorf("Send with header %q: %v, want *bus.HeaderReservedError", name, err)
		}
	}
}

func TestUnroutable(t *testing.T) {
	e := newEnv(t)
	tr := e.transport(t)
	ctx := testContext(t, 10*time.Second)
	msg := &bus.Envelope{Name: "test.nobody", Body: []byte(`{}`), Attributes: bus.NewAttributes("id-1", "c", time.Now(), nil, nil)}
	err := tr.Send(ctx, msg, transporttest.Name("no-such-endpoint"))
	var ue *rabbitmq.UnroutableError
	if !errors.As(err, &ue) || !errors.Is(err, rabbitmq.ErrUnroutable) || ue.Exchange != "" {
		t.Errorf("Send to a missing queue: %v, want *rabbitmq.UnroutableError", err)
	}
	err = tr.Publish(ctx, msg)
	if !errors.As(err, &ue) || ue.Exchange != e.exchange || ue.RoutingKey != "test.nobody" {
		t.Errorf("Publish without subscriber: %v, want *rabbitmq.UnroutableError", err)
	}
	// A routable message on the same channel right after still succeeds.
	lenient := e.transport(t, rabbitmq.WithUnroutablePublish())
	if err := lenient.Publish(ctx, msg); err != nil {
		t.Errorf("Publish with WithUnroutablePublish: %v", err)
	}
}

func TestForeignHeadersAreRead(t *testing.T) {
	e := newEnv(t)
	tr := e.transport(t)
	ctx := testContext(t, 30*time.Second)
	if err := tr.Setup(ctx, bus.Topology{Endpoint: e.endpoint, Handles: []string{"test.order"}, MaxAttempts: 3, Concurrency: 2}); err != nil {
		t.Fatal(err)
	}
	e.adm.publish(t, e.endpoint, amqp.Publishing{
		Type: "test.order", MessageId: "foreign-1", ContentType: "application/json", Body: []byte(`{"id":7}`),
		Headers: amqp.Table{
			"x-int": int32(42), "x-long": int64(-7), "x-float": 1.5, "x-bool": true, "x-bytes": []byte("raw"),
			"x-table": amqp.Table{"k": "v"},
			"x-death": []any{amqp.Table{"count": int64(1), "queue": "elsewhere", "reason": "rejected"}},
		},
	})
	d, err := tr.Receive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d.Err != nil {
		t.Fatalf("foreign message unreadable: %v", d.Err)
	}
	want := map[string]string{"x-int": "42", "x-long": "-7", "x-float": "1.5", "x-bool": "true", "x-bytes": "raw", "x-table": `{"k":"v"}`}
	for k, v := range want {
		if d.Headers[k] != v {
			t.Errorf("header %s = %q, want %q", k, d.Headers[k], v)
		}
	}
	if !strings.Contains(d.Headers["x-death"], `"queue":"elsewhere"`) {
		t.Errorf("x-death = %q", d.Headers["x-death"])
	}
	if d.Attributes.MessageID != "foreign-1" || d.Attempt != 1 || d.Name != "test.order" {
		t.Errorf("got id %q attempt %d name %q", d.Attributes.MessageID, d.Attempt, d.Name)
	}
	if err := tr.Delete(ctx, d); err != nil {
		t.Fatal(err)
	}
}

func TestPoisonMessagesAreDeadLettered(t *testing.T) {
	e := newEnv(t)
	handled := make(chan struct{}, 1)
	e.start(t, bus.WithHandler(func(_ context.Context, o order, _ bus.Attributes) error {
		handled <- struct{}{}
		return nil
	}))
	// A body the handler's type cannot be decoded from, and envelopes the
	// transport cannot read: an attribute that is not a string, no name.
	e.adm.publish(t, e.endpoint, amqp.Publishing{Type: "test.order", MessageId: "poison-body", ContentType: "application/json", Body: []byte(`{"id":"not a number"`)})
	e.adm.publish(t, e.endpoint, amqp.Publishing{Type: "test.order", MessageId: "poison-envelope", ContentType: "application/json", Body: []byte(`{"id":1}`),
		Headers: amqp.Table{rabbitmq.HeaderAttributePrefix + "tenant": int32(5)}})
	e.adm.publish(t, e.endpoint, amqp.Publishing{MessageId: "poison-nameless", Body: []byte(`{}`)})
	e.adm.publish(t, e.endpoint, amqp.Publishing{Type: "test.order", MessageId: "poison-content-type", ContentType: "text/plain", Body: []byte(`{"id":1}`)})
	dls := e.adm.deadLetters(testContext(t, 30*time.Second), t, e.endpoint, 4)
	if len(dls) != 4 {
		t.Fatalf("dead letters: %d, want 4", len(dls))
	}
	reasons := map[string]bus.Failure{}
	for _, dl := range dls {
		reasons[dl.Envelope.Attributes.MessageID] = dl.Failure
	}
	for id, want := range map[string]string{
		"poison-body":         "cannot be decoded into rabbitmq_test.order",
		"poison-envelope":     rabbitmq.HeaderAttributePrefix + "tenant holds an AMQP integer, want a string",
		"poison-nameless":     "type property",
		"poison-content-type": `content type "text/plain"`,
	} {
		f, ok := reasons[id]
		if !ok {
			t.Errorf("%s not dead-lettered", id)
			continue
		}
		if !strings.Contains(f.Reason, want) || f.Attempts != 1 || f.Endpoint != e.endpoint || f.Time.IsZero() {
			t.Errorf("%s: failure %+v, want a reason containing %q, attempts 1, endpoint %s", id, f, want, e.endpoint)
		}
	}
	select {
	case <-handled:
		t.Error("a poison message reached the handler")
	default:
	}
}

func TestSendWaitsForBroker(t *testing.T) {
	// New does not connect; a send to an unreachable broker returns the
	// context's error with the connection failure, and Close ends the retries.
	tr, err := rabbitmq.New("amqp://guest:guest@127.0.0.1:1/", rabbitmq.WithBackoff(bus.Backoff{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err = tr.Send(ctx, &bus.Envelope{Name: "x"}, "y")
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("Send without broker: %v, want a deadline error naming the connection failure", err)
	}
	if err := tr.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := tr.Send(context.Background(), &bus.Envelope{Name: "x"}, "y"); !errors.Is(err, bus.ErrClosed) {
		t.Errorf("Send after Close: %v, want bus.ErrClosed", err)
	}
	if _, err := rabbitmq.New("http://nope"); err == nil {
		t.Error("New accepted a non-AMQP URL")
	}
}
