package rabbitmq

import (
	"context"
	"time"

	"github.com/plugbus/plugbus/bus"
)

// EmitAfter exposes emitAfter, the delayed send and publish that
// scheduling builds on, to the package's black-box tests.
func (t *Transport) EmitAfter(ctx context.Context, env *bus.Envelope, destination string, delay time.Duration) error {
	return t.emitAfter(ctx, env, destination, delay)
}
