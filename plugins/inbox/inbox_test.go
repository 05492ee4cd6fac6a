package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugins/inbox"
	"github.com/plugbus/plugbus/plugins/outbox"
	"github.com/plugbus/plugbus/store"
	"github.com/plugbus/plugbus/store/storetest"
	"github.com/plugbus/plugbus/transports/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type Work struct{ N int }

func (Work) MessageName() string { return "test.work" }

type Done struct{ N int }

func (Done) MessageName() string { return "test.done" }

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

// eachStore runs fn for the memory store and for both SQL stores.
func eachStore(t *testing.T, fn func(t *testing.T, st inbox.Store)) {
	t.Run("memory", func(t *testing.T) { fn(t, inbox.NewMemoryStore()) })
	storetest.Each(t, func(t *testing.T, db storetest.DB) { fn(t, db.Open(t)) })
}

// recorder counts the handling of each message id; the sentinel message
// (N < 0) closes done. With concurrency 1 and a FIFO transport, every
// message sent before the sentinel was handled (or skipped) by then.
type recorder struct {
	mu    sync.Mutex
	calls map[string]int
	done  chan struct{}
}

func newRecorder() *recorder { return &recorder{calls: map[string]int{}, done: make(chan struct{})} }

func (r *recorder) add(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls[id]++
	return r.calls[id]
}

func (r *recorder) get(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[id]
}

func (r *recorder) wait(t testing.TB) {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(15 * time.Second):
		t.Fatal("the sentinel message was not handled within 15s")
	}
}

func send(t testing.TB, b *bus.Bus, n int, id string) {
	t.Helper()
	if err := b.Send(context.Background(), Work{N: n}, bus.To("worker"), bus.WithMessageID(id)); err != nil {
		t.Fatal(err)
	}
}

func TestDuplicateSkipped(t *testing.T) {
	eachStore(t, func(t *testing.T, st inbox.Store) {
		rec := newRecorder()
		broker := memory.NewBroker()
		var failed sync.Once
		b, err := bus.New(bus.WithEndpoint("worker"), bus.WithConcurrency(1), bus.WithTransport(memory.New(memory.WithBroker(broker))),
			bus.WithMiddleware(inbox.New(st)),
			bus.WithHandler(func(_ context.Context, m Work, a bus.Attributes) error {
				if m.N < 0 {
					close(rec.done)
					return nil
				}
				rec.add(a.MessageID)
				if m.N == 2 {
					var err error
					failed.Do(func() { err = errors.New("fails once") })
					return err
				}
				return nil
			}, bus.HandlerName("work")))
		if err != nil {
			t.Fatal(err)
		}
		start(t, b)
		send(t, b, 1, "m1")
		send(t, b, 1, "m1")
		send(t, b, 2, "m2") // fails, is returned to the tail, then succeeds
		send(t, b, 1, "m1")
		send(t, b, 3, "m3")
		send(t, b, -1, "sentinel")
		rec.wait(t)
		// m2's retry went to the tail, behind the sentinel: wait for it.
		deadline := time.Now().Add(10 * time.Second)
		for {
			ok, err := st.Processed(context.Background(), "worker", "m2")
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("m2 not recorded after its retry")
			}
			time.Sleep(5 * time.Millisecond)
		}
		if n := rec.get("m1"); n != 1 {
			t.Fatalf("m1 handled %d times, want 1", n)
		}
		if n := rec.get("m2"); n != 2 {
			t.Fatalf("m2 handled %d times, want 2 (a failed message is not recorded)", n)
		}
		if n := rec.get("m3"); n != 1 {
			t.Fatalf("m3 handled %d times", n)
		}
	})
}

// TestSeveralHandlers: with the outbox on the same store (either order),
// a handler that committed is skipped when another one failed.
func TestSeveralHandlers(t *testing.T) {
	for _, inboxFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("inbox first %v", inboxFirst), func(t *testing.T) { testSeveralHandlers(t, inboxFirst) })
	}
}

