package sqlstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/plugbus/plugbus/internal/sqlstore"
	"github.com/plugbus/plugbus/store"
	"github.com/plugbus/plugbus/store/storetest"
)

// claimInOwnTx claims (endpoint, messageID, handler) in a transaction of
// its own that commits, and reports whether the claim was the first.
func claimInOwnTx(t *testing.T, st *sqlstore.Store, endpoint, messageID, handler string) bool {
	t.Helper()
	var first bool
	err := st.InTx(context.Background(), func(ctx context.Context, tx *sqlstore.Tx) (err error) {
		first, err = st.ClaimHandler(ctx, tx, endpoint, messageID, handler)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return first
}

// A handler's claim of a message succeeds once; another handler, or the
// same handler at another endpoint, claims it on its own.
func TestClaimHandlerSucceedsOncePerHandler(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		st := openMigrated(t, db)
		if !claimInOwnTx(t, st, "ep", "m1", "h") {
			t.Fatal("first claim refused")
		}
		if claimInOwnTx(t, st, "ep", "m1", "h") {
			t.Fatal("second claim of the same handler accepted")
		}
		if !claimInOwnTx(t, st, "ep", "m1", "other") || !claimInOwnTx(t, st, "other-ep", "m1", "h") {
			t.Fatal("a claim by another handler or at another endpoint refused")
		}
	})
}

// A released claim is withdrawn with its transaction: the handler claims
// the message again next time.
func TestReleasedClaimIsClaimedAgain(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		st := openMigrated(t, db)
		err := st.InTx(context.Background(), func(ctx context.Context, tx *sqlstore.Tx) error {
			if _, err := st.ClaimHandler(ctx, tx, "ep", "m1", "h"); err != nil {
				return err
			}
			return st.ReleaseHandler(ctx, tx, "ep", "m1", "h")
		})
		if err != nil {
			t.Fatal(err)
		}
		if !claimInOwnTx(t, st, "ep", "m1", "h") {
			t.Fatal("a released claim was not claimed again")
		}
	})
}

// PurgeProcessed deletes the handler records as well as the message
// records.
func TestPurgeProcessedDeletesHandlerRecords(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		ctx := context.Background()
		st := openMigrated(t, db)
		admin := (*store.Store)(st)
		if err := admin.MarkProcessed(ctx, "ep", "m1"); err != nil {
			t.Fatal(err)
		}
		claimInOwnTx(t, st, "ep", "m2", "h")
		if n, err := admin.PurgeProcessed(ctx, time.Now().Add(time.Hour)); err != nil || n != 2 {
			t.Fatalf("PurgeProcessed = %d, %v; want 2", n, err)
		}
		if !claimInOwnTx(t, st, "ep", "m2", "h") {
			t.Fatal("the purged handler record still refuses the claim")
		}
	})
}

// A purge deletes in chunks, statement after statement, until none is
// left older than its time: all of a backlog larger than a chunk, and
// nothing newer.
func TestPurgesDeleteInChunks(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		ctx := context.Background()
		st := openMigrated(t, db)
		st.SetPurgeChunk(2)
		admin := (*store.Store)(st)
		for _, id := range []string{"m1", "m2", "m3", "m4", "m5"} {
			if err := admin.MarkProcessed(ctx, "ep", id); err != nil {
				t.Fatal(err)
			}
		}
		cut := time.Now()
		if err := admin.MarkProcessed(ctx, "ep", "kept"); err != nil { // after the cut
			t.Fatal(err)
		}
		if n, err := admin.PurgeProcessed(ctx, cut); err != nil || n != 5 {
			t.Fatalf("PurgeProcessed = %d, %v; want 5 in chunks of 2", n, err)
		}
		if ok, _ := admin.Processed(ctx, "ep", "kept"); !ok {
			t.Fatal("a newer record was purged")
		}

		storeEach(t, st, testMessages(3)...)
		if got, _, err := dispatchedIDs(t, st, 10); err != nil || len(got) != 3 {
			t.Fatalf("dispatched %v, %v", got, err)
		}
		if n, err := admin.PurgeDispatched(ctx, time.Now().Add(time.Hour)); err != nil || n != 3 {
			t.Fatalf("PurgeDispatched = %d, %v; want 3 in chunks of 2", n, err)
		}
	})
}
