package inbox

import (
	"context"
	"sync"
	"time"

	"github.com/plugbus/plugbus/store"
)

// MemoryStore is an in-process [Store], for tests and single-process
// services that accept losing the records on restart. It is safe for
// concurrent use.
type MemoryStore struct {
	mu   sync.Mutex
	seen map[memKey]time.Time
}

type memKey struct{ endpoint, id string }

// NewMemoryStore returns an empty memory store.
func NewMemoryStore() *MemoryStore { return &MemoryStore{seen: map[memKey]time.Time{}} }

// Processed reports whether endpoint recorded messageID.
func (s *MemoryStore) Processed(_ context.Context, endpoint, messageID string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.seen[memKey{endpoint, messageID}]
	return ok, nil
}

// MarkProcessed records messageID as processed by endpoint.
func (s *MemoryStore) MarkProcessed(_ context.Context, endpoint, messageID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := memKey{endpoint, messageID}
	if _, ok := s.seen[k]; !ok {
		s.seen[k] = time.Now()
	}
	return nil
}

// PurgeProcessed deletes the records made before before.
func (s *MemoryStore) PurgeProcessed(_ context.Context, before time.Time) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for k, at := range s.seen {
		if at.Before(before) {
			delete(s.seen, k)
			n++
		}
	}
	return n, nil
}

// Len returns how many records the store holds.
func (s *MemoryStore) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.seen)
}

var (
	_ Store = (*MemoryStore)(nil)
	_ Store = (*store.Store)(nil)
)
