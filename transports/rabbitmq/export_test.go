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
