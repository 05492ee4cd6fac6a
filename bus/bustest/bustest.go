// Package bustest helps test plugbus code.
//
// A middleware is a plain function: test it with no bus. [Incoming],
// [Handling] and [Outgoing] make the stage contexts it is given, and
// [RecordNext] a next that records how it was called:
//
//	in := bustest.Incoming(bustest.Delivery(OrderPlaced{ID: "o-1"}, bus.Attributes{}.WithSticky("tenant", "acme")))
//	rec := bustest.RecordNext(nil)
//	if err := tenancy.Incoming(ctx, in, rec.IncomingNext()); err != nil || rec.Calls() != 1 {
//		t.Fatalf("tenancy: %v, next called %d times", err, rec.Calls())
//	}
//	// rec.Ctx() is the context the middleware passed on
//
// An application's test runs a bus with [Start] on a [Transport] that
// records what the bus sent and how it settled each message it received,
// and waits with [Transport.WaitIdle] until the bus has nothing left to
// do, so that what must not have happened can be checked without a sleep:
//
//	tr := bustest.NewTransport()
//	b := bustest.Start(t, bus.WithEndpoint("orders"), bus.WithTransport(tr), bus.WithHandler(placeOrder))
//	if err := b.Send(ctx, PlaceOrder{ID: "o-1"}); err != nil {
//		t.Fatal(err)
//	}
//	if err := tr.WaitIdle(ctx); err != nil {
//		t.Fatal(err)
//	}
//	// tr.Sent() holds what placeOrder sent, tr.Settled() how each message was settled
package bustest

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
)

// NextRecorder records the calls of the nexts it makes. Pass what its
// IncomingNext, HandlingNext or OutgoingNext method returns as the next of
// a stage function, a new one for each invocation: like a bus's, each
// runs once, and a second call returns a [*bus.NextMisuseError] that the
// recorder does not count.
type NextRecorder struct {
	mu    sync.Mutex
	err   error
	calls int
	ctx   context.Context
	fn    func(ctx context.Context) error
}

// RecordNext returns a recorder whose nexts return err, as the rest of
// the chain would.
func RecordNext(err error) *NextRecorder { return &NextRecorder{err: err} }

// RecordNextFunc returns a recorder whose nexts call fn, to play the rest
// of the chain (for example to check what the middleware put in ctx).
func RecordNextFunc(fn func(ctx context.Context) error) *NextRecorder {
	return &NextRecorder{fn: fn}
}

// IncomingNext returns a new next for an incoming stage, recorded by r.
func (r *NextRecorder) IncomingNext() *bus.IncomingNext { return bus.NewIncomingNext(r.record) }

// HandlingNext returns a new next for a handler stage, recorded by r.
func (r *NextRecorder) HandlingNext() *bus.HandlingNext { return bus.NewHandlingNext(r.record) }

// OutgoingNext returns a new next for an outgoing stage, recorded by r.
func (r *NextRecorder) OutgoingNext() *bus.OutgoingNext { return bus.NewOutgoingNext(r.record) }

// record records the call and returns the recorder's error, or what its
// function returns.
func (r *NextRecorder) record(ctx context.Context) error {
	r.mu.Lock()
	r.calls++
	r.ctx = ctx
	fn, err := r.fn, r.err
	r.mu.Unlock()
	if fn != nil {
		return fn(ctx)
	}
	return err
}

// Called reports whether the next was called.
func (r *NextRecorder) Called() bool { return r.Calls() > 0 }

// Calls returns how many times the next was called.
func (r *NextRecorder) Calls() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

// Ctx returns the context of the last call of the next, or nil.
func (r *NextRecorder) Ctx() context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ctx
}

// Delivery returns a received message carrying msg encoded as JSON, with
// attrs (a message id and correlation id are made up when empty), attempt 1.
func Delivery(msg bus.Message, attrs bus.Attributes) *bus.Delivery {
	body, err := json.Marshal(msg)
	if err != nil {
		panic("bustest: encoding " + msg.MessageName() + ": " + err.Error())
	}
	if attrs.MessageID == "" {
		attrs.MessageID = "bustest-message"
	}
	if attrs.CorrelationID == "" {
		attrs.CorrelationID = attrs.MessageID
	}
	if attrs.SentAt.IsZero() {
		attrs.SentAt = time.Now().UTC()
	}
	return &bus.Delivery{Envelope: bus.Envelope{Name: msg.MessageName(), ContentType: "application/json", Body: body, Attributes: attrs}, Attempt: 1}
}

// Incoming returns an incoming stage context for d, as given to a
// middleware named "test" on endpoint "test".
func Incoming(d *bus.Delivery) *bus.Incoming {
	return bus.NewIncoming(d, bus.StageInfo{Middleware: "test", Endpoint: "test"})
}

// Handling returns a handler stage context for the handler named handler
// about to handle msg.
func Handling(handler string, msg bus.Message, attrs bus.Attributes) *bus.Handling {
	return bus.NewHandling(handler, msg, Delivery(msg, attrs), bus.StageInfo{Middleware: "test", Endpoint: "test"})
}

// Outgoing returns an outgoing stage context for msg being sent (kind
// bus.KindSend, to endpoint "test") or published.
func Outgoing(kind bus.Kind, msg bus.Message, attrs bus.Attributes) *bus.Outgoing {
	dest := ""
	if kind == bus.KindSend {
		dest = "test"
	}
	return bus.NewOutgoing(bus.OutgoingMessage{Kind: kind, Message: msg, Destination: dest, Attributes: attrs}, bus.StageInfo{Middleware: "test"})
}

// Start builds a bus from opts, starts it and stops it when the test ends,
// failing the test on any error.
func Start(t testing.TB, opts ...bus.Option) *bus.Bus {
	t.Helper()
	b, err := bus.New(opts...)
	if err != nil {
		t.Fatalf("bus.New: %v", err)
	}
	if err := b.Start(context.Background()); err != nil {
		t.Fatalf("bus.Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := b.Stop(ctx); err != nil {
			t.Errorf("bus.Stop: %v", err)
		}
	})
	return b
}
