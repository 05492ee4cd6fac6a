package saga

import (
	"time"

	"github.com/plugbus/plugbus/bus"
)

// delayOption returns the send option that delivers a message after d:
// the one seam between sagas and the bus's delayed delivery (bus.Delay,
// carried by the transport, and stored with the message by the outbox).
func delayOption(d time.Duration) (bus.SendOption, error) {
	return bus.Delay(d), nil
}
