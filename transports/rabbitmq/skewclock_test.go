package rabbitmq

import (
	"testing"
	"time"
)

// The skew check reads the clock only for a time past the bound it last
// computed, and never trusts a time more than the allowance ahead.
func TestSkewClockReadsTheClockOnlyPastItsBound(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	reads := 0
	c := newSkewClock(func() time.Time { reads++; return now })
	for _, step := range []struct {
		t     time.Duration // after now
		ahead bool
		reads int
	}{
		{-time.Hour, false, 1}, // the first check reads the clock
		{time.Minute, false, 1},
		{ClockSkewAllowance, false, 1},
		{ClockSkewAllowance + time.Second, true, 2},
		{2 * time.Minute, false, 2},
	} {
		if got := c.ahead(now.Add(step.t)); got != step.ahead || reads != step.reads {
			t.Errorf("now%+v: ahead %v after %d clock reads, want %v after %d", step.t, got, reads, step.ahead, step.reads)
		}
	}
	now = now.Add(10 * time.Minute) // the clock moved on: a later time is re-checked
	if c.ahead(now.Add(time.Minute)) || reads != 3 {
		t.Errorf("a time within the allowance of the new now is ahead, or the clock was not read again (%d reads)", reads)
	}
}
