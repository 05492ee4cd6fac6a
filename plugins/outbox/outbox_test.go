package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
	"github.com/plugbus/plugbus/plugins/outbox"
	"github.com/plugbus/plugbus/store"
	"github.com/plugbus/plugbus/store/storetest"
	"github.com/plugbus/plugbus/transports/memory"
)

func TestMain(m *testing.M) {
	if crashChild() {
		return
	}
	goleak.VerifyTestMain(m)
}

type Work struct{ N int }

func (Work) MessageName() string { return "test.work" }

type Done struct{ N int }

func (Done) MessageName() string { return "test.done" }

func count(t testing.TB, db *sql.DB, query string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

func start(t testing.TB, b *bus.Bus) {
	t.Helper()
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})
}

type received struct {
	msg   Done
	attrs bus.Attributes
}

// sink starts a bus on broker that reports every Done it receives.
func sink(t testing.TB, broker *memory.Broker) <-chan received {
	ch := make(chan received, 10000)
	b, err := bus.New(bus.WithEndpoint("sink"), bus.WithTransport(memory.New(memory.WithBroker(broker))),
		bus.WithHandler(func(_ context.Context, m Done, a bus.Attributes) error { ch <- received{m, a}; return nil }))
	if err != nil {
		t.Fatal(err)
	}
	start(t, b)
	return ch
}

func receive(t testing.TB, ch <-chan received) received {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no message delivered within 10s")
	}
	return received{}
}

// header is an outgoing middleware that sets a native header and a sticky attribute.
var header = bus.Middleware{Name: "header", Outgoing: func(ctx context.Context, o *bus.Outgoing, next *bus.OutgoingNext) error {
	o.Headers()["x-origin"] = "worker"
	o.SetSticky("tenant", "t1")
	return next.Call(ctx)
}}

func TestHandlerTransaction(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		st := db.Open(t)
		data := db.Table("data")
		storetest.Exec(t, st.DB(), "CREATE TABLE "+data+" (n INTEGER NOT NULL)")
		broker := memory.NewBroker()
		got := sink(t, broker)
		var attempts atomic.Int32
		var b *bus.Bus
		b, err := bus.New(bus.WithEndpoint("worker"), bus.WithTransport(memory.New(memory.WithBroker(broker))),
			bus.WithMiddleware(outbox.New(st), header),
			bus.WithHandler(func(ctx context.Context, m Work, _ bus.Attributes) error {
				tx, err := outbox.Tx(ctx)
				if err != nil {
					return err
				}
				if _, err := tx.ExecContext(ctx, db.Rebind("INSERT INTO "+data+" (n) VALUES (?)"), m.N); err != nil {
					return err
				}
				if err := b.Send(ctx, Done(m), bus.To("sink"), bus.WithMessageID(fmt.Sprintf("done-%d", m.N))); err != nil {
					return err
				}
				if attempts.Add(1) == 1 {
					return errors.New("first attempt fails after writing and sending")
				}
				return nil
			}, bus.HandlerName("work")))
		if err != nil {
			t.Fatal(err)
		}
		start(t, b)
		if err := b.Send(context.Background(), Work{N: 7}); err != nil {
			t.Fatal(err)
		}
		r := receive(t, got)
		if r.msg.N != 7 || r.attrs.MessageID != "done-7" {
			t.Fatalf("received %+v %+v", r.msg, r.attrs)
		}
		if v, _ := r.attrs.StickyValue("tenant"); v != "t1" {
			t.Fatalf("sticky attribute set by outgoing middleware lost: %q", v)
		}
		// Wait for the stop of the worker: then every transaction ended.
		if err := b.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		if n := count(t, st.DB(), "SELECT count(*) FROM "+data); n != 1 {
			t.Fatalf("data rows = %d, want 1 (the failed attempt must roll back)", n)
		}
		if n := count(t, st.DB(), "SELECT count(*) FROM "+db.Table("outbox")); n != 1 {
			t.Fatalf("outbox rows = %d, want 1", n)
		}
		if n := count(t, st.DB(), "SELECT count(*) FROM "+db.Table("outbox")+" WHERE headers LIKE '%x-origin%'"); n != 1 {
			t.Fatal("the stored message lost the header set by outgoing middleware")
		}
	})
}