func testSeveralHandlers(t *testing.T, inboxFirst bool) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		st := db.Open(t)
		rec := newRecorder()
		var failed sync.Once
		mws := []bus.Plugin{inbox.New(st), outbox.New(st)}
		if !inboxFirst {
			mws[0], mws[1] = mws[1], mws[0]
		}
		b, err := bus.New(bus.WithEndpoint("worker"), bus.WithConcurrency(1),
			bus.WithMiddleware(mws...),
			bus.WithHandler(func(_ context.Context, m Work, _ bus.Attributes) error {
				rec.add("a")
				return nil
			}, bus.HandlerName("a")),
			bus.WithHandler(func(_ context.Context, m Work, _ bus.Attributes) error {
				if rec.add("b") == 2 {
					close(rec.done)
				}
				var err error
				failed.Do(func() { err = errors.New("b fails once") })
				return err
			}, bus.HandlerName("b")))
		if err != nil {
			t.Fatal(err)
		}
		start(t, b)
		send(t, b, 1, "m1")
		rec.wait(t)
		if err := b.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		if a, bb := rec.get("a"), rec.get("b"); a != 1 || bb != 2 {
			t.Fatalf("handler a ran %d times (want 1), b %d times (want 2)", a, bb)
		}
		if ok, _ := st.Processed(context.Background(), "worker", "m1"); !ok {
			t.Fatal("m1 not recorded after both handlers succeeded")
		}
	})
}

