package sqlstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/sqlstore"
	"github.com/plugbus/plugbus/store"
	"github.com/plugbus/plugbus/store/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testMessage returns the i-th test message: a send to "dest" with a
// one-hop and a sticky attribute and a native header.
func testMessage(i int) bus.Outbound {
	attrs := bus.NewAttributes(fmt.Sprintf("id-%d", i), "corr", time.Unix(1700000000, 123).UTC(),
		map[string]string{"one": "hop"}, map[string]string{"tenant": "t1"})
	return bus.Outbound{Kind: bus.KindSend, Destination: "dest",
		Envelope: &bus.Envelope{Name: "test.msg", ContentType: "application/json", Body: fmt.Appendf(nil, `{"n":%d}`, i),
			Attributes: attrs, Headers: bus.Headers{"x-h": "v"}}}
}

// testMessages returns the test messages 0 to n-1.
func testMessages(n int) []bus.Outbound {
	ms := make([]bus.Outbound, n)
	for i := range ms {
		ms[i] = testMessage(i)
	}
	return ms
}

// openMigrated opens a store on db with its tables created, closed when
// the test ends.
func openMigrated(t testing.TB, db storetest.DB, opts ...store.Option) *sqlstore.Store {
	t.Helper()
	st := (*sqlstore.Store)(db.Open(t, opts...))
	if err := st.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return st
}

// storeEach stores each message in a transaction of its own, as separate
// handlers would.
func storeEach(t testing.TB, st *sqlstore.Store, ms ...bus.Outbound) {
	t.Helper()
	for _, m := range ms {
		if err := st.InTx(context.Background(), func(ctx context.Context, tx *sqlstore.Tx) error { return tx.Add(ctx, m) }); err != nil {
			t.Fatal(err)
		}
	}
}

// dispatchedIDs dispatches up to limit pending messages and returns the
// ids handed to the transport, in order, with DispatchPending's results.
func dispatchedIDs(t testing.TB, st *sqlstore.Store, limit int) ([]string, int, error) {
	t.Helper()
	var ids []string
	n, err := st.DispatchPending(context.Background(), limit, func(_ context.Context, m bus.Outbound) error {
		ids = append(ids, m.Envelope.Attributes.MessageID)
		return nil
	})
	return ids, n, err
}

// makeDue makes every refused row due now, as a later round would see it
// once its backoff ended.
func makeDue(t testing.TB, st *sqlstore.Store) {
	t.Helper()
	storetest.Exec(t, st.DB(), "UPDATE "+st.OutboxTable()+" SET next_attempt_at = 0")
}
