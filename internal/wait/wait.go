// Package wait holds the one wait of plugbus's back-off loops: sleep for a
// delay (a bus.Backoff's) unless the loop is told to stop meanwhile. Users
// never import it.
package wait

import (
	"context"
	"time"
)

// Sleep waits d, or until ctx is done, whichever comes first; it reports
// whether d elapsed (false: ctx ended, stop the loop). A d of zero or less
// returns at once, true unless ctx is already done.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
