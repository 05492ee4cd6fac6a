package memory

import (
	"context"

	"github.com/plugbus/plugbus/bus"
)

// ListDeadLetters implements bus.DeadLetterManager: the dead letters of
// f.Endpoint that f selects, oldest first. Their IDs are numbers the
// broker gives them in the order they were dead-lettered.
//
// Every method of bus.DeadLetterManager returns a *bus.UnknownEndpointError,
// naming the broker's endpoints ([Transport.Endpoints]), for an endpoint
// with neither a queue (made by Setup, or by a send to it) nor dead
// letters.
func (t *Transport) ListDeadLetters(ctx context.Context, f bus.DeadLetterFilter) ([]bus.DeadLetter, error) {
	return t.impl.ListDeadLetters(ctx, f)
}

// CountDeadLetters implements bus.DeadLetterManager.
func (t *Transport) CountDeadLetters(ctx context.Context, endpoint string) (int, error) {
	return t.impl.CountDeadLetters(ctx, endpoint)
}

// QueueDepth implements bus.DeadLetterManager: [Broker.Depth].
func (t *Transport) QueueDepth(ctx context.Context, endpoint string) (int, error) {
	return t.impl.QueueDepth(ctx, endpoint)
}

// Endpoints implements bus.EndpointLister: the endpoints of the broker
// with a queue or dead letters, sorted, instance queues left out.
func (t *Transport) Endpoints(ctx context.Context) ([]string, error) {
	return t.impl.Endpoints(ctx)
}

// ReplayDeadLetters implements bus.DeadLetterManager: it sends
// bus.ReplayEnvelope's copy of each dead letter f selects, then removes
// the dead letter. A destination without a queue (never set up, or the
// instance queue of a closed transport) is a *bus.UnknownEndpointError and
// leaves the dead letter: Send would make a queue that no bus reads, or
// drop the copy.
func (t *Transport) ReplayDeadLetters(ctx context.Context, f bus.DeadLetterFilter, r bus.Replay, done func(bus.DeadLetter)) (int, error) {
	return t.impl.ReplayDeadLetters(ctx, f, r, done)
}

// CheckDestination implements bus.DestinationChecker: a
// *bus.UnknownEndpointError for an endpoint without a queue, which
// ReplayDeadLetters refuses to replay to.
func (t *Transport) CheckDestination(ctx context.Context, to string) error {
	return t.impl.CheckDestination(ctx, to)
}

// DeleteDeadLetters implements bus.DeadLetterManager.
func (t *Transport) DeleteDeadLetters(ctx context.Context, f bus.DeadLetterFilter, done func(bus.DeadLetter)) (int, error) {
	return t.impl.DeleteDeadLetters(ctx, f, done)
}

// Delivered implements bus.DeliveryCounter: how many messages the broker
// delivered from endpoint's queue.
func (t *Transport) Delivered(ctx context.Context, endpoint string) (uint64, error) {
	return t.impl.Delivered(ctx, endpoint)
}
