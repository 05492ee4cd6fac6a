package rabbitmq

import (
	"context"
	"math/bits"
	"time"

	"github.com/plugbus/plugbus/bus"
)

// EmitAfter exposes emitAfter, the delayed send and publish that
// scheduling builds on, to the package's black-box tests.
func (t *Transport) EmitAfter(ctx context.Context, env *bus.Envelope, destination string, delay time.Duration) error {
	return t.emitAfter(ctx, env, destination, delay)
}

// DelayHops returns how many delay queues a message delayed by delay
// waits in: one per set bit of its units.
func DelayHops(delay time.Duration) int {
	units := uint64((delay + delayClockMargin + delayUnit - 1) / delayUnit)
	return bits.OnesCount64(units)
}

// ConnectionWrites returns how many writes the current connection made
// to its socket.
func (t *Transport) ConnectionWrites(ctx context.Context) (int, error) {
	s, err := t.session(ctx, func() string { return "counting writes" })
	if err != nil {
		return 0, err
	}
	s.wire.mu.Lock()
	defer s.wire.mu.Unlock()
	return s.wire.writes, nil
}

// ReconnectBackoff returns the back-off between connection attempts
// (WithBackoff).
func (t *Transport) ReconnectBackoff() bus.Backoff { return t.o.backoff }
