package store_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/store"
	"github.com/plugbus/plugbus/store/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func outbound(i int) bus.Outbound {
	attrs := bus.NewAttributes(fmt.Sprintf("id-%d", i), "corr", time.Unix(1700000000, 123).UTC(),
		map[string]string{"one": "hop"}, map[string]string{"tenant": "t1"})
	return bus.Outbound{Kind: bus.KindSend, Options: bus.SendOptions{Destination: "dest"},
		Envelope: &bus.Envelope{Name: "test.msg", ContentType: "application/json", Body: fmt.Appendf(nil, `{"n":%d}`, i),
			Attributes: attrs, Headers: bus.Headers{"x-h": "v"}}}
}

func TestInvalidTableNames(t *testing.T) {
	db := &sql.DB{} // never used: names are checked before any query
	cases := []struct {
		d    store.Dialect
		opt  store.Option
		name string
	}{
		{store.SQLite, store.WithOutboxTable("bad name"), "space"},
		{store.SQLite, store.WithInboxTable("x;DROP TABLE y"), "injection"},
		{store.SQLite, store.WithOutboxTable("s.t"), "schema on sqlite"},
		{store.PostgreSQL, store.WithOutboxTable("a.b.c"), "three parts"},
		{store.PostgreSQL, store.WithOutboxTable(""), "empty"},
		{store.PostgreSQL, store.WithOutboxTable("1abc"), "leading digit"},
		{store.PostgreSQL, store.WithInboxTable(`in"box`), "quote"},
		{store.PostgreSQL, store.WithOutboxTable("x_1234567890123456789012345678901234567890123456789"), "too long"},
		{store.PostgreSQL, store.WithInboxTable("plugbus_outbox"), "same as outbox"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := store.New(db, c.d, c.opt)
			var ie *store.InvalidNameError
			if !errors.As(err, &ie) || !errors.Is(err, store.ErrInvalidName) {
				t.Fatalf("got %v, want *InvalidNameError", err)
			}
		})
	}
	if _, err := store.New(db, store.PostgreSQL, store.WithOutboxTable("app.outbox_1")); err != nil {
		t.Fatalf("valid schema-qualified name refused: %v", err)
	}
}

