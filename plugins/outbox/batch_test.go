package outbox_test

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugins/outbox"
	"github.com/plugbus/plugbus/store/storetest"
	"github.com/plugbus/plugbus/transports/memory"
)

// batchRecorder is a memory transport that records the size of each
// batch it is handed.
type batchRecorder struct {
	*memory.Transport
	mu    sync.Mutex
	sizes []int
}

func (r *batchRecorder) SendBatch(ctx context.Context, batch []bus.Outbound) error {
	r.mu.Lock()
	r.sizes = append(r.sizes, len(batch))
	r.mu.Unlock()
	return r.Transport.SendBatch(ctx, batch)
}

// The relay hands the messages a handler stored to the transport as one
// batch, not one confirmation at a time.
func TestRelayDispatchesOneBatch(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		st := db.Open(t)
		broker := memory.NewBroker()
		got := sink(t, broker)
		tr := &batchRecorder{Transport: memory.New(memory.WithBroker(broker))}
		var b *bus.Bus
		b, err := bus.New(bus.WithEndpoint("worker"), bus.WithTransport(tr), bus.WithMiddleware(outbox.New(st)),
			bus.WithHandler(func(ctx context.Context, m Work, _ bus.Attributes) error {
				msgs := make([]bus.Message, 5)
				for i := range msgs {
					msgs[i] = Done{N: m.N*10 + i}
				}
				return b.SendBatch(ctx, msgs, bus.To("sink"))
			}, bus.HandlerName("work")))
		if err != nil {
			t.Fatal(err)
		}
		start(t, b)
		if err := b.Send(context.Background(), Work{N: 1}); err != nil {
			t.Fatal(err)
		}
		var ns []int
		for range 5 {
			ns = append(ns, receive(t, got).msg.N)
		}
		slices.Sort(ns)
		if !slices.Equal(ns, []int{10, 11, 12, 13, 14}) {
			t.Fatalf("sink received %v", ns)
		}
		tr.mu.Lock()
		defer tr.mu.Unlock()
		if !slices.Equal(tr.sizes, []int{5}) {
			t.Fatalf("batches of %v, want the relay's one batch of 5", tr.sizes)
		}
	})
}
