package store

import (
	"context"
	"time"

	"github.com/plugbus/plugbus/bus"
)

// ParkedMessage is a row of the outbox the relay no longer dispatches: the
// transport refused it [WithDispatchAttempts] times, or it could not be
// decoded.
type ParkedMessage struct {
	ID          int64     // row id in the outbox table
	MessageID   string    // the message's id
	Kind        bus.Kind  // send or publish
	Destination string    // the endpoint of a send
	Name        string    // the message's name
	Attempts    int       // failed attempts
	LastError   string    // the last error
	CreatedAt   time.Time // when it was stored
	ParkedAt    time.Time // when it was parked
}

// Parked lists up to limit parked rows whose id is greater than after,
// oldest first (after 0 starts at the beginning; pass the last ID to page).
func (s *Store) Parked(ctx context.Context, after int64, limit int) ([]ParkedMessage, error) {
	rows, err := s.impl().Parked(ctx, after, limit)
	if err != nil {
		return nil, err
	}
	out := make([]ParkedMessage, len(rows))
	for i, r := range rows {
		out[i] = ParkedMessage(r)
	}
	return out, nil
}

// ParkedCount returns how many rows are parked.
func (s *Store) ParkedCount(ctx context.Context) (int64, error) { return s.impl().ParkedCount(ctx) }

// Requeue makes the parked rows ids pending again, with their attempt
// count reset: the relay dispatches them at its next round. Ids that are
// not parked are ignored. It returns how many rows it requeued. Fix the
// cause first (deploy the missing endpoint, shrink the message): a row
// that still fails is parked again after [WithDispatchAttempts] tries.
func (s *Store) Requeue(ctx context.Context, ids ...int64) (int64, error) {
	return s.impl().Requeue(ctx, ids...)
}

// Pending returns how many stored messages wait to be dispatched (parked
// rows not included: see [Store.ParkedCount]).
func (s *Store) Pending(ctx context.Context) (int64, error) { return s.impl().Pending(ctx) }

// PurgeDispatched deletes the messages dispatched before before, and
// returns how many it deleted. The outbox plugin runs it on its retention.
func (s *Store) PurgeDispatched(ctx context.Context, before time.Time) (int64, error) {
	return s.impl().PurgeDispatched(ctx, before)
}
