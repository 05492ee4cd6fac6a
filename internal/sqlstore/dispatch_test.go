package store_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/store"
	"github.com/plugbus/plugbus/store/storetest"
)

func addAll(t *testing.T, st *store.Store, ms ...bus.Outbound) {
	t.Helper()
	for _, m := range ms { // one transaction each, like separate handlers
		if err := st.InTx(context.Background(), func(ctx context.Context, tx *store.Tx) error { return tx.Add(ctx, m) }); err != nil {
			t.Fatal(err)
		}
	}
}

// A message the transport refuses does not hold up the ones behind it; it
// is retried after its own backoff and parked after the last attempt, then
// listed and requeued.
func TestRefusedMessageIsParked(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		ctx := context.Background()
		st := db.Open(t, store.WithDispatchAttempts(3), store.WithDispatchBackoff(time.Millisecond, time.Millisecond))
		if err := st.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		poison := outbound(0)
		poison.Envelope.Name = "test.poison"
		addAll(t, st, poison)
		for i := 1; i <= 20; i++ {
			addAll(t, st, outbound(i))
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
		if n != 20 || !errors.Is(err, refuse) || errors.Is(err, store.ErrParked) {
			t.Fatalf("first round = %d, %v; want 20 dispatched and the poison refused, not parked", n, err)
		}
		var parked *store.DispatchError
		deadline := time.Now().Add(10 * time.Second)
		for parked == nil {
			if time.Now().After(deadline) {
				t.Fatal("poison not parked after 3 attempts")
			}
			n, err := st.DispatchPending(ctx, 500, dispatch)
			if n != 0 {
				t.Fatalf("round dispatched %d, want 0", n)
			}
			var de *store.DispatchError
			if errors.As(err, &de) && de.Parked {
				parked = de
			}
		}
		if parked.Attempts != 3 || !errors.Is(parked, store.ErrParked) || !errors.Is(parked, refuse) {
			t.Fatalf("parked = %+v", parked)
		}
		if len(delivered) != 20 {
			t.Fatalf("delivered %d distinct, want 20", len(delivered))
		}
		if p, _ := st.Pending(ctx); p != 0 {
			t.Fatalf("pending = %d, want 0 (parked rows are not pending)", p)
		}
		if c, _ := st.ParkedCount(ctx); c != 1 {
			t.Fatalf("ParkedCount = %d, want 1", c)
		}
		// A parked row is not dispatched again.
		if n, err := st.DispatchPending(ctx, 500, dispatch); n != 0 || err != nil {
			t.Fatalf("round after parking = %d, %v", n, err)
		}
		list, err := st.Parked(ctx, 0, 10)
		if err != nil || len(list) != 1 {
			t.Fatalf("Parked = %v, %v", list, err)
		}
		p := list[0]
		if p.MessageID != "id-0" || p.Name != "test.poison" || p.Attempts != 3 || p.LastError != refuse.Error() || p.Destination != "dest" || p.Kind != bus.KindSend || p.ParkedAt.IsZero() {
			t.Fatalf("parked row = %+v", p)
		}
		if more, _ := st.Parked(ctx, p.ID, 10); len(more) != 0 {
			t.Fatalf("page after the last = %v", more)
		}
		// Requeued, it is dispatched once the cause is fixed.
		if n, err := st.Requeue(ctx, p.ID, 999999); n != 1 || err != nil {
			t.Fatalf("Requeue = %d, %v", n, err)
		}
		n, err = st.DispatchPending(ctx, 500, func(context.Context, bus.Outbound) error { return nil })
		if n != 1 || err != nil {
			t.Fatalf("after Requeue = %d, %v", n, err)
		}
		if c, _ := st.ParkedCount(ctx); c != 0 {
			t.Fatalf("ParkedCount after requeue = %d", c)
		}
	})
}

