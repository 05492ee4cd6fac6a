package saga_test

import (
	"strings"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/store/storetest"
	"github.com/plugbus/plugbus/transports/memory"
)

// ByAttribute finds the instance by a sticky attribute too, as the
// message that started it would set one.
func TestByAttributeReadsStickyAttributes(t *testing.T) {
	db := storetest.New(t, storetest.SQLite)
	st := db.Open(t)
	broker := memory.NewBroker()
	b, _ := orderBus(t, st, memTransport(broker), orderSaga(st, time.Hour), nil, false)
	send(t, b, Placed{OrderID: "o-1", Amount: 42})
	waitFor(t, 10*time.Second, "placed", func() bool { _, _, ok := row(t, st, "order", "o-1"); return ok })
	send(t, b, Noted{Text: "gift"}, bus.WithStickyAttribute("order-id", "o-1"))
	waitFor(t, 10*time.Second, "noted or dead-lettered", func() bool {
		state, _, _ := row(t, st, "order", "o-1")
		return strings.Contains(state, "gift") || len(broker.DeadLetters("orders")) > 0
	})
	for _, dl := range broker.DeadLetters("orders") {
		t.Errorf("dead-lettered: %s: %s", dl.Envelope.Name, dl.Failure.Reason)
	}
}
