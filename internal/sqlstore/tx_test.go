package sqlstore_test

import (
	"context"
	"errors"
	"testing"

	"github.com/plugbus/plugbus/internal/sqlstore"
	"github.com/plugbus/plugbus/store"
	"github.com/plugbus/plugbus/store/storetest"
)

// A transaction whose function fails stores none of its messages.
func TestRollbackStoresNothing(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		ctx := context.Background()
		st := openMigrated(t, db)
		boom := errors.New("boom")
		err := st.InTx(ctx, func(ctx context.Context, tx *sqlstore.Tx) error {
			if err := tx.Add(ctx, testMessage(0)); err != nil {
				return err
			}
			return boom
		})
		if !errors.Is(err, boom) {
			t.Fatalf("InTx = %v, want boom", err)
		}
		if n, err := (*store.Store)(st).Pending(ctx); err != nil || n != 0 {
			t.Fatalf("pending = %d after rollback (err %v)", n, err)
		}
	})
}

// InTx within a transaction of the same store joins it, and it is that
// transaction the context carries.
func TestInTxJoinsTheTransactionInItsContext(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		st := openMigrated(t, db)
		err := st.InTx(context.Background(), func(ctx context.Context, outer *sqlstore.Tx) error {
			if sqlstore.TxFrom(ctx) != outer {
				return errors.New("the context does not carry the transaction")
			}
			return st.InTx(ctx, func(_ context.Context, inner *sqlstore.Tx) error {
				if inner != outer {
					return errors.New("a nested InTx opened a second transaction")
				}
				return nil
			})
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}

// A commit that stored messages wakes the relays of the process; one
// that stored none does not.
func TestCommitOfMessagesWakesTheRelays(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		ctx := context.Background()
		st := openMigrated(t, db)
		woken := st.Committed()
		if err := st.InTx(ctx, func(context.Context, *sqlstore.Tx) error { return nil }); err != nil {
			t.Fatal(err)
		}
		select {
		case <-woken:
			t.Fatal("a commit without messages woke the relays")
		default:
		}
		if err := st.InTx(ctx, func(ctx context.Context, tx *sqlstore.Tx) error { return tx.Add(ctx, testMessage(0)) }); err != nil {
			t.Fatal(err)
		}
		select {
		case <-woken:
		default:
			t.Fatal("the commit did not wake the relays")
		}
	})
}