// A row that cannot be decoded is parked at once; the others go on.
func TestUndecodableRowIsParked(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		ctx := context.Background()
		st := db.Open(t)
		if err := st.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		addAll(t, st, outbound(0), outbound(1), outbound(2))
		storetest.Exec(t, st.DB(), db.Rebind("UPDATE "+st.OutboxTable()+" SET headers = '{not json' WHERE message_id = ?"), "id-1")
		var got []string
		n, err := st.DispatchPending(ctx, 10, func(_ context.Context, m bus.Outbound) error {
			got = append(got, m.Envelope.Attributes.MessageID)
			return nil
		})
		var de *store.DispatchError
		if n != 2 || !errors.As(err, &de) || !de.Parked || !de.RetryAt.IsZero() || de.MessageID != "id-1" || fmt.Sprint(got) != "[id-0 id-2]" {
			t.Fatalf("DispatchPending = %d, %v, %v; want id-0 and id-2 dispatched, id-1 parked (no retry time)", n, err, got)
		}
		if c, _ := st.ParkedCount(ctx); c != 1 {
			t.Fatalf("ParkedCount = %d", c)
		}
	})
}

// Cancelling the relay's context (bus.Stop) in the middle of a batch
// records what was already dispatched: nothing is sent twice, and the
// interrupted send is not counted as a failed attempt.
func TestCancelMidBatchMarksDispatched(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		ctx := context.Background()
		st := db.Open(t)
		if err := st.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		ms := make([]bus.Outbound, 10)
		for i := range ms {
			ms[i] = outbound(i)
		}
		addAll(t, st, ms...)
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
		var de *store.DispatchError
		if errors.As(err, &de) {
			t.Fatalf("cancellation recorded as a dispatch error: %v", de)
		}
		if p, _ := st.Pending(ctx); p != 5 {
			t.Fatalf("pending = %d, want 5 (the 5 dispatched must be marked)", p)
		}
		var attempts int
		if err := st.DB().QueryRowContext(ctx, "SELECT COALESCE(SUM(attempts), 0) FROM "+st.OutboxTable()+" WHERE dispatched_at IS NULL").Scan(&attempts); err != nil || attempts != 0 {
			t.Fatalf("attempts of the undispatched rows = %d, %v; want 0", attempts, err)
		}
	})
}

// Migrate adds the columns of this release to an outbox table created by
// an earlier one, keeping its rows.
func TestMigrateAddsColumns(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		ctx := context.Background()
		st := db.Open(t)
		blob, serial := "BLOB", "INTEGER PRIMARY KEY"
		if db.Kind == storetest.Postgres {
			blob, serial = "BYTEA", "BIGSERIAL PRIMARY KEY"
		}
		storetest.Exec(t, st.DB(), `CREATE TABLE `+st.OutboxTable()+` (id `+serial+`, message_id TEXT NOT NULL, kind SMALLINT NOT NULL,
	destination TEXT NOT NULL, name TEXT NOT NULL, content_type TEXT NOT NULL, body `+blob+` NOT NULL, correlation_id TEXT NOT NULL,
	sent_at BIGINT NOT NULL, attrs TEXT NOT NULL, headers TEXT NOT NULL, created_at BIGINT NOT NULL, dispatched_at BIGINT,
	attempts INTEGER NOT NULL DEFAULT 0, last_error TEXT)`)
		storetest.Exec(t, st.DB(), `INSERT INTO `+st.OutboxTable()+` (message_id, kind, destination, name, content_type, body, correlation_id, sent_at, attrs, headers, created_at)
	VALUES ('old-1', 1, 'dest', 'test.msg', 'application/json', '{}', 'c', 0, '{}', '{}', 0)`)
		for range 2 { // idempotent
			if err := st.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			if err := db.Open(t).Migrate(ctx); err != nil {
				t.Fatal(err)
			}
		}
		var got []string
		n, err := st.DispatchPending(ctx, 10, func(_ context.Context, m bus.Outbound) error {
			got = append(got, m.Envelope.Attributes.MessageID)
			return nil
		})
		if n != 1 || err != nil || got[0] != "old-1" {
			t.Fatalf("DispatchPending on a migrated table = %d, %v, %v", n, err, got)
		}
	})
}
