package store_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/plugbus/plugbus/store"
	"github.com/plugbus/plugbus/store/sqlite"
)

// A store is opened once and handed to outbox.New and inbox.New; its own
// methods operate the tables: create them, and watch what waits in the
// outbox.
func Example() {
	dir, _ := os.MkdirTemp("", "store-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()

	st, err := sqlite.Open(filepath.Join(dir, "app.db"), store.WithOutboxTable("orders_outbox"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil { // the plugins do it when the bus starts
		fmt.Println(err)
		return
	}
	pending, _ := st.Pending(ctx)
	parked, _ := st.ParkedCount(ctx)
	fmt.Println(st.Dialect(), st.OutboxTable(), st.InboxTable())
	fmt.Println("pending:", pending, "parked:", parked)
	// Output:
	// sqlite orders_outbox plugbus_inbox
	// pending: 0 parked: 0
}

// Table names are put in SQL text: a name that is not an identifier is
// refused before the database is touched.
func ExampleInvalidNameError() {
	dir, _ := os.MkdirTemp("", "store-example")
	defer os.RemoveAll(dir)

	_, err := sqlite.Open(filepath.Join(dir, "app.db"), store.WithInboxTable("inbox; DROP TABLE orders"))
	var ie *store.InvalidNameError
	fmt.Println(errors.Is(err, store.ErrInvalidName), errors.As(err, &ie) && ie.Option == "WithInboxTable")
	// Output:
	// true true
}
