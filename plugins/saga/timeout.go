package saga

import (
	"time"

	"github.com/plugbus/plugbus/bus"
)

// delayOption returns the send option that delivers a message after d:
// the one seam between sagas and the bus's delayed delivery.
func delayOption(d time.Duration) (bus.SendOption, error) {
	return nil, ErrNoDelayedDelivery
}