func TestStore(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		ctx := context.Background()
		st := db.Open(t)
		// Migrate is idempotent and safe concurrently (a second store value on the same tables).
		var wg sync.WaitGroup
		for range 3 {
			other := db.Open(t)
			wg.Go(func() {
				if err := other.Migrate(ctx); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if err := st.Migrate(ctx); err != nil {
			t.Fatal(err)
		}

		t.Run("rollback stores nothing", func(t *testing.T) {
			boom := errors.New("boom")
			err := st.InTx(ctx, func(ctx context.Context, tx *store.Tx) error {
				if err := tx.Add(ctx, outbound(0)); err != nil {
					return err
				}
				return boom
			})
			if !errors.Is(err, boom) {
				t.Fatalf("InTx = %v, want boom", err)
			}
			if n, _ := st.Pending(ctx); n != 0 {
				t.Fatalf("pending = %d after rollback", n)
			}
		})

		t.Run("round trip, order, failure, purge", func(t *testing.T) {
			woken := st.Committed()
			err := st.InTx(ctx, func(ctx context.Context, tx *store.Tx) error {
				for i := range 5 {
					if err := tx.Add(ctx, outbound(i)); err != nil {
						return err
					}
				}
				// joining: a nested InTx uses the same transaction
				return st.InTx(ctx, func(_ context.Context, inner *store.Tx) error {
					if inner != tx {
						return errors.New("nested InTx opened a second transaction")
					}
					return nil
				})
			})
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-woken:
			default:
				t.Fatal("commit did not signal the relays")
			}
			// The third message fails: the others are dispatched, it waits
			// for its backoff (1s by default, longer than this test).
			var got []bus.Outbound
			fail := errors.New("transport down")
			before := time.Now()
			n, err := st.DispatchPending(ctx, 10, func(_ context.Context, m bus.Outbound) error {
				if m.Envelope.Attributes.MessageID == "id-2" {
					return fail
				}
				got = append(got, m)
				return nil
			})
			var de *store.DispatchError
			if n != 4 || !errors.As(err, &de) || !errors.Is(err, fail) || de.MessageID != "id-2" || de.Attempts != 1 || de.Parked {
				t.Fatalf("DispatchPending = %d, %v; want 4, DispatchError for id-2", n, err)
			}
			// The error says when the row is due again: after the default
			// first backoff.
			if early, late := before.Add(store.DefaultDispatchBackoff), time.Now().Add(store.DefaultDispatchBackoff); de.RetryAt.Before(early) || de.RetryAt.After(late) {
				t.Fatalf("RetryAt = %v, want between %v and %v", de.RetryAt, early, late)
			}
			if p, _ := st.Pending(ctx); p != 1 {
				t.Fatalf("pending = %d, want 1", p)
			}
			n, err = st.DispatchPending(ctx, 10, func(_ context.Context, m bus.Outbound) error {
				t.Errorf("%s dispatched before its backoff", m.Envelope.Attributes.MessageID)
				return nil
			})
			if n != 0 || err != nil {
				t.Fatalf("second DispatchPending = %d, %v", n, err)
			}
			// Its retry time comes (set it to now, as a later round would see it).
			storetest.Exec(t, st.DB(), db.Rebind("UPDATE "+st.OutboxTable()+" SET next_attempt_at = 0"))
			n, err = st.DispatchPending(ctx, 10, func(_ context.Context, m bus.Outbound) error {
				got = append(got, m)
				return nil
			})
			if n != 1 || err != nil {
				t.Fatalf("third DispatchPending = %d, %v", n, err)
			}
			slices.SortFunc(got, func(a, b bus.Outbound) int {
				return strings.Compare(a.Envelope.Attributes.MessageID, b.Envelope.Attributes.MessageID)
			})
			for i, m := range got {
				want := outbound(i)
				e := m.Envelope
				if e.Attributes.MessageID != want.Envelope.Attributes.MessageID || e.Name != "test.msg" || string(e.Body) != string(want.Envelope.Body) ||
					m.Kind != bus.KindSend || m.Options.Destination != "dest" || e.Headers["x-h"] != "v" ||
					e.Attributes.CorrelationID != "corr" || !e.Attributes.SentAt.Equal(want.Envelope.Attributes.SentAt) {
					t.Fatalf("message %d = %+v %+v", i, m, e)
				}
				if v, _ := e.Attributes.Value("one"); v != "hop" {
					t.Fatalf("one-hop attribute lost: %v", v)
				}
				if v, _ := e.Attributes.StickyValue("tenant"); v != "t1" {
					t.Fatalf("sticky attribute lost: %v", v)
				}
			}
			if n, _ := st.Pending(ctx); n != 0 {
				t.Fatalf("pending = %d", n)
			}
			if n, err := st.PurgeDispatched(ctx, time.Now().Add(time.Hour)); err != nil || n != 5 {
				t.Fatalf("PurgeDispatched = %d, %v; want 5", n, err)
			}
		})

		t.Run("concurrent relays dispatch each row once", func(t *testing.T) {
			const total = 2000
			err := st.InTx(ctx, func(ctx context.Context, tx *store.Tx) error {
				for i := range total {
					if err := tx.Add(ctx, outbound(i)); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			seen := map[string]int{}
			var wg sync.WaitGroup
			for range 4 {
				relay := db.Open(t) // a separate pool: like another process
				wg.Go(func() {
					for {
						n, err := relay.DispatchPending(ctx, 50, func(_ context.Context, m bus.Outbound) error {
							mu.Lock()
							seen[m.Envelope.Attributes.MessageID]++
							mu.Unlock()
							return nil
						})
						if err != nil {
							t.Error(err)
							return
						}
						if n == 0 {
							return
						}
					}
				})
			}
			wg.Wait()
			if len(seen) != total {
				t.Fatalf("dispatched %d distinct messages, want %d", len(seen), total)
			}
			if db.Kind == storetest.Postgres { // SQLite: one relay per process, see package doc
				for id, n := range seen {
					if n != 1 {
						t.Fatalf("%s dispatched %d times", id, n)
					}
				}
			}
		})

		t.Run("inbox", func(t *testing.T) {
			if ok, err := st.Processed(ctx, "ep", "m1"); ok || err != nil {
				t.Fatalf("Processed = %v, %v", ok, err)
			}
			for range 2 {
				if err := st.MarkProcessed(ctx, "ep", "m1"); err != nil {
					t.Fatal(err)
				}
			}
			if ok, err := st.Processed(ctx, "ep", "m1"); !ok || err != nil {
				t.Fatalf("Processed = %v, %v", ok, err)
			}
			if ok, _ := st.Processed(ctx, "other", "m1"); ok {
				t.Fatal("records leak across endpoints")
			}
			claim := func() bool {
				var first bool
				err := st.InTx(ctx, func(ctx context.Context, tx *store.Tx) (err error) {
					first, err = st.ClaimHandler(ctx, tx, "ep", "m2", "h")
					return err
				})
				if err != nil {
					t.Fatal(err)
				}
				return first
			}
			if !claim() || claim() {
				t.Fatal("ClaimHandler: want true then false")
			}
			if n, err := st.PurgeProcessed(ctx, time.Now().Add(time.Hour)); err != nil || n != 2 {
				t.Fatalf("PurgeProcessed = %d, %v; want 2", n, err)
			}
		})
	})
}
