package store

import (
	"context"
	"time"
)

// Processed reports whether the inbox recorded messageID as processed by
// endpoint (every handler succeeded).
func (s *Store) Processed(ctx context.Context, endpoint, messageID string) (bool, error) {
	return s.impl().Processed(ctx, endpoint, messageID)
}

// MarkProcessed records that endpoint processed messageID (every handler
// succeeded). Recording it twice is not an error.
func (s *Store) MarkProcessed(ctx context.Context, endpoint, messageID string) error {
	return s.impl().MarkProcessed(ctx, endpoint, messageID)
}

// PurgeProcessed deletes the inbox records made before before, and returns
// how many it deleted. A duplicate that arrives after its record was
// purged is processed again. The inbox plugin runs it on its retention.
func (s *Store) PurgeProcessed(ctx context.Context, before time.Time) (int64, error) {
	return s.impl().PurgeProcessed(ctx, before)
}