func TestWithin(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		ctx := context.Background()
		st, orders := withOrders(t, db)
		broker := memory.NewBroker()
		got := sink(t, broker)
		b, err := bus.New(bus.WithName("api"), bus.WithTransport(memory.New(memory.WithBroker(broker))),
			bus.WithRoute("sink", Done{}), bus.WithMiddleware(outbox.New(st, outbox.WithPollInterval(time.Hour))))
		if err != nil {
			t.Fatal(err)
		}
		start(t, b)
		boom := errors.New("validation failed")
		err = outbox.Within(ctx, b, st, func(ctx context.Context, tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, db.Rebind("INSERT INTO "+orders+" (id) VALUES (?)"), 1); err != nil {
				return err
			}
			if err := b.Send(ctx, Done{N: 1}); err != nil {
				return err
			}
			return boom
		})
		if !errors.Is(err, boom) {
			t.Fatalf("Within = %v, want the fn's error", err)
		}
		err = outbox.Within(ctx, b, st, func(ctx context.Context, tx *sql.Tx) error {
			if got, err := outbox.Tx(ctx); got != tx || err != nil {
				return fmt.Errorf("outbox.Tx(ctx) = %p, %v; want the transaction of Within", got, err)
			}
			if _, err := tx.ExecContext(ctx, db.Rebind("INSERT INTO "+orders+" (id) VALUES (?)"), 2); err != nil {
				return err
			}
			return b.Send(ctx, Done{N: 2})
		})
		if err != nil {
			t.Fatal(err)
		}
		if r := receive(t, got); r.msg.N != 2 {
			t.Fatalf("received %+v, want N=2 (N=1 was rolled back)", r.msg)
		}
		if n := count(t, st.DB(), "SELECT count(*) FROM "+orders); n != 1 {
			t.Fatalf("orders = %d, want 1", n)
		}
		if n := count(t, st.DB(), "SELECT count(*) FROM "+db.Table("outbox")); n != 1 {
			t.Fatalf("outbox rows = %d, want 1", n)
		}
	})
}

// Within inside a handler of a bus without the plugin: the message is
// stored in Within's transaction (it commits with the write), not in the
// handler's buffer, which a later failure of the handler discards.
func TestWithinInsideAHandler(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		st, orders := withOrders(t, db)
		if err := st.Migrate(context.Background()); err != nil {
			t.Fatal(err)
		}
		var b *bus.Bus
		b, err := bus.New(bus.WithEndpoint("worker"), bus.WithTransport(memory.New()), bus.WithLogger(slog.New(slog.DiscardHandler)),
			bus.WithRoute("sink", Done{}),
			bus.WithHandler(func(ctx context.Context, m Work, _ bus.Attributes) error {
				err := outbox.Within(ctx, b, st, func(ctx context.Context, tx *sql.Tx) error {
					if _, err := tx.ExecContext(ctx, db.Rebind("INSERT INTO "+orders+" (id) VALUES (?)"), m.N); err != nil {
						return err
					}
					return b.Send(ctx, Done(m))
				})
				if err != nil {
					return err
				}
				return errors.New("the handler fails after Within committed")
			}))
		if err != nil {
			t.Fatal(err)
		}
		defer b.Stop(context.Background())
		if err := b.Deliver(context.Background(), bustest.Delivery(Work{N: 7}, bus.Attributes{})); err == nil {
			t.Fatal("Deliver returned nil; want the handler's error")
		}
		if n := count(t, st.DB(), "SELECT count(*) FROM "+orders); n != 1 {
			t.Fatalf("orders = %d, want 1", n)
		}
		if n := count(t, st.DB(), "SELECT count(*) FROM "+db.Table("outbox")); n != 1 {
			t.Fatalf("outbox rows = %d, want the message sent inside Within (1)", n)
		}
	})
}

