package sqlstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/sqlstore"
	"github.com/plugbus/plugbus/store"
	"github.com/plugbus/plugbus/store/storetest"
)

// A dispatched message is the stored one: id, name, body, kind,
// destination, correlation id, sent-at, one-hop and sticky attributes and
// native headers; messages are dispatched oldest first.
func TestDispatchedMessageIsTheStoredOne(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		st := openMigrated(t, db)
		storeEach(t, st, testMessages(5)...)
		var got []bus.Outbound
		n, err := st.DispatchPending(context.Background(), 10, func(_ context.Context, m bus.Outbound) error {
			got = append(got, m)
			return nil
		})
		if n != 5 || err != nil {
			t.Fatalf("DispatchPending = %d, %v; want 5, nil", n, err)
		}
		for i, m := range got {
			want := testMessage(i)
			e := m.Envelope
			if e.Attributes.MessageID != want.Envelope.Attributes.MessageID || e.Name != "test.msg" || string(e.Body) != string(want.Envelope.Body) ||
				m.Kind != bus.KindSend || m.Destination != "dest" || e.Headers["x-h"] != "v" || e.ContentType != "application/json" ||
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
		if p, err := (*store.Store)(st).Pending(context.Background()); err != nil || p != 0 {
			t.Fatalf("pending = %d after dispatching everything (err %v)", p, err)
		}
	})
}

// Native headers and attributes whose names or values are not valid
// UTF-8 (binary: a signature an outgoing middleware computed, say) are
// dispatched byte for byte as they were stored, as a transport carries
// them without the outbox; JSON would replace each invalid byte with
// U+FFFD.
func TestBinaryHeadersAndAttributesSurviveTheOutbox(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		st := openMigrated(t, db)
		const bin = "\xff\x00sig\xfe"
		m := testMessage(0)
		m.Envelope.Headers = bus.Headers{"x-h": "v", "x-sig": bin, "x-\xff": "named"}
		m.Envelope.Attributes = bus.NewAttributes("id-0", "corr", m.Envelope.Attributes.SentAt,
			map[string]string{"one": "hop", "raw": bin}, map[string]string{"tenant": "t1", "raw\xfe": bin})
		storeEach(t, st, m)
		var got bus.Outbound
		if n, err := st.DispatchPending(context.Background(), 10, func(_ context.Context, m bus.Outbound) error {
			got = m
			return nil
		}); n != 1 || err != nil {
			t.Fatalf("DispatchPending = %d, %v; want 1, nil", n, err)
		}
		e := got.Envelope
		if len(e.Headers) != 3 || e.Headers["x-h"] != "v" || e.Headers["x-sig"] != bin || e.Headers["x-\xff"] != "named" {
			t.Errorf("headers %q, want %q", e.Headers, m.Envelope.Headers)
		}
		values := map[string]string{}
		for k, v := range e.Attributes.Values() {
			values[k] = v
		}
		sticky := map[string]string{}
		for k, v := range e.Attributes.StickyValues() {
			sticky[k] = v
		}
		if len(values) != 2 || values["one"] != "hop" || values["raw"] != bin {
			t.Errorf("one-hop attributes %q", values)
		}
		if len(sticky) != 2 || sticky["tenant"] != "t1" || sticky["raw\xfe"] != bin {
			t.Errorf("sticky attributes %q", sticky)
		}
	})
}