// TestExactlyOnceWithOutbox: inbox and outbox on one store. A duplicate
// delivered after the first copy committed is skipped, while the message
// the first copy stored (not dispatched yet: no relay runs) is still
// dispatched once a relay starts. Both registration orders share one
// transaction.
func TestExactlyOnceWithOutbox(t *testing.T) {
	for _, order := range []string{"outbox,inbox", "inbox,outbox"} {
		t.Run(order, func(t *testing.T) {
			storetest.Each(t, func(t *testing.T, db storetest.DB) {
				ctx := context.Background()
				st := db.Open(t)
				counters := db.Table("counters")
				if _, err := st.DB().ExecContext(ctx, "CREATE TABLE "+counters+" (k INTEGER PRIMARY KEY, n INTEGER NOT NULL)"); err != nil {
					t.Fatal(err)
				}
				for k := range 3 {
					if _, err := st.DB().ExecContext(ctx, db.Rebind("INSERT INTO "+counters+" (k, n) VALUES (?, 0)"), k); err != nil {
						t.Fatal(err)
					}
				}
				broker := memory.NewBroker()
				rec := newRecorder()
				var failed sync.Once
				mws := []bus.Plugin{outbox.New(st, outbox.WithoutRelay()), inbox.New(st)}
				if order == "inbox,outbox" {
					mws[0], mws[1] = mws[1], mws[0]
				}
				var b *bus.Bus
				b, err := bus.New(bus.WithEndpoint("worker"), bus.WithConcurrency(1), bus.WithTransport(memory.New(memory.WithBroker(broker))),
					bus.WithRoute("sink", Done{}), bus.WithMiddleware(mws...),
					bus.WithHandler(func(ctx context.Context, m Work, _ bus.Attributes) error {
						if m.N < 0 {
							close(rec.done)
							return nil
						}
						tx, err := outbox.Tx(ctx)
						if err != nil {
							return err
						}
						if _, err := tx.ExecContext(ctx, db.Rebind("UPDATE "+counters+" SET n = n + 1 WHERE k = ?"), m.N); err != nil {
							return err
						}
						if err := b.Send(ctx, Done(m)); err != nil {
							return err
						}
						if m.N == 2 {
							var err error
							failed.Do(func() { err = errors.New("fails once after writing") })
							return err
						}
						return nil
					}, bus.HandlerName("work")))
				if err != nil {
					t.Fatal(err)
				}
				start(t, b)
				send(t, b, 0, "m0")
				send(t, b, 1, "m1")
				send(t, b, 0, "m0")
				send(t, b, 2, "m2")
				send(t, b, 1, "m1")
				send(t, b, -1, "sentinel")
				rec.wait(t)
				if err := b.Stop(ctx); err != nil { // drains m2's retry
					t.Fatal(err)
				}
				for k := range 3 {
					var n int
					if err := st.DB().QueryRowContext(ctx, db.Rebind("SELECT n FROM "+counters+" WHERE k = ?"), k).Scan(&n); err != nil {
						t.Fatal(err)
					}
					if k < 2 && n != 1 {
						t.Fatalf("counter %d = %d, want 1", k, n)
					}
					if k == 2 && n > 1 {
						t.Fatalf("counter 2 = %d: the failed attempt was not rolled back", n)
					}
				}
				// m2's retry may not have run before Stop; what was committed is consistent.
				pending, err := st.Pending(ctx)
				if err != nil {
					t.Fatal(err)
				}
				var c2 int
				_ = st.DB().QueryRowContext(ctx, db.Rebind("SELECT n FROM "+counters+" WHERE k = ?"), 2).Scan(&c2)
				if pending != int64(2+c2) {
					t.Fatalf("outbox holds %d messages, want %d (one per committed effect)", pending, 2+c2)
				}
				// A relay dispatches what the skipped duplicates' first copies stored.
				got := make(chan int, 10)
				sinkBus, err := bus.New(bus.WithEndpoint("sink"), bus.WithTransport(memory.New(memory.WithBroker(broker))),
					bus.WithHandler(func(_ context.Context, m Done, _ bus.Attributes) error { got <- m.N; return nil }))
				if err != nil {
					t.Fatal(err)
				}
				start(t, sinkBus)
				relay, err := bus.New(bus.WithName("relay"), bus.WithTransport(memory.New(memory.WithBroker(broker))),
					bus.WithMiddleware(outbox.New(st)))
				if err != nil {
					t.Fatal(err)
				}
				start(t, relay)
				seen := map[int]int{}
				for range pending {
					select {
					case n := <-got:
						seen[n]++
					case <-time.After(10 * time.Second):
						t.Fatalf("relay delivered %v, want %d messages", seen, pending)
					}
				}
				if seen[0] != 1 || seen[1] != 1 {
					t.Fatalf("delivered %v", seen)
				}
			})
		})
	}
}

// purgeLog is a log handler that reports when the inbox's cleanup job
// deleted records: the job gives no other signal, and a test polling for
// the record could miss it altogether, made and purged between two polls
// of a goroutine that runs late.
type purgeLog struct{ purged chan time.Time }

func (purgeLog) Enabled(context.Context, slog.Level) bool { return true }

func (p purgeLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "inbox cleanup" {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "deleted" && a.Value.Int64() > 0 {
			select {
			case p.purged <- time.Now():
			default: // never blocks the job, and so Stop
			}
		}
		return true
	})
	return nil
}

func (p purgeLog) WithAttrs([]slog.Attr) slog.Handler { return p }
func (p purgeLog) WithGroup(string) slog.Handler      { return p }

func TestRetention(t *testing.T) {
	eachStore(t, func(t *testing.T, st inbox.Store) {
		ctx := context.Background()
		const retention = 300 * time.Millisecond
		handled := make(chan time.Time, 1)
		logs := purgeLog{purged: make(chan time.Time, 16)}
		b, err := bus.New(bus.WithEndpoint("worker"), bus.WithLogger(slog.New(logs)),
			bus.WithMiddleware(inbox.New(st, inbox.WithRetention(retention), inbox.WithCleanupInterval(10*time.Millisecond))),
			bus.WithHandler(func(context.Context, Work, bus.Attributes) error { handled <- time.Now(); return nil }))
		if err != nil {
			t.Fatal(err)
		}
		start(t, b)
		send(t, b, 1, "m1")
		ran := <-handled // m1 is recorded once its handler returned
		for {
			select {
			case at := <-logs.purged:
				ok, err := st.Processed(ctx, "worker", "m1")
				if err != nil {
					t.Fatal(err)
				}
				if ok {
					continue // another record went first
				}
				if kept := at.Sub(ran); kept < retention {
					t.Fatalf("record purged %v after its handler ran, within its retention of %v", kept, retention)
				}
				return
			case <-time.After(10 * time.Second):
				ok, err := st.Processed(ctx, "worker", "m1")
				t.Fatalf("no record purged within 10s (m1 recorded: %v, %v)", ok, err)
			}
		}
	})
}

