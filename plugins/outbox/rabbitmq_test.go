package outbox_test

import (
	"context"
	"database/sql"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/testenv"
	"github.com/plugbus/plugbus/plugins/outbox"
	"github.com/plugbus/plugbus/store"
	"github.com/plugbus/plugbus/store/storetest"
	"github.com/plugbus/plugbus/transports/rabbitmq"
	"github.com/plugbus/plugbus/transports/transporttest"
)

type Big struct{ S string }

func (Big) MessageName() string { return "test.big" }

type Orphan struct{}

func (Orphan) MessageName() string { return "test.orphan" }

// rabbitTransport returns a RabbitMQ transport on exchange, closed when
// t ends.
func rabbitTransport(t testing.TB, url, exchange string, opts ...rabbitmq.Option) *rabbitmq.Transport {
	t.Helper()
	tr, err := rabbitmq.New(url, append([]rabbitmq.Option{rabbitmq.WithExchange(exchange), rabbitmq.WithLogger(slog.New(slog.DiscardHandler)),
		rabbitmq.WithBackoff(bus.Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond})}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// On RabbitMQ, a relay round whose batch holds a send to a queue that
// does not exist, a publish no queue is bound to (both unroutable), a
// message over the transport's size limit and a send the broker nacks (a
// full queue that rejects publishes) among good messages marks exactly
// the good ones dispatched, and they arrive once each; the four others
// are tried WithDispatchAttempts times and parked with their error.
func TestRabbitMQPartialBatchFailure(t *testing.T) {
	url := testenv.RabbitMQ(t)
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		exchange := transporttest.Name("outbox-partial")
		sinkQueue := exchange + "-sink"
		missing := exchange + "-missing"
		full := exchange + "-full" // takes nothing: the broker nacks every publish to it
		t.Cleanup(func() {
			testenv.DeleteRabbitMQ(t, url, exchange, sinkQueue, rabbitmq.DeadLetterQueue(sinkQueue), missing, full)
		})
		declareFullQueue(t, url, full)
		var mu sync.Mutex
		seen := map[int]int{}
		arrived := make(chan int, 100)
		sinkBus, err := bus.New(bus.WithEndpoint(sinkQueue), bus.WithTransport(rabbitTransport(t, url, exchange)), bus.WithLogger(slog.New(slog.DiscardHandler)),
			bus.WithHandler(func(_ context.Context, m Done, _ bus.Attributes) error {
				mu.Lock()
				seen[m.N]++
				mu.Unlock()
				arrived <- m.N
				return nil
			}))
		if err != nil {
			t.Fatal(err)
		}
		start(t, sinkBus)

		st := db.Open(t, store.WithDispatchAttempts(2), store.WithBackoff(bus.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond}))
		b, err := bus.New(bus.WithTransport(rabbitTransport(t, url, exchange, rabbitmq.WithMaxMessageSize(4096))), bus.WithLogger(slog.New(slog.DiscardHandler)),
			bus.WithMiddleware(outbox.New(st, outbox.WithPollInterval(10*time.Millisecond))))
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		// Stored in one transaction before the relay starts: its first
		// round takes them as one batch.
		if err := st.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if err := outbox.Within(ctx, b, st, func(ctx context.Context, _ *sql.Tx) error {
			return firstErr(
				b.Send(ctx, Done{N: 0}, bus.To(sinkQueue)),
				b.Send(ctx, Done{N: 1}, bus.To(missing)),
				b.Send(ctx, Done{N: 2}, bus.To(sinkQueue)),
				b.Send(ctx, Big{S: strings.Repeat("x", 8192)}, bus.To(sinkQueue)),
				b.Publish(ctx, Orphan{}),
				b.Send(ctx, Done{N: 4}, bus.To(full)),
				b.Send(ctx, Done{N: 3}, bus.To(sinkQueue)),
			)
		}); err != nil {
			t.Fatal(err)
		}
		start(t, b)
		waitFor(t, "the four refused rows parked", func() bool { n, _ := st.ParkedCount(ctx); return n == 4 })
		parked, err := st.Parked(ctx, 0, 10)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, p := range parked {
			names = append(names, p.Name)
			if p.Attempts != 2 || p.LastError == "" {
				t.Errorf("parked %s after %d attempts with error %q, want 2 attempts and the transport's error", p.Name, p.Attempts, p.LastError)
			}
		}
		if !slices.Equal(names, []string{"test.done", "test.big", "test.orphan", "test.done"}) {
			t.Errorf("parked %v, want the send to the missing queue, the big message, the orphan publish and the send to the full queue", names)
		}
		waitFor(t, "the good rows marked dispatched", func() bool { n, _ := st.Pending(ctx); return n == 0 })
		// A last message, behind the others in the sink's queue: when it
		// arrives, a good message dispatched twice would have arrived too.
		if err := outbox.Within(ctx, b, st, func(ctx context.Context, _ *sql.Tx) error {
			return b.Send(ctx, Done{N: 99}, bus.To(sinkQueue))
		}); err != nil {
			t.Fatal(err)
		}
		deadline := time.After(15 * time.Second)
		for done := false; !done; {
			select {
			case n := <-arrived:
				done = n == 99
			case <-deadline:
				t.Fatal("the last message did not arrive within 15s")
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if seen[0] != 1 || seen[2] != 1 || seen[3] != 1 || len(seen) != 4 {
			t.Errorf("the sink received %v, want 0, 2, 3 and 99 once each", seen)
		}
	})
}

// declareFullQueue declares queue on the broker at url with room for no
// message and overflow reject-publish: the broker nacks what is sent to it.
func declareFullQueue(t testing.TB, url, queue string) {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-max-length": int32(0), "x-overflow": "reject-publish"}); err != nil {
		t.Fatal(err)
	}
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
