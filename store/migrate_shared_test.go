package store_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/plugbus/plugbus/store"
	"github.com/plugbus/plugbus/store/storetest"
)

// Migrate is safe to run from several processes at once, also for stores
// with tables of their own that share one (the saga table, by default).
func TestConcurrentMigrateOfStoresSharingATable(t *testing.T) {
	db := storetest.New(t, storetest.Postgres)
	for round := range 10 {
		saga := db.Table(fmt.Sprintf("saga_%d", round)) // fresh each round, shared by both stores
		var stores []*store.Store
		for _, svc := range []string{"orders", "billing"} {
			st, err := storetest.DB{Kind: db.Kind, DSN: db.DSN, Schema: db.Schema}.OpenStore(
				store.WithOutboxTable(db.Table(fmt.Sprintf("%s_outbox_%d", svc, round))),
				store.WithInboxTable(db.Table(fmt.Sprintf("%s_inbox_%d", svc, round))),
				store.WithSagaTable(saga))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			stores = append(stores, st)
		}
		errs := make([]error, len(stores))
		var wg sync.WaitGroup
		for i, st := range stores {
			wg.Go(func() { errs[i] = st.Migrate(context.Background()) })
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatalf("round %d: concurrent Migrate of two stores sharing the saga table: %v", round, err)
			}
		}
	}
}
