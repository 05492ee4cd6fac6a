package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Processed reports whether the inbox recorded messageID as processed by
// endpoint (every handler succeeded).
func (s *Store) Processed(ctx context.Context, endpoint, messageID string) (bool, error) {
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	return s.inboxHas(ctx, s.db, endpoint, messageID, "")
}

func (s *Store) inboxHas(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, endpoint, messageID, handler string) (bool, error) {
	var one int
	err := q.QueryRowContext(ctx, s.queries.inboxProcessed, endpoint, messageID, handler).Scan(&one)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("store: inbox lookup of %s at %s: %w", messageID, endpoint, err)
	}
	return true, nil
}

// MarkProcessed records that endpoint processed messageID (every handler
// succeeded). Recording it twice is not an error.
func (s *Store) MarkProcessed(ctx context.Context, endpoint, messageID string) error {
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	if _, err := s.db.ExecContext(ctx, s.queries.inboxInsert, endpoint, messageID, "", time.Now().UnixNano()); err != nil {
		return fmt.Errorf("store: recording %s as processed at %s: %w", messageID, endpoint, err)
	}
	return nil
}

// ClaimHandler records, within tx, that handler of endpoint processes
// messageID. It returns false when that is already recorded: the handler
// ran and committed before, and must be skipped. The record becomes visible
// only when tx commits, that is when the handler succeeded; a concurrent
// duplicate on PostgreSQL waits for tx to end.
func (s *Store) ClaimHandler(ctx context.Context, tx *Tx, endpoint, messageID, handler string) (bool, error) {
	if handler == "" {
		return false, errors.New("store: ClaimHandler: empty handler name")
	}
	tx.mu.Lock()
	res, err := tx.sqlTx.ExecContext(ctx, s.queries.inboxInsert, endpoint, messageID, handler, time.Now().UnixNano())
	tx.mu.Unlock()
	if err != nil {
		return false, fmt.Errorf("store: inbox claim of %s by %s at %s: %w", messageID, handler, endpoint, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("store: inbox claim of %s by %s at %s: %w", messageID, handler, endpoint, err)
	}
	return n == 1, nil
}

// ReleaseHandler withdraws, within tx, the record [Store.ClaimHandler]
// made: the handler's effects do not all commit with tx (its sends are
// flushed after tx commits), so it must run again if the message comes
// back.
func (s *Store) ReleaseHandler(ctx context.Context, tx *Tx, endpoint, messageID, handler string) error {
	tx.mu.Lock()
	_, err := tx.sqlTx.ExecContext(ctx, s.queries.inboxDelete, endpoint, messageID, handler)
	tx.mu.Unlock()
	if err != nil {
		return fmt.Errorf("store: inbox release of %s by %s at %s: %w", messageID, handler, endpoint, err)
	}
	return nil
}

// PurgeProcessed deletes the inbox records made before before, and returns
// how many it deleted. A duplicate that arrives after its record was
// purged is processed again.
func (s *Store) PurgeProcessed(ctx context.Context, before time.Time) (int64, error) {
	n, err := s.purge(ctx, s.queries.purgeInbox, before)
	if err != nil {
		return n, fmt.Errorf("store: purging the inbox: %w", err)
	}
	return n, nil
}