// A message the transport refuses waits for its backoff while the others
// are dispatched, and the error says when it is due again.
func TestRefusedMessageWaitsForItsBackoff(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		ctx := context.Background()
		// The delay is drawn from [0, 100 years]: within a second of now
		// about once in 3·10⁹ runs, so that the row is never due yet when
		// dispatched again below.
		const century = 100 * 365 * 24 * time.Hour
		backoff := bus.Backoff{Initial: century, Max: century}
		st := openMigrated(t, db, store.WithBackoff(backoff))
		storeEach(t, st, testMessages(3)...)
		fail := errors.New("transport down")
		before := time.Now()
		n, err := st.DispatchPending(ctx, 10, func(_ context.Context, m bus.Outbound) error {
			if m.Envelope.Attributes.MessageID == "id-1" {
				return fail
			}
			return nil
		})
		var de *sqlstore.DispatchError
		if n != 2 || !errors.As(err, &de) || !errors.Is(err, fail) || de.MessageID != "id-1" || de.Attempts != 1 || de.Parked {
			t.Fatalf("DispatchPending = %d, %v; want 2, a DispatchError for id-1 after 1 attempt, not parked", n, err)
		}
		if early, late := before, time.Now().Add(backoff.Ceiling(1)); de.RetryAt.Before(early) || de.RetryAt.After(late) {
			t.Fatalf("RetryAt = %v, want between %v and %v (within the first back-off)", de.RetryAt, early, late)
		}
		if p, _ := (*store.Store)(st).Pending(ctx); p != 1 {
			t.Fatalf("pending = %d, want 1", p)
		}
		if ids, n, err := dispatchedIDs(t, st, 10); n != 0 || err != nil {
			t.Fatalf("DispatchPending before the backoff ended (due at %v) = %d %v, %v; want nothing", de.RetryAt, n, ids, err)
		}
		makeDue(t, st)
		if ids, n, err := dispatchedIDs(t, st, 10); n != 1 || err != nil || fmt.Sprint(ids) != "[id-1]" {
			t.Fatalf("DispatchPending once due = %d %v, %v; want id-1", n, ids, err)
		}
	})
}

// PurgeDispatched deletes the dispatched rows and leaves the pending ones.
func TestPurgeDispatchedKeepsPendingRows(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		ctx := context.Background()
		st := openMigrated(t, db)
		storeEach(t, st, testMessages(3)...)
		if _, n, err := dispatchedIDs(t, st, 2); n != 2 || err != nil {
			t.Fatalf("DispatchPending = %d, %v; want 2", n, err)
		}
		admin := (*store.Store)(st)
		if n, err := admin.PurgeDispatched(ctx, time.Now().Add(-time.Hour)); err != nil || n != 0 {
			t.Fatalf("PurgeDispatched of rows older than an hour = %d, %v; want 0", n, err)
		}
		if n, err := admin.PurgeDispatched(ctx, time.Now().Add(time.Hour)); err != nil || n != 2 {
			t.Fatalf("PurgeDispatched = %d, %v; want 2", n, err)
		}
		if p, _ := admin.Pending(ctx); p != 1 {
			t.Fatalf("pending = %d after the purge, want 1", p)
		}
	})
}