func TestInvalidConfig(t *testing.T) {
	if _, err := bus.New(bus.WithEndpoint("e"), bus.WithMiddleware(inbox.New(nil))); !errors.Is(err, inbox.ErrNoStore) {
		t.Fatalf("nil store: %v", err)
	}
	if _, err := bus.New(bus.WithMiddleware(inbox.New(inbox.NewMemoryStore()))); !errors.Is(err, inbox.ErrNoEndpoint) {
		t.Fatalf("no endpoint: %v", err)
	}
	st, _ := store.New(&sql.DB{}, store.SQLite)
	if _, err := bus.New(bus.WithEndpoint("e"), bus.WithMiddleware(inbox.New(st, inbox.WithRetention(0)))); err == nil {
		t.Fatal("retention 0 accepted")
	}
}

// flaky refuses the first send of test.done: a transient broker error.
type flaky struct {
	bus.Transport
	n atomic.Int64
}

func (f *flaky) Send(ctx context.Context, e *bus.Envelope, to string) error {
	if e.Name == "test.done" && f.n.Add(1) == 1 {
		return errors.New("connection reset")
	}
	return f.Transport.Send(ctx, e, to)
}

// TestFailedFlushWithoutOutbox: the inbox on a SQL store and no outbox. The
// handler's send fails to flush once; the message is retried, and the
// handler must run again (not be skipped as done) so that the send goes out.
func TestFailedFlushWithoutOutbox(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		st := db.Open(t)
		broker := memory.NewBroker()
		got := make(chan Done, 10)
		sink, err := bus.New(bus.WithEndpoint("sink"), bus.WithTransport(memory.New(memory.WithBroker(broker))),
			bus.WithHandler(func(_ context.Context, m Done, _ bus.Attributes) error { got <- m; return nil }))
		if err != nil {
			t.Fatal(err)
		}
		start(t, sink)
		var runs atomic.Int64
		var b *bus.Bus
		b, err = bus.New(bus.WithEndpoint("worker"), bus.WithTransport(&flaky{Transport: memory.New(memory.WithBroker(broker))}),
			bus.WithLogger(slog.New(slog.DiscardHandler)),
			bus.WithMiddleware(inbox.New(st)),
			bus.WithHandler(func(ctx context.Context, m Work, _ bus.Attributes) error {
				runs.Add(1)
				return b.Send(ctx, Done(m), bus.To("sink"))
			}, bus.HandlerName("work")))
		if err != nil {
			t.Fatal(err)
		}
		start(t, b)
		if err := b.Send(context.Background(), Work{N: 1}, bus.To("worker"), bus.WithMessageID("w1")); err != nil {
			t.Fatal(err)
		}
		select {
		case m := <-got:
			if m.N != 1 {
				t.Fatalf("got %+v", m)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the send was lost: handler ran %d time(s), nothing delivered", runs.Load())
		}
		if n := runs.Load(); n != 2 {
			t.Fatalf("handler ran %d times, want 2", n)
		}
		waitProcessed(t, st, "worker", "w1")
	})
}

func waitProcessed(t *testing.T, st *store.Store, endpoint, id string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok, err := st.Processed(context.Background(), endpoint, id)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not recorded as processed", id)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
