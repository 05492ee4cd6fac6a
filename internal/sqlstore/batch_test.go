package sqlstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/sqlstore"
	"github.com/plugbus/plugbus/store"
	"github.com/plugbus/plugbus/store/storetest"
)

// DispatchPendingBatch hands the claimed messages over in one batch,
// oldest first; a message the batch's *bus.BatchError names waits for
// its backoff while the others are marked dispatched.
func TestDispatchPendingBatchRefusesOnlyTheNamedMessages(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		ctx := context.Background()
		st := openMigrated(t, db)
		storeEach(t, st, testMessages(4)...)
		refused := errors.New("refused by the broker")
		var calls [][]string
		n, err := st.DispatchPendingBatch(ctx, 10, func(_ context.Context, ms []bus.Outbound) error {
			var ids []string
			for _, m := range ms {
				ids = append(ids, m.Envelope.Attributes.MessageID)
			}
			calls = append(calls, ids)
			return &bus.BatchError{Len: len(ms), Failures: []bus.BatchFailure{{Index: 2, Err: refused}}}
		})
		var de *sqlstore.DispatchError
		if n != 3 || !errors.As(err, &de) || !errors.Is(err, refused) || de.MessageID != "id-2" || de.Attempts != 1 {
			t.Fatalf("DispatchPendingBatch = %d, %v; want 3, a DispatchError for id-2", n, err)
		}
		if len(calls) != 1 || len(calls[0]) != 4 || calls[0][0] != "id-0" || calls[0][3] != "id-3" {
			t.Fatalf("dispatch called with %v, want one batch of id-0 … id-3", calls)
		}
		if p, _ := (*store.Store)(st).Pending(ctx); p != 1 {
			t.Fatalf("pending = %d, want 1 (the refused one)", p)
		}
	})
}

// An error that is not a *bus.BatchError counts against every message of
// the batch: none is marked dispatched.
func TestDispatchPendingBatchWholeBatchError(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		ctx := context.Background()
		st := openMigrated(t, db)
		storeEach(t, st, testMessages(3)...)
		down := errors.New("broker unreachable")
		n, err := st.DispatchPendingBatch(ctx, 10, func(context.Context, []bus.Outbound) error { return down })
		if n != 0 || !errors.Is(err, down) {
			t.Fatalf("DispatchPendingBatch = %d, %v; want 0 and the error", n, err)
		}
		if p, _ := (*store.Store)(st).Pending(ctx); p != 3 {
			t.Fatalf("pending = %d, want 3", p)
		}
	})
}

// A transport's error text that is not valid text for the database (a NUL
// byte, invalid UTF-8: PostgreSQL refuses both in a TEXT column) is still
// recorded as the refused row's last error: the others of the batch are
// marked dispatched, not rolled back and sent again at every round.
func TestRefusalWithBinaryErrorTextIsRecorded(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		ctx := context.Background()
		st := openMigrated(t, db)
		storeEach(t, st, testMessages(3)...)
		refused := errors.New("refused: \x00\xff\xfe")
		n, err := st.DispatchPendingBatch(ctx, 10, func(_ context.Context, ms []bus.Outbound) error {
			return &bus.BatchError{Len: len(ms), Failures: []bus.BatchFailure{{Index: 1, Err: refused}}}
		})
		var de *sqlstore.DispatchError
		if n != 2 || !errors.As(err, &de) || de.MessageID != "id-1" {
			t.Fatalf("DispatchPendingBatch = %d, %v; want 2, a DispatchError for id-1", n, err)
		}
		if p, _ := (*store.Store)(st).Pending(ctx); p != 1 {
			t.Fatalf("pending = %d, want 1 (the refused one)", p)
		}
		var attempts int
		var lastError string
		if err := st.DB().QueryRowContext(ctx, "SELECT attempts, last_error FROM "+st.OutboxTable()+" WHERE message_id = 'id-1'").Scan(&attempts, &lastError); err != nil {
			t.Fatal(err)
		}
		if attempts != 1 || !strings.HasPrefix(lastError, "refused: ") {
			t.Fatalf("refused row: attempts %d, last error %q; want 1, the transport's error", attempts, lastError)
		}
	})
}