// Relays on separate connection pools (like separate processes) dispatch
// every row; on PostgreSQL each exactly once (SKIP LOCKED). SQLite runs
// one relay per process and database file (see the package doc), so there
// only completeness is checked.
func TestConcurrentRelaysDispatchEachRowOnce(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		const total = 2000
		st := openMigrated(t, db)
		err := st.InTx(context.Background(), func(ctx context.Context, tx *sqlstore.Tx) error {
			for _, m := range testMessages(total) {
				if err := tx.Add(ctx, m); err != nil {
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
			relay := (*sqlstore.Store)(db.Open(t))
			wg.Go(func() {
				for {
					n, err := relay.DispatchPending(context.Background(), 50, func(_ context.Context, m bus.Outbound) error {
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
		if db.Kind == storetest.Postgres {
			for id, n := range seen {
				if n != 1 {
					t.Fatalf("%s dispatched %d times", id, n)
				}
			}
		}
	})
}

// A message the transport refuses does not hold up the ones behind it; it
// is retried after its own backoff and parked after the last attempt, then
// listed and requeued.
func TestRefusedMessageIsParked(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		ctx := context.Background()
		st := openMigrated(t, db, store.WithDispatchAttempts(3), store.WithBackoff(bus.Backoff{Initial: time.Millisecond, Max: time.Millisecond}))
		admin := (*store.Store)(st)
		poison := testMessage(0)
		poison.Envelope.Name = "test.poison"
		storeEach(t, st, poison)
		for i := 1; i <= 20; i++ {
			storeEach(t, st, testMessage(i))
		}
		refuse := errors.New("message too large")
		delivered := map[string]int{}
		dispatch := func(_ context.Context, m bus.Outbound) error {
			if m.Envelope.Name == "test.poison" {
				return refuse
			}
			delivered[m.Envelope.Attributes.MessageID]++
			return nil
		}
		n, err := st.DispatchPending(ctx, 500, dispatch)
		if n != 20 || !errors.Is(err, refuse) || errors.Is(err, sqlstore.ErrParked) {
			t.Fatalf("first round = %d, %v; want 20 dispatched and the poison refused, not parked", n, err)
		}
		var parked *sqlstore.DispatchError
		deadline := time.Now().Add(10 * time.Second)
		for parked == nil {
			if time.Now().After(deadline) {
				t.Fatal("poison not parked after 3 attempts")
			}
			n, err := st.DispatchPending(ctx, 500, dispatch)
			if n != 0 {
				t.Fatalf("round dispatched %d, want 0", n)
			}
			var de *sqlstore.DispatchError
			if errors.As(err, &de) && de.Parked {
				parked = de
			}
		}
		if parked.Attempts != 3 || !errors.Is(parked, sqlstore.ErrParked) || !errors.Is(parked, refuse) {
			t.Fatalf("parked = %+v", parked)
		}
		if len(delivered) != 20 {
			t.Fatalf("delivered %d distinct, want 20", len(delivered))
		}
		if p, err := admin.Pending(ctx); err != nil || p != 0 {
			t.Fatalf("pending = %d, want 0 (parked rows are not pending) (err %v)", p, err)
		}
		if c, _ := admin.ParkedCount(ctx); c != 1 {
			t.Fatalf("ParkedCount = %d, want 1", c)
		}
		// A parked row is not dispatched again.
		if n, err := st.DispatchPending(ctx, 500, dispatch); n != 0 || err != nil {
			t.Fatalf("round after parking = %d, %v", n, err)
		}
		list, err := admin.Parked(ctx, 0, 10)
		if err != nil || len(list) != 1 {
			t.Fatalf("Parked = %v, %v", list, err)
		}
		p := list[0]
		if p.MessageID != "id-0" || p.Name != "test.poison" || p.Attempts != 3 || p.LastError != refuse.Error() || p.Destination != "dest" || p.Kind != bus.KindSend || p.ParkedAt.IsZero() {
			t.Fatalf("parked row = %+v", p)
		}
		if more, _ := admin.Parked(ctx, p.ID, 10); len(more) != 0 {
			t.Fatalf("page after the last = %v", more)
		}
		// Requeued, it is dispatched once the cause is fixed.
		if n, err := admin.Requeue(ctx, p.ID, 999999); n != 1 || err != nil {
			t.Fatalf("Requeue = %d, %v", n, err)
		}
		n, err = st.DispatchPending(ctx, 500, func(context.Context, bus.Outbound) error { return nil })
		if n != 1 || err != nil {
			t.Fatalf("after Requeue = %d, %v", n, err)
		}
		if c, err := admin.ParkedCount(ctx); err != nil || c != 0 {
			t.Fatalf("ParkedCount after requeue = %d (err %v)", c, err)
		}
	})
}

// A row that cannot be decoded is parked at once; the others go on.
func TestUndecodableRowIsParked(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		ctx := context.Background()
		st := openMigrated(t, db)
		admin := (*store.Store)(st)
		storeEach(t, st, testMessages(3)...)
		storetest.Exec(t, st.DB(), db.Rebind("UPDATE "+st.OutboxTable()+" SET headers = '{not json' WHERE message_id = ?"), "id-1")
		var got []string
		n, err := st.DispatchPending(ctx, 10, func(_ context.Context, m bus.Outbound) error {
			got = append(got, m.Envelope.Attributes.MessageID)
			return nil
		})
		var de *sqlstore.DispatchError
		if n != 2 || !errors.As(err, &de) || !de.Parked || !de.RetryAt.IsZero() || de.MessageID != "id-1" || fmt.Sprint(got) != "[id-0 id-2]" {
			t.Fatalf("DispatchPending = %d, %v, %v; want id-0 and id-2 dispatched, id-1 parked (no retry time)", n, err, got)
		}
		if c, _ := admin.ParkedCount(ctx); c != 1 {
			t.Fatalf("ParkedCount = %d", c)
		}
	})
}

// A row whose columns the relay cannot read at all (a value of another
// type, as a hand-written UPDATE leaves on SQLite; a NULL, as a
// hand-made schema without NOT NULL lets through on PostgreSQL) is
// parked at once, as an undecodable one: it does not fail every round,
// holding up every message behind it for good.
func TestUnreadableRowIsParked(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		ctx := context.Background()
		st := openMigrated(t, db)
		admin := (*store.Store)(st)
		storeEach(t, st, testMessages(3)...)
		if db.Kind == storetest.SQLite {
			storetest.Exec(t, st.DB(), "UPDATE "+st.OutboxTable()+" SET sent_at = 'yesterday' WHERE message_id = 'id-1'")
		} else {
			storetest.Exec(t, st.DB(), "ALTER TABLE "+st.OutboxTable()+" ALTER COLUMN correlation_id DROP NOT NULL")
			storetest.Exec(t, st.DB(), "UPDATE "+st.OutboxTable()+" SET correlation_id = NULL WHERE message_id = 'id-1'")
		}
		got, n, err := dispatchedIDs(t, st, 10)
		var de *sqlstore.DispatchError
		if n != 2 || !errors.As(err, &de) || !de.Parked || de.MessageID != "id-1" || de.Name != "test.msg" || fmt.Sprint(got) != "[id-0 id-2]" {
			t.Fatalf("DispatchPending = %d, %v, %v; want id-0 and id-2 dispatched, id-1 parked", n, err, got)
		}
		if c, _ := admin.ParkedCount(ctx); c != 1 {
			t.Fatalf("ParkedCount = %d", c)
		}
		if p, _ := admin.Pending(ctx); p != 0 {
			t.Fatalf("Pending = %d, want 0", p)
		}
	})
}

// Cancelling the relay's context (bus.Stop) in the middle of a batch
// records what was already dispatched: nothing is sent twice, and the
// interrupted send is not counted as a failed attempt.
func TestCancelMidBatchMarksDispatched(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		ctx := context.Background()
		st := openMigrated(t, db)
		admin := (*store.Store)(st)
		storeEach(t, st, testMessages(10)...)
		rctx, cancel := context.WithCancel(ctx)
		defer cancel()
		sent := 0
		n, err := st.DispatchPending(rctx, 500, func(ctx context.Context, m bus.Outbound) error {
			if err := ctx.Err(); err != nil {
				return err // what a transport does with a cancelled context
			}
			sent++
			if sent == 5 {
				cancel()
			}
			return nil
		})
		if n != 5 || sent != 5 || !errors.Is(err, context.Canceled) {
			t.Fatalf("DispatchPending = %d, %v (sent %d); want 5, context.Canceled", n, err, sent)
		}
		var de *sqlstore.DispatchError
		if errors.As(err, &de) {
			t.Fatalf("cancellation recorded as a dispatch error: %v", de)
		}
		if p, _ := admin.Pending(ctx); p != 5 {
			t.Fatalf("pending = %d, want 5 (the 5 dispatched must be marked)", p)
		}
		var attempts int
		if err := st.DB().QueryRowContext(ctx, "SELECT COALESCE(SUM(attempts), 0) FROM "+st.OutboxTable()+" WHERE dispatched_at IS NULL").Scan(&attempts); err != nil || attempts != 0 {
			t.Fatalf("attempts of the undispatched rows = %d, %v; want 0", attempts, err)
		}
	})
}

// A stored message's due time is kept and handed to the transport at
// once, whether it lies ahead or has passed: the relay never waits for it
// (the transport carries the delay), and a message without one has none.
func TestDueTimeIsStoredAndHandedOnAtOnce(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		st := openMigrated(t, db)
		ahead, passed := time.Now().Add(time.Hour).Round(0), time.Now().Add(-time.Hour).Round(0)
		ms := testMessages(3)
		ms[0].Envelope.Due, ms[1].Envelope.Due = ahead, passed
		storeEach(t, st, ms...)
		var dues []time.Time
		n, err := st.DispatchPending(context.Background(), 10, func(_ context.Context, m bus.Outbound) error {
			dues = append(dues, m.Envelope.Due)
			return nil
		})
		if err != nil || n != 3 {
			t.Fatalf("DispatchPending = %d, %v; want all 3 at once", n, err)
		}
		if !dues[0].Equal(ahead) || !dues[1].Equal(passed) || !dues[2].IsZero() {
			t.Fatalf("dispatched with due times %v, want %v, %v and zero", dues, ahead, passed)
		}
	})
}
