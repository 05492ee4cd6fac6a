package saga_test

import (
	"strings"
	"testing"
	"time"

	"github.com/plugbus/plugbus/store/storetest"
	"github.com/plugbus/plugbus/transports/memory"
)

// TestKeyNoStoreKeepsIsDeadLetteredAtOnce: a correlation value with a NUL
// byte cannot be kept by every store (PostgreSQL's TEXT refuses it): like
// an empty one, it fails permanently with a *saga.CorrelationError on
// every store, instead of running through the retry policy on one and
// being stored on the other.
func TestKeyNoStoreKeepsIsDeadLetteredAtOnce(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		st := db.Open(t)
		broker := memory.NewBroker()
		b, _ := orderBus(t, st, memTransport(broker), orderSaga(st, time.Hour), nil, false)
		send(t, b, Placed{OrderID: "o\x00-1", Amount: 1})
		send(t, b, Placed{OrderID: "o-2 'ключ' \"🔑\";--", Amount: 2}) // odd but storable
		waitFor(t, 10*time.Second, "o-2 stored", func() bool { _, _, ok := row(t, st, "order", "o-2 'ключ' \"🔑\";--"); return ok })
		waitFor(t, 10*time.Second, "o\\x00-1 dead-lettered", func() bool { return len(broker.DeadLetters("orders")) == 1 })
		reason := broker.DeadLetters("orders")[0].Failure.Reason
		want := `saga order: the correlation value "o\x00-1" of message sagatests.placed contains a NUL byte or invalid UTF-8`
		if !strings.Contains(reason, want) || !strings.Contains(reason, "(permanent failure") {
			t.Fatalf("dead letter reason %q; want it to contain %q, permanent", reason, want)
		}
	})
}
