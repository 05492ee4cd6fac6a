package bus_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/plugbus/plugbus/bus"
)

func aroundHandler(ctx context.Context, _ *bus.Handling, next *bus.HandlingNext) error {
	return next.Call(ctx)
}

func handleOrder(context.Context, orderPlaced, bus.Attributes) error { return nil }

func handleCharge(context.Context, chargeCard, bus.Attributes) error { return nil }

// A middleware marked Unique runs once around a handler: a second one of
// its name on the bus, or given to a handler that has it from the bus, is
// refused by New with a *bus.DuplicateMiddlewareError naming it. Without
// Unique, a middleware may be stacked.
func TestUniqueMiddlewareTwiceIsRefused(t *testing.T) {
	once := bus.Middleware{Name: "tracer", Unique: true, Handling: aroundHandler}
	stackable := bus.Middleware{Name: "limit", Handling: aroundHandler}
	for name, tc := range map[string]struct {
		opts                   []bus.Option
		wantHandler, wantMsg   string
		wantErrorToMentionText string
	}{
		"twice on the bus": {
			opts:                   []bus.Option{bus.WithMiddleware(once, once)},
			wantErrorToMentionText: `middleware "tracer" is registered twice on the bus`,
		},
		"twice on the bus, in two options": {
			opts:                   []bus.Option{bus.WithMiddleware(once), bus.WithOptions(bus.WithMiddleware(once))},
			wantErrorToMentionText: `middleware "tracer" is registered twice on the bus`,
		},
		"a stackable one of the same name": {
			opts:                   []bus.Option{bus.WithMiddleware(stackable, bus.Middleware{Name: "limit", Unique: true, Handling: aroundHandler})},
			wantErrorToMentionText: `middleware "limit" is registered twice on the bus`,
		},
		"on the bus and on a handler": {
			opts:                   []bus.Option{bus.WithMiddleware(once), bus.WithHandler(handleOrder, bus.HandlerName("place"), bus.HandlerMiddleware(once))},
			wantHandler:            "place",
			wantMsg:                "shop.order_placed",
			wantErrorToMentionText: `middleware "tracer" runs twice around handler place of shop.order_placed`,
		},
		"twice on a handler": {
			opts:                   []bus.Option{bus.WithHandler(handleOrder, bus.HandlerName("place"), bus.HandlerMiddleware(once, once))},
			wantHandler:            "place",
			wantMsg:                "shop.order_placed",
			wantErrorToMentionText: `middleware "tracer" runs twice around handler place`,
		},
	} {
		_, err := bus.New(append([]bus.Option{bus.WithEndpoint("ep"), bus.WithLogger(discard()), bus.WithHandler(handleCharge)}, tc.opts...)...)
		var dup *bus.DuplicateMiddlewareError
		if !errors.As(err, &dup) || !errors.Is(err, bus.ErrDuplicateMiddleware) {
			t.Errorf("%s: New = %v; want a *bus.DuplicateMiddlewareError", name, err)
			continue
		}
		if dup.Handler != tc.wantHandler || dup.Message != tc.wantMsg {
			t.Errorf("%s: error names handler %q of %q; want %q of %q", name, dup.Handler, dup.Message, tc.wantHandler, tc.wantMsg)
		}
		if !strings.Contains(err.Error(), tc.wantErrorToMentionText) || !strings.Contains(err.Error(), "remove") {
			t.Errorf("%s: error %q; want it to say %q and what to remove", name, err, tc.wantErrorToMentionText)
		}
	}

	// What stays allowed: stackable middleware twice, and one Unique
	// middleware of its own on each of two handlers.
	if _, err := bus.New(bus.WithEndpoint("ep"), bus.WithLogger(discard()),
		bus.WithMiddleware(stackable, stackable),
		bus.WithHandler(handleOrder, bus.HandlerMiddleware(once, stackable)),
		bus.WithHandler(handleCharge, bus.HandlerMiddleware(once))); err != nil {
		t.Fatalf("New with stackable middleware twice and a Unique one per handler: %v", err)
	}
}

// WithEndpoint given twice with different names is refused with a
// *bus.EndpointConflictError naming both; the same name twice is harmless.
func TestWithEndpointTwiceIsRefused(t *testing.T) {
	_, err := bus.New(bus.WithEndpoint("orders"), bus.WithEndpoint("billing"))
	var conflict *bus.EndpointConflictError
	if !errors.As(err, &conflict) || !errors.Is(err, bus.ErrEndpointConflict) || conflict.First != "orders" || conflict.Second != "billing" {
		t.Fatalf("New with two endpoints = %v; want a *bus.EndpointConflictError for orders and billing", err)
	}
	if !strings.Contains(err.Error(), "keep one") {
		t.Errorf("error %q; want it to say what to do", err)
	}
	b, err := bus.New(bus.WithEndpoint("orders"), bus.WithEndpoint("orders"))
	if err != nil || b.Endpoint() != "orders" {
		t.Fatalf("New with one endpoint twice = %v, %v; want it accepted", b, err)
	}
}

