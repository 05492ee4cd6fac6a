package saga_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugins/inbox"
	"github.com/plugbus/plugbus/plugins/outbox"
	"github.com/plugbus/plugbus/plugins/saga"
	"github.com/plugbus/plugbus/plugins/saga/sagatest"
	"github.com/plugbus/plugbus/store/storetest"
)

// TestSagaWithoutStartedByIsRefused: a saga whose messages are all
// declared with Handles (and HandlesTimeout) can never start an
// instance, so every message would be ignored at INFO. bus.New refuses
// it with a declaration error that says to declare a StartedBy, and
// sagatest, which stands for a bus, refuses it alike.
func TestSagaWithoutStartedByIsRefused(t *testing.T) {
	db := storetest.New(t, storetest.SQLite)
	st := db.Open(t)
	s := saga.New[Order]("order", st)
	saga.Handles(s, saga.By(func(m Paid) string { return m.OrderID }), func(c *saga.Context[Order], _ Paid) error {
		c.State.Paid = true
		return nil
	})
	saga.HandlesTimeout(s, func(c *saga.Context[Order], _ PaymentOverdue) error { return nil })
	const want = "saga order: no message starts an instance: declare at least one with saga.StartedBy"
	if _, err := bus.New(bus.WithEndpoint("orders"), s.Option()); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("bus.New with a saga without StartedBy = %v; want an error containing %q", err, want)
	}
	h := sagatest.New(s, time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	if err := h.Deliver(Paid{OrderID: "o-1"}); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("sagatest Deliver with a saga without StartedBy = %v; want an error containing %q", err, want)
	}

	// Declaring a starting message makes it whole.
	saga.StartedBy(s, saga.By(func(m Placed) string { return m.OrderID }), func(*saga.Context[Order], Placed) error { return nil })
	if _, err := bus.New(bus.WithEndpoint("orders"), s.Option()); err != nil {
		t.Fatalf("bus.New once StartedBy is declared: %v", err)
	}
}

// TestSagaOnAnotherStoreThanTheOutboxIsRefused: a saga's state commits
// in a transaction of its store, which the outbox and the inbox join only
// on the same *store.Store; on another (here the same database opened
// twice) the state would commit before, and apart from, the sends and the
// inbox record. bus.New refuses it with a *bus.TxSourceConflictError
// naming the outbox and the saga.
func TestSagaOnAnotherStoreThanTheOutboxIsRefused(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		st, again := db.Open(t), db.Open(t)
		_, err := bus.New(bus.WithEndpoint("orders"),
			bus.WithMiddleware(outbox.New(st), inbox.New(st)),
			orderSaga(again, time.Hour).Option())
		var conflict *bus.TxSourceConflictError
		if !errors.As(err, &conflict) || !errors.Is(err, bus.ErrTxSourceConflict) || conflict.First != "outbox" || conflict.Second != "saga:order" {
			t.Fatalf("bus.New with the saga on another store = %v; want a *bus.TxSourceConflictError of outbox and saga:order", err)
		}
		if _, err := bus.New(bus.WithEndpoint("orders"), bus.WithMiddleware(outbox.New(st), inbox.New(st)), orderSaga(st, time.Hour).Option()); err != nil {
			t.Fatalf("bus.New with one store: %v", err)
		}
	})
}

// TestTwoSagasOfOneNameAreRefused: two sagas named alike keep their
// instances under one name in the table; bus.New refuses the second with
// a *bus.DuplicateMiddlewareError, even when their messages differ (their
// handlers, named after the saga, then do not clash).
func TestTwoSagasOfOneNameAreRefused(t *testing.T) {
	db := storetest.New(t, storetest.SQLite)
	st := db.Open(t)
	first := saga.New[Order]("order", st)
	saga.StartedBy(first, saga.By(func(m Placed) string { return m.OrderID }), func(*saga.Context[Order], Placed) error { return nil })
	second := saga.New[Order]("order", st)
	saga.StartedBy(second, saga.By(func(m Cancelled) string { return m.OrderID }), func(*saga.Context[Order], Cancelled) error { return nil })
	_, err := bus.New(bus.WithEndpoint("orders"), first.Option(), second.Option())
	var dup *bus.DuplicateMiddlewareError
	if !errors.As(err, &dup) || dup.Middleware != "saga:order" {
		t.Fatalf("bus.New with two sagas named order = %v; want a *bus.DuplicateMiddlewareError for saga:order", err)
	}
}

// TestSagaLeavesOtherHandlersToTheirOwnStore: a saga's transaction runs
// its own handlers only, so a handler of the bus that is not the saga's
// may run in a transaction of another store, with an outbox given to it
// alone (bus.HandlerMiddleware): no handler runs in two transactions, as
// with two handlers each with its own outbox. bus.New refused it with a
// *bus.TxSourceConflictError saying that "saga:order" ran that handler
// in a transaction.
func TestSagaLeavesOtherHandlersToTheirOwnStore(t *testing.T) {
	db := storetest.New(t, storetest.SQLite)
	st, reports := db.Open(t), db.Open(t)
	note := func(context.Context, Noted, bus.Attributes) error { return nil }
	if _, err := bus.New(bus.WithEndpoint("orders"), orderSaga(st, time.Hour).Option(),
		bus.WithHandler(note, bus.HandlerName("note"), bus.HandlerMiddleware(outbox.New(reports)))); err != nil {
		t.Fatalf("bus.New with the saga on one store and another handler's own outbox on another: %v", err)
	}
	// The bus's outbox runs around the saga's handlers: it must be on the
	// saga's store (TestSagaOnAnotherStoreThanTheOutboxIsRefused), and a
	// handler's own outbox on the bus's outbox's store.
	_, err := bus.New(bus.WithEndpoint("orders"), bus.WithMiddleware(inbox.New(st)), orderSaga(st, time.Hour).Option(),
		bus.WithHandler(note, bus.HandlerName("note"), bus.HandlerMiddleware(outbox.New(reports))))
	var conflict *bus.TxSourceConflictError
	if !errors.As(err, &conflict) || conflict.First != "inbox" || conflict.Second != "outbox" || conflict.Handler != "note" {
		t.Fatalf("bus.New with the inbox on one store and a handler's outbox on another = %v; want a *bus.TxSourceConflictError of inbox and outbox around note", err)
	}
}
