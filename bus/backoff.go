package bus

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// Backoff is an exponential back-off with full jitter, the one every
// back-off of plugbus uses: the bus's delayed retries, the receive loop,
// reconnecting to a broker, restarting a plugin, the outbox's dispatch.
// The n-th wait (n from 1) is drawn uniformly from [0, min(Max,
// Initial·2ⁿ⁻¹)]: spread out so that the many clients a shared outage
// hits do not come back all at once.
type Backoff struct {
	// Initial is the ceiling of the first wait.
	Initial time.Duration
	// Max is the ceiling of every wait.
	Max time.Duration
}

// Ceiling returns the longest the n-th wait can be: min(Max,
// Initial·2ⁿ⁻¹), without overflow for any n.
func (b Backoff) Ceiling(n int) time.Duration {
	if n < 1 {
		n = 1
	}
	d := b.Initial
	for i := 1; i < n && d < b.Max; i++ {
		if d > b.Max/2 {
			return b.Max
		}
		d *= 2
	}
	return min(d, b.Max)
}

// Delay returns the n-th wait (n from 1), drawn uniformly from [0,
// Ceiling(n)].
func (b Backoff) Delay(n int) time.Duration {
	c := b.Ceiling(n)
	if c <= 0 {
		return 0
	}
	return rand.N(c + 1)
}

// Validate returns an error saying what to change when b cannot work:
// Initial must be positive and at most Max.
func (b Backoff) Validate() error {
	if b.Initial <= 0 || b.Max < b.Initial {
		return fmt.Errorf("bus.Backoff{Initial: %v, Max: %v}: want 0 < Initial <= Max", b.Initial, b.Max)
	}
	return nil
}