// waitFor polls cond until it holds: the database gives no signal for what
// the cleanup job deleted or another process dispatched.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestRetentionCleanup(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		st := db.Open(t)
		broker := memory.NewBroker()
		got := sink(t, broker)
		b, err := bus.New(bus.WithName("api"), bus.WithTransport(memory.New(memory.WithBroker(broker))),
			bus.WithRoute("sink", Done{}),
			bus.WithMiddleware(outbox.New(st, outbox.WithRetention(0), outbox.WithCleanupInterval(10*time.Millisecond))))
		if err != nil {
			t.Fatal(err)
		}
		start(t, b)
		err = outbox.Within(context.Background(), b, st, func(ctx context.Context, _ *sql.Tx) error { return b.Send(ctx, Done{N: 1}) })
		if err != nil {
			t.Fatal(err)
		}
		receive(t, got)
		waitFor(t, "the cleanup job to delete the dispatched message", func() bool {
			return count(t, st.DB(), "SELECT count(*) FROM "+db.Table("outbox")) == 0
		})
	})
}

// TestSeveralInstances runs three relays on one outbox table: on
// PostgreSQL each has its own connection pool, like three processes; on
// SQLite they share the store, as they must (one process per file).
func TestSeveralInstances(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		const total = 1000
		ctx := context.Background()
		producer := db.Open(t)
		broker := memory.NewBroker()
		storetest.Exec(t, producer.DB(), "SELECT 1")
		if err := producer.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		pb, err := bus.New(bus.WithName("producer"), bus.WithRoute("sink", Done{}),
			bus.WithMiddleware(outbox.New(producer, outbox.WithoutRelay())))
		if err != nil {
			t.Fatal(err)
		}
		start(t, pb)
		err = outbox.Within(ctx, pb, producer, func(ctx context.Context, _ *sql.Tx) error {
			for i := range total {
				if err := pb.Send(ctx, Done{N: i}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			st := producer
			if db.Kind == storetest.Postgres {
				st = db.Open(t)
			}
			rb, err := bus.New(bus.WithName(fmt.Sprintf("relay-%d", i)), bus.WithTransport(memory.New(memory.WithBroker(broker))),
				bus.WithMiddleware(outbox.New(st, outbox.WithBatchSize(20), outbox.WithRelays(2))))
			if err != nil {
				t.Fatal(err)
			}
			start(t, rb)
		}
		waitFor(t, "the relays to drain the outbox", func() bool {
			n, err := producer.Pending(ctx)
			return err == nil && n == 0
		})
		// Dispatch happens before the mark, so every dispatch is done now.
		if d := broker.Depth("sink"); d != total {
			t.Fatalf("sink holds %d messages, want %d: relays dispatched a message twice or lost one", d, total)
		}
	})
}

// TestNotify shows that on PostgreSQL a commit in one process wakes the
// relay of another at once (LISTEN/NOTIFY), though it polls only hourly.
func TestNotify(t *testing.T) {
	db := storetest.New(t, storetest.Postgres)
	ctx := context.Background()
	broker := memory.NewBroker()
	got := sink(t, broker)
	relaySt := db.Open(t)
	rb, err := bus.New(bus.WithName("relay"), bus.WithTransport(memory.New(memory.WithBroker(broker))),
		bus.WithMiddleware(outbox.New(relaySt, outbox.WithPollInterval(time.Hour))))
	if err != nil {
		t.Fatal(err)
	}
	start(t, rb)
	producer := db.Open(t) // another pool: its commits do not reach the relay in-process
	pb, err := bus.New(bus.WithName("producer"), bus.WithRoute("sink", Done{}),
		bus.WithMiddleware(outbox.New(producer, outbox.WithoutRelay())))
	if err != nil {
		t.Fatal(err)
	}
	start(t, pb)
	for i := range 3 {
		err := outbox.Within(ctx, pb, producer, func(ctx context.Context, _ *sql.Tx) error { return pb.Send(ctx, Done{N: i}) })
		if err != nil {
			t.Fatal(err)
		}
		if r := receive(t, got); r.msg.N != i {
			t.Fatalf("received %d, want %d", r.msg.N, i)
		}
	}
}

func TestInvalidConfig(t *testing.T) {
	if _, err := bus.New(bus.WithMiddleware(outbox.New(nil))); !errors.Is(err, outbox.ErrNoStore) {
		t.Fatalf("nil store: %v", err)
	}
	st, err := store.New(&sql.DB{}, store.SQLite)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bus.New(bus.WithMiddleware(outbox.New(st, outbox.WithBatchSize(0)))); err == nil {
		t.Fatal("batch size 0 accepted")
	}
	// A zero Max keeps its default, 30s, below this Initial.
	if _, err := bus.New(bus.WithMiddleware(outbox.New(st, outbox.WithBackoff(bus.Backoff{Initial: time.Minute})))); err == nil || !strings.Contains(err.Error(), "outbox: WithBackoff") || !strings.Contains(err.Error(), "raise Max") {
		t.Fatalf("back-off above its Max: %v, want an error saying what to change", err)
	}
	if err := outbox.Within(context.Background(), nil, st, nil); err == nil {
		t.Fatal("Within with nil bus accepted")
	}
}

// Within that joins the handler's transaction and whose fn returns an
// error leaves nothing of fn behind, as Within promises, even when the
// handler goes on and succeeds: fn's writes and messages are undone (to a
// savepoint), the handler's own are kept.
func TestWithinJoinedRollsBackWhenFnFails(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		st, orders := withOrders(t, db)
		if err := st.Migrate(context.Background()); err != nil {
			t.Fatal(err)
		}
		rejected := errors.New("order rejected")
		var within error
		var b *bus.Bus
		b, err := bus.New(bus.WithEndpoint("worker"), bus.WithTransport(memory.New()), bus.WithLogger(slog.New(slog.DiscardHandler)),
			bus.WithRoute("sink", Done{}), bus.WithMiddleware(outbox.New(st, outbox.WithoutRelay())),
			bus.WithHandler(func(ctx context.Context, m Work, _ bus.Attributes) error {
				within = outbox.Within(ctx, b, st, func(ctx context.Context, tx *sql.Tx) error {
					if _, err := tx.ExecContext(ctx, db.Rebind("INSERT INTO "+orders+" (id) VALUES (?)"), m.N); err != nil {
						return err
					}
					if err := b.Send(ctx, Done(m)); err != nil {
						return err
					}
					return rejected
				})
				// The handler deals with the rejection and goes on.
				tx, err := outbox.Tx(ctx)
				if err != nil {
					return err
				}
				if _, err := tx.ExecContext(ctx, db.Rebind("INSERT INTO "+orders+" (id) VALUES (?)"), -m.N); err != nil {
					return err
				}
				return b.Send(ctx, Done{N: -m.N})
			}))
		if err != nil {
			t.Fatal(err)
		}
		defer b.Stop(context.Background())
		if err := b.Deliver(context.Background(), bustest.Delivery(Work{N: 7}, bus.Attributes{})); err != nil {
			t.Fatal(err)
		}
		if !errors.Is(within, rejected) {
			t.Fatalf("Within = %v, want fn's error", within)
		}
		if n := count(t, st.DB(), "SELECT count(*) FROM "+orders+" WHERE id = 7"); n != 0 {
			t.Fatalf("orders written by the failed fn = %d, want 0", n)
		}
		if n := count(t, st.DB(), "SELECT count(*) FROM "+orders+" WHERE id = -7"); n != 1 {
			t.Fatalf("orders written by the handler = %d, want 1", n)
		}
		if n := count(t, st.DB(), "SELECT count(*) FROM "+db.Table("outbox")); n != 1 {
			t.Fatalf("outbox rows = %d, want the handler's message alone (1)", n)
		}
	})
}

// withOrders opens a store on db beside an orders table of the
// application's (one id column), whose name it returns.
func withOrders(t *testing.T, db storetest.DB) (*store.Store, string) {
	t.Helper()
	st := db.Open(t)
	orders := db.Table("orders")
	storetest.Exec(t, st.DB(), "CREATE TABLE "+orders+" (id INTEGER NOT NULL)")
	return st, orders
}
