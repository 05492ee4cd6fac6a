package saga_test

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugins/saga"
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

// TestKeyLongerThanTheLimitIsDeadLetteredAtOnce: PostgreSQL's B-tree index
// refuses a row longer than about 2.7 KB, which SQLite keeps. A correlation
// value longer than saga.MaxKeyLength fails permanently with a
// *saga.CorrelationError on every store, whichever way it comes in (a
// field of a starting message, an attribute, a timeout's AttrKey), and one
// of exactly saga.MaxKeyLength bytes is stored on every store.
func TestKeyLongerThanTheLimitIsDeadLetteredAtOnce(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		st := db.Open(t)
		broker := memory.NewBroker()
		b, _ := orderBus(t, st, memTransport(broker), orderSaga(st, time.Hour), nil, false)
		// Random, so that PostgreSQL cannot compress them into its index.
		longest := incompressible(t, saga.MaxKeyLength)
		justOver := incompressible(t, saga.MaxKeyLength+1)
		overIndex := incompressible(t, 3*saga.MaxKeyLength) // beyond PostgreSQL's index row
		send(t, b, Placed{OrderID: overIndex, Amount: 1})
		send(t, b, Noted{Text: "n"}, bus.WithAttribute("order-id", justOver))
		send(t, b, PaymentOverdue{OrderID: "o-1"}, bus.WithAttribute(saga.AttrSaga, "order"), bus.WithAttribute(saga.AttrKey, justOver))
		send(t, b, Placed{OrderID: justOver, Amount: 2})
		send(t, b, Placed{OrderID: longest, Amount: 3})
		waitFor(t, 10*time.Second, "the longest key stored", func() bool { _, _, ok := row(t, st, "order", longest); return ok })
		waitFor(t, 10*time.Second, "four dead letters", func() bool { return len(broker.DeadLetters("orders")) == 4 })
		for _, key := range []string{justOver, overIndex} {
			if _, _, ok := row(t, st, "order", key); ok {
				t.Errorf("a key of %d bytes, longer than saga.MaxKeyLength, was stored", len(key))
			}
		}
		for _, dl := range broker.DeadLetters("orders") {
			want := fmt.Sprintf("is %d bytes long, longer than the limit of %d bytes", saga.MaxKeyLength+1, saga.MaxKeyLength)
			if strings.Contains(string(dl.Envelope.Body), overIndex) {
				want = fmt.Sprintf("is %d bytes long, longer than the limit of %d bytes", len(overIndex), saga.MaxKeyLength)
			}
			if r := dl.Failure.Reason; !strings.Contains(r, want) || !strings.Contains(r, "(permanent failure") || dl.Failure.Attempts != 1 {
				t.Errorf("%s dead-lettered after %d attempt(s) with %.300q; want 1 attempt and a permanent failure saying %q", dl.Envelope.Name, dl.Failure.Attempts, r, want)
			}
		}
	})
}

// incompressible returns n random bytes as hexadecimal text.
func incompressible(t testing.TB, n int) string {
	t.Helper()
	b := make([]byte, (n+1)/2)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)[:n]
}