// Middleware around one handler with different TxSources (the outbox and
// the inbox on two stores) are refused with a *bus.TxSourceConflictError
// naming both: a handler runs in one transaction.
func TestTxSourceConflictIsRefused(t *testing.T) {
	a, b := new(int), new(int)
	tx := func(name string, source any) bus.Middleware {
		return bus.Middleware{Name: name, TxSource: source, Handling: aroundHandler}
	}
	for name, tc := range map[string]struct {
		opts                       []bus.Option
		first, second, handler, of string
	}{
		"on the bus": {
			opts:  []bus.Option{bus.WithMiddleware(tx("outbox", a), tx("audit", nil), tx("inbox", b))},
			first: "outbox", second: "inbox",
		},
		"the bus's and a handler's": {
			opts:  []bus.Option{bus.WithMiddleware(tx("inbox", a)), bus.WithHandler(handleOrder, bus.HandlerName("place"), bus.HandlerMiddleware(tx("outbox", b)))},
			first: "inbox", second: "outbox", handler: "place", of: "shop.order_placed",
		},
	} {
		_, err := bus.New(append([]bus.Option{bus.WithEndpoint("ep"), bus.WithLogger(discard()), bus.WithHandler(handleCharge)}, tc.opts...)...)
		var conflict *bus.TxSourceConflictError
		if !errors.As(err, &conflict) || !errors.Is(err, bus.ErrTxSourceConflict) {
			t.Errorf("%s: New = %v; want a *bus.TxSourceConflictError", name, err)
			continue
		}
		if conflict.First != tc.first || conflict.Second != tc.second || conflict.Handler != tc.handler || conflict.Message != tc.of {
			t.Errorf("%s: conflict %+v; want %s and %s around handler %q of %q", name, *conflict, tc.first, tc.second, tc.handler, tc.of)
		}
		if !strings.Contains(err.Error(), "pass that one *store.Store") {
			t.Errorf("%s: error %q; want it to say what to do", name, err)
		}
	}

	// One source for all, and different sources on handlers that share
	// no transaction, are accepted.
	if _, err := bus.New(bus.WithEndpoint("ep"), bus.WithLogger(discard()),
		bus.WithMiddleware(tx("outbox", a), tx("inbox", a)),
		bus.WithHandler(handleOrder, bus.HandlerMiddleware(tx("unit-of-work", a)))); err != nil {
		t.Fatalf("New with one source: %v", err)
	}
	if _, err := bus.New(bus.WithEndpoint("ep"), bus.WithLogger(discard()),
		bus.WithHandler(handleOrder, bus.HandlerMiddleware(tx("outbox", a))),
		bus.WithHandler(handleCharge, bus.HandlerMiddleware(tx("outbox", b)))); err != nil {
		t.Fatalf("New with a source per handler: %v", err)
	}
	// A middleware of the bus without a handler stage (a saga's) runs
	// only handlers of its own in its transactions: it conflicts with the
	// bus's middleware that run around them, not with another handler's.
	saga := bus.Middleware{Name: "saga:order", TxSource: a, Start: func(context.Context) error { return nil }}
	if _, err := bus.New(bus.WithEndpoint("ep"), bus.WithLogger(discard()), bus.WithMiddleware(saga),
		bus.WithHandler(handleOrder, bus.HandlerMiddleware(tx("outbox", b)))); err != nil {
		t.Fatalf("New with a saga-like middleware and another handler's own source: %v", err)
	}
	if _, err := bus.New(bus.WithEndpoint("ep"), bus.WithLogger(discard()), bus.WithMiddleware(tx("outbox", b), saga)); !errors.Is(err, bus.ErrTxSourceConflict) {
		t.Fatalf("New with a saga-like middleware on another source than the bus's outbox = %v; want bus.ErrTxSourceConflict", err)
	}
	if _, err := bus.New(bus.WithMiddleware(tx("outbox", []int{1}))); err == nil || !strings.Contains(err.Error(), "not comparable") {
		t.Fatalf("New with a TxSource that is not comparable = %v; want it refused", err)
	}
}

// HasMiddleware reports the middleware of the whole bus by name, not
// those given to one handler.
func TestHasMiddlewareReportsTheBussMiddleware(t *testing.T) {
	b, err := bus.New(bus.WithEndpoint("ep"), bus.WithLogger(discard()),
		bus.WithMiddleware(bus.Middleware{Name: "tracer", Handling: aroundHandler}),
		bus.WithHandler(handleOrder, bus.HandlerMiddleware(bus.Middleware{Name: "timeout", Handling: aroundHandler})))
	if err != nil {
		t.Fatal(err)
	}
	if !b.HasMiddleware("tracer") || b.HasMiddleware("timeout") || b.HasMiddleware("requestreply") {
		t.Fatalf("HasMiddleware: tracer %v, timeout %v, requestreply %v; want true, false, false",
			b.HasMiddleware("tracer"), b.HasMiddleware("timeout"), b.HasMiddleware("requestreply"))
	}
}
