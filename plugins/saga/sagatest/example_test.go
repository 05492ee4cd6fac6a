package sagatest_test

import (
	"fmt"
	"time"

	"github.com/plugbus/plugbus/plugins/saga/sagatest"
)

// A payment timeout, tested on a fake clock: half an hour passes in no time.
func Example() {
	h := sagatest.New(orders(), time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	_ = h.Deliver(Placed{OrderID: "o-1"})
	_ = h.Advance(31 * time.Minute)
	fmt.Println(h.Messages(), h.Running("o-1"))
	// Output: [{o-1}] false
}
