package plugin

import "time"

// WithStableUptime sets how long a process must stay up for the restart
// back-off to reset (a minute outside tests).
func WithStableUptime(d time.Duration) Option {
	return func(c *config) error { c.stableUptime = d; return nil }
}
