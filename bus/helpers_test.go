package bus_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
	"github.com/plugbus/plugbus/internal/testenv"
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

// env is a started bus on endpoint "ep" over a recording memory
// transport, with 3 attempts, concurrency 1 and its logs kept as JSON.
type env struct {
	t      *testing.T
	broker *memory.Broker
	rec    *bustest.Transport
	bus    *bus.Bus
	logs   *testenv.LogBuffer
	read   int // how many settlements next returned
}

// newEnv starts an env on broker (nil: a broker of its own), stopped at
// cleanup.
func newEnv(t *testing.T, broker *memory.Broker, opts ...bus.Option) *env {
	t.Helper()
	return newEnvOver(t, broker, func(r *bustest.Transport) bus.Transport { return r }, opts...)
}

// newEnvOver is newEnv with the recording transport wrapped by wrap.
func newEnvOver(t *testing.T, broker *memory.Broker, wrap func(*bustest.Transport) bus.Transport, opts ...bus.Option) *env {
	t.Helper()
	if broker == nil {
		broker = memory.NewBroker()
	}
	e := &env{t: t, broker: broker, rec: bustest.NewTransport(memory.WithBroker(broker)), logs: &testenv.LogBuffer{}}
	logger := slog.New(slog.NewJSONHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	base := []bus.Option{bus.WithEndpoint("ep"), bus.WithTransport(wrap(e.rec)), bus.WithMaxAttempts(3), bus.WithConcurrency(1), bus.WithLogger(logger)}
	e.bus = startBus(t, append(base, opts...)...)
	return e
}

// next returns the next settlement of the env's bus, failing the test
// after 10s.
func (e *env) next() bustest.Settlement {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), 10*time.Second)
	defer cancel()
	settled, err := e.rec.WaitSettled(ctx, e.read+1)
	if err != nil {
		e.t.Fatalf("no message settled within 10s: %v", err)
	}
	e.read++
	return settled[e.read-1]
}

// expect returns the next settlement, failing the test unless its
// outcome is want.
func (e *env) expect(want bustest.Outcome) bustest.Settlement {
	e.t.Helper()
	s := e.next()
	if s.Outcome != want {
		e.t.Fatalf("message %s %s (cause %v, failure %+v), want %s", s.Envelope.Name, s.Outcome, s.Cause, s.Failure, want)
	}
	return s
}

// waitIdle waits until the env's bus has nothing left to do, failing the
// test after 10s.
func (e *env) waitIdle() {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), 10*time.Second)
	defer cancel()
	if err := e.rec.WaitIdle(ctx); err != nil {
		e.t.Fatal(err)
	}
}

// stop stops the env's bus, so that everything it does, and logs, is
// done.
func (e *env) stop() {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.bus.Stop(ctx); err != nil {
		e.t.Fatalf("Stop: %v", err)
	}
}

// chargesSentTo returns the order ids of the chargeCard messages the
// env's bus handed to its transport for dest, in order.
func (e *env) chargesSentTo(dest string) []string { return chargesSentTo(e.rec, dest) }

// chargesSentTo returns the order ids of the chargeCard messages handed
// to tr for dest, in order.
func chargesSentTo(tr *bustest.Transport, dest string) []string {
	var ids []string
	for _, s := range tr.Sent() {
		if s.Envelope.Name != (chargeCard{}).MessageName() || s.Destination != dest {
			continue
		}
		var m chargeCard
		if err := (bus.JSON{}).Unmarshal(s.Envelope.Body, &m); err != nil {
			m.OrderID = "undecodable: " + err.Error()
		}
		ids = append(ids, m.OrderID)
	}
	return ids
}

// destinations returns the destination of each message handed to tr, in
// order ("" for a published one).
func destinations(tr *bustest.Transport) []string {
	var dests []string
	for _, s := range tr.Sent() {
		dests = append(dests, s.Destination)
	}
	return dests
}

// await waits for a value on ch, failing the test after 10s.
func await[T any](t *testing.T, ch <-chan T) T {
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

// fixedTime is a sent-at time for envelopes built by hand.
func fixedTime() time.Time { return time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) }

// handlingBus returns the bus handling the message of ctx.
func handlingBus(ctx context.Context) *bus.Bus {
	b, _, ok := bus.MessageContext(ctx)
	if !ok {
		panic("not in a handler")
	}
	return b
}

// memoryOutbox is an Outbox that keeps what it is given.
type memoryOutbox []bus.Outbound

func (o *memoryOutbox) Add(_ context.Context, m bus.Outbound) error { *o = append(*o, m); return nil }

// startBus builds and starts a bus on t, stopped when the test ends.
func startBus(t *testing.T, opts ...bus.Option) *bus.Bus {
	t.Helper()
	b, err := bus.New(append([]bus.Option{bus.WithLogger(discard())}, opts...)...)
	if err != nil {
		t.Fatalf("bus.New: %v", err)
	}
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
	return b
}

// stopAtDeadline stops b with a context that ends before its handlers
// return, expecting Stop to report the deadline.
func stopAtDeadline(t *testing.T, b *bus.Bus) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := b.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop: %v, want its deadline", err)
	}
}
