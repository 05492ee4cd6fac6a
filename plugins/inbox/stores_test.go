package inbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugins/inbox"
	"github.com/plugbus/plugbus/plugins/outbox"
	"github.com/plugbus/plugbus/store/storetest"
)

func ignoreWork(context.Context, Work, bus.Attributes) error { return nil }

// TestInboxAndOutboxOnTwoStoresAreRefused: the inbox and the outbox of
// one bus given two *store.Store values — here the same database opened
// twice — would run each handler in two transactions, so the inbox row
// would not commit with the handler's data and sends (and on SQLite the
// second would wait for the first). bus.New refuses them, in either
// order, with a *bus.TxSourceConflictError naming both plugins.
func TestInboxAndOutboxOnTwoStoresAreRefused(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		st, again := db.Open(t), db.Open(t)
		for _, tc := range []struct {
			plugins       []bus.Plugin
			first, second string
		}{
			{[]bus.Plugin{outbox.New(st), inbox.New(again)}, "outbox", "inbox"},
			{[]bus.Plugin{inbox.New(st), outbox.New(again)}, "inbox", "outbox"},
		} {
			_, err := bus.New(bus.WithEndpoint("worker"), bus.WithMiddleware(tc.plugins...), bus.WithHandler(ignoreWork))
			var conflict *bus.TxSourceConflictError
			if !errors.As(err, &conflict) || !errors.Is(err, bus.ErrTxSourceConflict) {
				t.Fatalf("New with the %s and the %s on two stores = %v; want a *bus.TxSourceConflictError", tc.first, tc.second, err)
			}
			if conflict.First != tc.first || conflict.Second != tc.second {
				t.Errorf("conflict between %q and %q; want %q and %q", conflict.First, conflict.Second, tc.first, tc.second)
			}
		}

		// One store for both, and a memory inbox beside an outbox on any
		// store (it opens no transaction), are accepted.
		if _, err := bus.New(bus.WithEndpoint("worker"), bus.WithMiddleware(outbox.New(st), inbox.New(st)), bus.WithHandler(ignoreWork)); err != nil {
			t.Fatalf("New with one store: %v", err)
		}
		if _, err := bus.New(bus.WithEndpoint("worker"), bus.WithMiddleware(outbox.New(st), inbox.New(inbox.NewMemoryStore())), bus.WithHandler(ignoreWork)); err != nil {
			t.Fatalf("New with a memory inbox: %v", err)
		}
	})
}

// TestInboxTwiceOnOneBusIsRefused: a second inbox would look every
// message up twice; bus.New refuses it with a
// *bus.DuplicateMiddlewareError naming the inbox.
func TestInboxTwiceOnOneBusIsRefused(t *testing.T) {
	db := storetest.New(t, storetest.SQLite)
	st := db.Open(t)
	for name, second := range map[string]inbox.Store{"the same store": st, "a memory store": inbox.NewMemoryStore()} {
		_, err := bus.New(bus.WithEndpoint("worker"), bus.WithMiddleware(inbox.New(st), inbox.New(second)), bus.WithHandler(ignoreWork))
		var dup *bus.DuplicateMiddlewareError
		if !errors.As(err, &dup) || dup.Middleware != "inbox" {
			t.Errorf("New with the inbox twice, %s = %v; want a *bus.DuplicateMiddlewareError for inbox", name, err)
		}
	}
}
