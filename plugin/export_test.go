package plugin

import "time"

// WithStableUptime sets how long a process must stay up for the restart
// back-off to reset (a minute outside tests).
func WithStableUptime(d time.Duration) Option {
	return func(c *config) error { c.stableUptime = d; return nil }
}

// WithRestartDelay makes every restart wait d instead of a random delay of
// the back-off, for tests that need the process down for a while.
func WithRestartDelay(d time.Duration) Option {
	return func(c *config) error {
		c.restartDelay = func(int) time.Duration { return d }
		return nil
	}
}

// WithSessionFrom sets from how many invocations in flight (this one
// included) an invocation goes over the process's batching session: 1
// sends every invocation over it, 1<<30 none.
func WithSessionFrom(n int32) Option {
	return func(c *config) error { c.sessionFrom = n; return nil }
}
