// Package bustest helps test plugbus code: stage contexts and a recording
// next to unit-test a middleware as a plain function, with no bus, and a
// helper to run a bus for the length of a test.
//
//	in := bustest.Incoming(bustest.Delivery(OrderPlaced{ID: "o-1"}, bus.Attributes{MessageID: "m-1"}))
//	next := bustest.Next(nil)
//	err := tenancy.Incoming(ctx, in, next.Next)
//	// assert on err, next.Calls(), next.Ctx()
package bustest

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
)

// Recorder is a next function that records its calls. Pass its Next
// method as the next of a stage function.
type Recorder struct {
	mu    sync.Mutex
	err   error
	calls int
	ctx   context.Context
	fn    func(ctx context.Context) error
}

// Next returns a recorder whose Next returns err.
func Next(err error) *Recorder { return &Recorder{err: err} }

// NextFunc returns a recorder whose Next calls fn, to play the rest of the
// chain (for example to check what the middleware put in ctx).
func NextFunc(fn func(ctx context.Context) error) *Recorder { return &Recorder{fn: fn} }

// Next records the call and returns the recorder's error.
func (r *Recorder) Next(ctx context.Context) error {
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

// Called reports whether Next was called.
func (r *Recorder) Called() bool { return r.Calls() > 0 }

// Calls returns how many times Next was called.
func (r *Recorder) Calls() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

// Ctx returns the context of the last call to Next, or nil.
func (r *Recorder) Ctx() context.Context {
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
