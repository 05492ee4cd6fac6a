package saga_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugins/inbox"
	"github.com/plugbus/plugbus/store/storetest"
	"github.com/plugbus/plugbus/transports/memory"
)

// Without the outbox on the saga's store, a message that comes back (here
// after a sibling handler failed) runs its step again: the inbox withdrew
// its record before the commit. The documentation says so (at least
// once); this pins it.
func TestWithoutTheOutboxAStepRunsAgainWhenItsMessageComesBack(t *testing.T) {
	db := storetest.New(t, storetest.SQLite)
	st := db.Open(t)
	broker := memory.NewBroker()
	s := orderSaga(st, time.Hour)
	var fails atomic.Int32
	fails.Store(1)
	var flakyDone atomic.Bool
	b, err := bus.New(bus.WithEndpoint("orders"), bus.WithTransport(memTransport(broker)), bus.WithLogger(slog.New(slog.DiscardHandler)),
		bus.WithMiddleware(inbox.New(st)), // the inbox on the saga's store, no outbox
		bus.WithRetry(bus.RetryPolicy{Immediate: 3}),
		bus.WithHandler(func(context.Context, Noted, bus.Attributes) error {
			if fails.Add(-1) >= 0 {
				return errors.New("sibling fails once")
			}
			flakyDone.Store(true)
			return nil
		}, bus.HandlerName("flaky")),
		s.Option())
	if err != nil {
		t.Fatal(err)
	}
	start(t, b)
	send(t, b, Placed{OrderID: "o-1", Amount: 1})
	waitFor(t, 10*time.Second, "placed", func() bool { _, _, ok := row(t, st, "order", "o-1"); return ok })
	send(t, b, Noted{Text: "gift"}, bus.WithAttribute("order-id", "o-1"), bus.WithMessageID("noted-1"))
	waitFor(t, 10*time.Second, "sibling succeeded", flakyDone.Load)
	waitFor(t, 10*time.Second, "message recorded", func() bool {
		ok, err := st.Processed(context.Background(), "orders", "noted-1")
		return err == nil && ok
	})
	state, _, _ := row(t, st, "order", "o-1")
	if n := strings.Count(state, "gift"); n != 2 {
		t.Fatalf("state %s: the step of message noted-1 was applied %d times; want twice (at least once, without the outbox)", state, n)
	}
}
