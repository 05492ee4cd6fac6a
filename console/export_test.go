package console

import "time"

// SetClock sets the clock the rates are computed with.
func (c *Console) SetClock(now func() time.Time) { c.rates.now = now }
