package sqlstore

import (
	"context"
	"fmt"
	"time"

	"github.com/plugbus/plugbus/bus"
)

// ParkedMessage is a row of the outbox the relay no longer dispatches: the
// transport refused it store.WithDispatchAttempts times, or it could not be
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
	if limit < 1 {
		limit = 100
	}
	rows, err := s.db.QueryContext(ctx, s.queries.listParked, after, limit)
	if err != nil {
		return nil, fmt.Errorf("store: listing parked outbox rows: %w", err)
	}
	defer rows.Close()
	var out []ParkedMessage
	for rows.Next() {
		var (
			p                 ParkedMessage
			kind              int16
			created, parkedAt int64
		)
		if err := rows.Scan(&p.ID, &p.MessageID, &kind, &p.Destination, &p.Name, &p.Attempts, &p.LastError, &created, &parkedAt); err != nil {
			return nil, fmt.Errorf("store: listing parked outbox rows: %w", err)
		}
		p.Kind, p.CreatedAt, p.ParkedAt = bus.Kind(kind), time.Unix(0, created), time.Unix(0, parkedAt)
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: listing parked outbox rows: %w", err)
	}
	return out, nil
}

// ParkedCount returns how many rows are parked.
func (s *Store) ParkedCount(ctx context.Context) (int64, error) {
	var n int64
	if err := s.db.QueryRowContext(ctx, s.queries.parkedCount).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: counting parked outbox rows: %w", err)
	}
	return n, nil
}

// Requeue makes the parked rows ids pending again, with their attempt
// count reset: the relay dispatches them at its next round. Ids that are
// not parked are ignored. It returns how many rows it requeued. Fix the
// cause first (deploy the missing endpoint, shrink the message): a row
// that still fails is parked again after store.WithDispatchAttempts tries.
func (s *Store) Requeue(ctx context.Context, ids ...int64) (int64, error) {
	var total int64
	err := s.InTx(ctx, func(ctx context.Context, tx *Tx) error {
		for _, id := range ids {
			res, err := tx.sqlTx.ExecContext(ctx, s.queries.requeue, id)
			if err != nil {
				return fmt.Errorf("store: requeueing outbox row %d: %w", id, err)
			}
			n, _ := res.RowsAffected()
			total += n
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	if total > 0 {
		s.Wake()
	}
	return total, nil
}

// PurgeDispatched deletes the messages dispatched before before, and
// returns how many it deleted.
func (s *Store) PurgeDispatched(ctx context.Context, before time.Time) (int64, error) {
	n, err := s.purge(ctx, s.queries.purgeOutbox, before)
	if err != nil {
		return n, fmt.Errorf("store: purging the outbox: %w", err)
	}
	return n, nil
}

// purge runs query, a delete of at most purgeChunk rows older than
// before, until it deletes fewer, each statement bounded by the store's
// timeout; it returns how many rows it deleted.
func (s *Store) purge(ctx context.Context, query string, before time.Time) (int64, error) {
	var total int64
	for {
		stmtCtx, cancel := s.bounded(ctx)
		res, err := s.db.ExecContext(stmtCtx, query, before.UnixNano(), s.purgeChunk)
		cancel()
		if err != nil {
			return total, err
		}
		n, _ := res.RowsAffected()
		total += n
		if n < int64(s.purgeChunk) {
			return total, nil
		}
	}
}

// Pending returns how many stored messages wait to be dispatched (parked
// rows not included: see [Store.ParkedCount]).
func (s *Store) Pending(ctx context.Context) (int64, error) {
	var n int64
	if err := s.db.QueryRowContext(ctx, s.queries.pendingCount).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: counting pending outbox messages: %w", err)
	}
	return n, nil
}
