package faults_test

import (
	"flag"
	"testing"

	"github.com/rs/zerolog"

	"go.uber.org/goleak"
)

// messages is how many messages each case streams. The default is the
// issue's 10,000; under the race detector (go test -race ./...) the suite
// streams 1,000 a case to stay cheap, and `make test` runs it again
// without -race at the full count.
var messages = flag.Int("faults.messages", 0, "messages per fault case (default 10,000; 1,000 under -race)")

func count() int {
	if *messages > 0 {
		return *messages
	}
	if raceEnabled {
		return 1000
	}
	return 10_000
}

// TestMain checks for leaked goroutines. Toxiproxy's toxic stubs may
// outlive their links (its latency toxic stays blocked on a send once the
// link is gone: a Toxiproxy bug, not ours): goroutines running a toxic
// are ignored, every other one is checked. Toxiproxy's toxics
// log through zerolog's global logger, silenced here.
func TestMain(m *testing.M) {
	zerolog.SetGlobalLevel(zerolog.Disabled)
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2/toxics.(*ToxicStub).Run"))
}
