package sqlstore

import (
	"context"
	"time"
)

// bounded returns ctx with the store's statement timeout: a statement on
// a connection that went silent fails after it (the driver closes the
// connection) instead of waiting for the kernel to give up.
func (s *Store) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.timeout)
}

// watchdog cancels a transaction's context when one of its steps outlives
// the store's timeout: the driver's begin and commit run under the
// context the transaction began with, which must outlive the relay's own
// (what was dispatched before a Stop is still marked), so no deadline can
// be set on it in advance.
type watchdog struct {
	timeout time.Duration
	cancel  context.CancelFunc
	timer   *time.Timer
}

// watch returns a context for a transaction, derived from ctx without its
// cancellation, and a watchdog that cancels it; the watchdog starts armed.
func (s *Store) watch(ctx context.Context) (context.Context, *watchdog) {
	txCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	return txCtx, &watchdog{timeout: s.timeout, cancel: cancel, timer: time.AfterFunc(s.timeout, cancel)}
}

// arm starts the countdown again (before a step on the database).
func (w *watchdog) arm() { w.timer.Reset(w.timeout) }

// disarm stops the countdown (while the transaction waits for something
// other than the database: the transport).
func (w *watchdog) disarm() { w.timer.Stop() }

// stop disarms the watchdog and releases the transaction's context.
func (w *watchdog) stop() {
	w.timer.Stop()
	w.cancel()
}
