package bus_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type orderPlaced struct {
	ID    string `json:"id"`
	Total int    `json:"total"`
}

func (orderPlaced) MessageName() string { return "shop.order_placed" }

type chargeCard struct {
	OrderID string `json:"order_id"`
}

func (chargeCard) MessageName() string { return "shop.charge_card" }

type orderShipped struct {
	OrderID string `json:"order_id"`
}

func (orderShipped) MessageName() string { return "shop.order_shipped" }

type unhandled struct{}

func (unhandled) MessageName() string { return "shop.unhandled" }

// settle is one Delete, Return or Fail the bus made.
type settle struct {
	op      string // delete, return, fail
	d       *bus.Delivery
	failure bus.Failure
	cause   error
}

// recorder wraps a real transport and reports how the bus settled each delivery.
type recorder struct {
	bus.Transport
	settled chan settle
}

func (r *recorder) Delete(ctx context.Context, d *bus.Delivery) error {
	err := r.Transport.Delete(ctx, d)
	r.settled <- settle{op: "delete", d: d}
	return err
}

func (r *recorder) Return(ctx context.Context, d *bus.Delivery, cause error) error {
	err := r.Transport.Return(ctx, d, cause)
	r.settled <- settle{op: "return", d: d, cause: cause}
	return err
}

func (r *recorder) Fail(ctx context.Context, d *bus.Delivery, f bus.Failure) error {
	err := r.Transport.Fail(ctx, d, f)
	r.settled <- settle{op: "fail", d: d, failure: f}
	return err
}

type env struct {
	t      *testing.T
	broker *memory.Broker
	rec    *recorder
	bus    *bus.Bus
	logs   *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// newEnv builds a bus on endpoint "ep" over a recording memory transport,
// with 3 attempts and concurrency 1, starts it and stops it at cleanup.
func newEnv(t *testing.T, broker *memory.Broker, opts ...bus.Option) *env {
	t.Helper()
	return newEnvOver(t, broker, func(r *recorder) bus.Transport { return r }, opts...)
}

// newEnvOver is newEnv with the recorder wrapped by wrap.
func newEnvOver(t *testing.T, broker *memory.Broker, wrap func(*recorder) bus.Transport, opts ...bus.Option) *env {
	t.Helper()
	if broker == nil {
		broker = memory.NewBroker()
	}
	e := &env{t: t, broker: broker, logs: &syncBuffer{}}
	e.rec = &recorder{Transport: memory.New(memory.WithBroker(broker)), settled: make(chan settle, 1000)}
	logger := slog.New(slog.NewJSONHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	base := []bus.Option{bus.WithEndpoint("ep"), bus.WithTransport(wrap(e.rec)), bus.WithMaxAttempts(3), bus.WithConcurrency(1), bus.WithLogger(logger)}
	b, err := bus.New(append(base, opts...)...)
	if err != nil {
		t.Fatalf("bus.New: %v", err)
	}
	e.bus = b
	if err := b.Start(t.Context()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := b.Stop(ctx); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	return e
}

// next returns the next settlement, failing the test after 10s.
func (e *env) next() settle {
	e.t.Helper()
	select {
	case s := <-e.rec.settled:
		return s
	case <-time.After(10 * time.Second):
		e.t.Fatal("no message settled within 10s")
	}
	return settle{}
}

func (e *env) expect(op string) settle {
	e.t.Helper()
	s := e.next()
	if s.op != op {
		e.t.Fatalf("message %s settled with %s (cause %v, failure %+v), want %s", s.d.Name, s.op, s.cause, s.failure, op)
	}
	return s
}

// recv waits for a value on ch.
func recv[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("nothing received within 10s")
	}
	var zero T
	return zero
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func e0() time.Time { return time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) }

// e0bus returns the bus handling the message of ctx.
func e0bus(ctx context.Context) *bus.Bus {
	b, _, ok := bus.MessageContext(ctx)
	if !ok {
		panic("not in a handler")
	}
	return b
}

// listener reads the chargeCard messages sent to endpoint "listener"
// straight from a memory transport.
type listener struct {
	broker *memory.Broker
	tr     bus.Transport
}

func newBrokerWithListener(t *testing.T) *listener {
	l := &listener{broker: memory.NewBroker()}
	l.tr = memory.New(memory.WithBroker(l.broker))
	if err := l.tr.Setup(t.Context(), bus.Topology{Endpoint: "listener", Handles: []string{"shop.charge_card"}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.tr.Close(context.Background()) })
	return l
}

func (l *listener) take(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	d, err := l.tr.Receive(ctx)
	if err != nil {
		t.Fatalf("listener: %v", err)
	}
	if err := l.tr.Delete(ctx, d); err != nil {
		t.Fatal(err)
	}
	var m chargeCard
	if err := (bus.JSON{}).Unmarshal(d.Body, &m); err != nil {
		t.Fatal(err)
	}
	return m.OrderID
}

func (l *listener) expectEmpty(t *testing.T) {
	t.Helper()
	if n := l.broker.Depth("listener"); n != 0 {
		t.Fatalf("listener has %d more messages", n)
	}
}
