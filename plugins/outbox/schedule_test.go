package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugins/outbox"
	"github.com/plugbus/plugbus/store/storetest"
	"github.com/plugbus/plugbus/transports/memory"
)

// A delayed send from a handler goes through the outbox with its due
// time: the row stores it, the relay hands it to the transport at once
// (the row is dispatched before it is due: the relay does not wait for
// it), and the message arrives no earlier than due.
func TestDelayedSendThroughTheOutbox(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		st := db.Open(t)
		broker := memory.NewBroker()
		got := sink(t, broker)
		const delay = 1500 * time.Millisecond
		sentAt := make(chan time.Time, 1)
		var b *bus.Bus
		b, err := bus.New(bus.WithEndpoint("worker"), bus.WithTransport(memory.New(memory.WithBroker(broker))),
			bus.WithMiddleware(outbox.New(st)),
			bus.WithHandler(func(ctx context.Context, m Work, _ bus.Attributes) error {
				sentAt <- time.Now()
				return b.Send(ctx, Done(m), bus.To("sink"), bus.Delay(delay))
			}))
		if err != nil {
			t.Fatal(err)
		}
		start(t, b)
		if err := b.Send(context.Background(), Work{N: 3}); err != nil {
			t.Fatal(err)
		}
		sent := <-sentAt
		r := receive(t, got)
		if early := time.Until(sent.Add(delay)); early > 0 || r.msg.N != 3 {
			t.Fatalf("received %+v %v before it was due", r.msg, early)
		}
		table := db.Table("outbox")
		if n := count(t, st.DB(), "SELECT count(*) FROM "+table+" WHERE due_at > 0 AND dispatched_at < due_at"); n != 1 {
			t.Fatalf("rows dispatched before their due time = %d, want 1: the relay must hand the delay to the transport, not wait for it", n)
		}
	})
}
