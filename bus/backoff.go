package bus

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// Backoff is an exponential back-off with full jitter: the delay before
// retry n is drawn uniformly from [0, min(Max, Initial·2^(n-1))]. The
// ceiling doubles with each retry up to Max; the jitter spreads out the
// retries of many clients that failed together (a broker restart, a
// database failover), so that they do not come back at the same instant.
//
// It is the one back-off of plugbus: the bus's delayed retries
// ([RetryPolicy]) and its receive loop, and every package that waits
// before trying again, which takes it through an option spelled
// WithBackoff (plugin.WithBackoff, store.WithBackoff, outbox.WithBackoff,
// rabbitmq.WithBackoff) where a zero field means that package's default.
// A Backoff is a plain value, safe for concurrent use.
//
//	plugin.WithBackoff(bus.Backoff{Initial: 100 * time.Millisecond, Max: 30 * time.Second})
type Backoff struct {
	// Initial is the ceiling of the first delay.
	Initial time.Duration
	// Max caps the ceiling of every delay.
	Max time.Duration
}

// Delay returns how long to wait before retry n, counted from 1 (a
// smaller n counts as 1): a duration drawn uniformly from
// [0, b.Ceiling(n)].
func (b Backoff) Delay(n int) time.Duration {
	c := b.Ceiling(n)
	switch {
	case c <= 0:
		return 0
	case c == math.MaxInt64:
		return time.Duration(rand.Int64()) // [0, MaxInt64]: c+1 would overflow
	}
	return time.Duration(rand.Int64N(int64(c) + 1))
}

// Ceiling returns the longest delay before retry n (counted from 1; a
// smaller n counts as 1): min(Max, Initial·2^(n-1)), computed without
// overflow for any n. It is 0 for a non-positive Initial or Max.
func (b Backoff) Ceiling(n int) time.Duration {
	if b.Initial <= 0 || b.Max <= 0 {
		return 0
	}
	shift := max(n, 1) - 1
	if shift >= 63 || b.Initial > b.Max>>shift {
		return b.Max
	}
	return b.Initial << shift
}

// Validate reports a back-off whose delays make no sense, saying what to
// change: Initial must be positive and Max at least Initial.
func (b Backoff) Validate() error {
	switch {
	case b.Initial <= 0:
		return fmt.Errorf("bus: back-off {Initial: %s, Max: %s}: Initial must be positive; give the first retry's longest delay, such as 100ms", b.Initial, b.Max)
	case b.Max < b.Initial:
		return fmt.Errorf("bus: back-off {Initial: %s, Max: %s}: Max is below Initial; raise Max to at least %[1]s or lower Initial", b.Initial, b.Max)
	}
	return nil
}
