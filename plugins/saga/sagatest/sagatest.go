// Package sagatest unit-tests a saga of plugins/saga with no bus and no
// database: a [Harness] delivers messages to the saga's handlers, records
// what they send, and keeps the timeouts they request on a fake clock that
// the test moves with [Harness.Advance].
//
//	h := sagatest.New(orders, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
//	if err := h.Deliver(OrderPlaced{OrderID: "o-1"}); err != nil { ... }
//	if err := h.Advance(31 * time.Minute); err != nil { ... } // fires PaymentOverdue
//	if h.Running("o-1") { ... }
package sagatest

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugins/saga"
)

// Harness drives one saga in memory. It is safe for concurrent use.
type Harness[S any] struct {
	sim *saga.Simulator[S]

	mu      sync.Mutex
	now     time.Time
	seq     int
	pending []Timeout
	sent    []saga.Effect
}

// Timeout is a timeout requested and not yet delivered.
type Timeout struct {
	Due     time.Time
	Message bus.Message
	Key     string // the instance's correlation value
	attrs   bus.Attributes
	seq     int
}

// New returns a harness of s whose clock starts at start. Logs are
// discarded.
func New[S any](s *saga.Saga[S], start time.Time) *Harness[S] {
	h := &Harness[S]{now: start}
	h.sim = s.Simulator(h.Now, slog.New(slog.NewTextHandler(io.Discard, nil)))
	return h
}

// Now returns the harness's clock, which handlers read with Context.Now.
func (h *Harness[S]) Now() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.now
}

// DeliverOption sets an attribute of a delivered message.
type DeliverOption func(map[string]string)

// WithAttribute gives the delivered message the attribute key (for
// saga.ByAttribute).
func WithAttribute(key, value string) DeliverOption {
	return func(m map[string]string) { m[key] = value }
}

// Deliver hands m to the saga's handler for its type and records what the
// handler sent and the timeouts it requested. It returns the handler's
// error (or the saga's: an undeclared message, a missing instance declared
// with WhenMissing(DeadLetter)); a failed handler changes nothing.
func (h *Harness[S]) Deliver(m bus.Message, opts ...DeliverOption) error {
	if err := bus.ValidateSend(bus.KindSend, m); err != nil {
		return err // what a bus's Send of m would have refused never arrives
	}
	values := map[string]string{}
	for _, o := range opts {
		if o != nil {
			o(values)
		}
	}
	return h.deliver(m, bus.NewAttributes("sagatest-"+m.MessageName(), "", h.Now(), values, nil))
}

func (h *Harness[S]) deliver(m bus.Message, a bus.Attributes) error {
	done, err := h.sim.Deliver(context.Background(), m, a)
	if err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, e := range done {
		if e.Kind != saga.EffectTimeout {
			h.sent = append(h.sent, e)
			continue
		}
		key, _ := e.Attributes.Value(saga.AttrKey)
		h.seq++
		h.pending = append(h.pending, Timeout{Due: h.now.Add(e.Delay), Message: e.Message, Key: key, attrs: e.Attributes, seq: h.seq})
	}
	return nil
}

// Advance moves the clock forward by d, delivering each timeout that falls
// due on the way, in due order, with the clock at its due time. It stops
// at the first handler error and returns it, the clock left at that
// timeout's due time: the timeout stays pending, as a bus would retry it,
// and the next Advance delivers it again (unless the error is permanent,
// bus.Permanent: a bus dead-letters that one).
func (h *Harness[S]) Advance(d time.Duration) error {
	h.mu.Lock()
	end := h.now.Add(d)
	h.mu.Unlock()
	for {
		h.mu.Lock()
		i := -1
		for j, t := range h.pending {
			if !t.Due.After(end) && (i < 0 || t.Due.Before(h.pending[i].Due) || t.Due.Equal(h.pending[i].Due) && t.seq < h.pending[i].seq) {
				i = j
			}
		}
		if i < 0 {
			h.now = end
			h.mu.Unlock()
			return nil
		}
		t := h.pending[i]
		h.pending = slices.Delete(h.pending, i, i+1)
		if t.Due.After(h.now) {
			h.now = t.Due
		}
		h.mu.Unlock()
		if err := h.deliver(t.Message, t.attrs); err != nil {
			if !bus.IsPermanent(err) { // a permanent failure is dead-lettered by a bus
				h.mu.Lock()
				h.pending = append(h.pending, t) // its seq keeps its place among timeouts due at once
				h.mu.Unlock()
			}
			return err
		}
	}
}

// Timeouts returns the timeouts requested and not yet delivered, in due order.
func (h *Harness[S]) Timeouts() []Timeout {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := slices.Clone(h.pending)
	slices.SortStableFunc(out, func(a, b Timeout) int { return a.Due.Compare(b.Due) })
	return out
}

// Sent returns what the handlers sent and published so far, in order.
func (h *Harness[S]) Sent() []saga.Effect {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.sent)
}

// Messages returns the messages the handlers sent and published so far.
func (h *Harness[S]) Messages() []bus.Message {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]bus.Message, len(h.sent))
	for i, e := range h.sent {
		out[i] = e.Message
	}
	return out
}

// State returns the state of the instance key and whether it exists
// (running, or completed and kept by saga.WithRetention).
func (h *Harness[S]) State(key string) (S, bool) {
	s, ok, _, _ := h.sim.State(key)
	return s, ok
}

// Running reports whether the instance key exists and has not completed.
func (h *Harness[S]) Running(key string) bool {
	_, ok, completed, _ := h.sim.State(key)
	return ok && !completed
}
