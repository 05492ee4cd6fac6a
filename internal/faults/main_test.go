package faults_test

import (
	"flag"
	"testing"

	"github.com/plugbus/plugbus/internal/testenv"
	"github.com/rs/zerolog"

	"go.uber.org/goleak"
)

// messages is how many messages each case streams, at a tenth of them
// a second.
var messages = flag.Int("faults.messages", 10_000, "messages per fault case")

func count() int { return *messages }

// skipUnderRace skips the suite under the race detector, which slows the
// bus several times over while the faults' durations stay what they are:
// `make test` runs the suite in a line of its own, without -race, like
// the outbox's crash test. The code it drives is race-tested by its own
// packages' tests.
func skipUnderRace(t *testing.T) {
	if testenv.RaceEnabled {
		t.Skip("the fault suite runs without -race: go test ./internal/faults (make test does)")
	}
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
