package bustest_test

import (
	"context"
	"errors"
	"testing"

	"go.uber.org/goleak"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type orderPlaced struct {
	ID string `json:"id"`
}

func (orderPlaced) MessageName() string { return "shop.order_placed" }

type tenantKey struct{}

// tenancy is the middleware under test: incoming messages without a tenant
// are handled without running handlers; the tenant flows downstream in ctx;
// outgoing messages get a tenant header.
var tenancy = bus.Middleware{
	Name: "tenancy",
	Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
		tenant, ok := in.Attributes().StickyValue("tenant")
		if !ok {
			in.Logger().Warn("message without tenant dropped")
			return nil
		}
		return next.Call(context.WithValue(ctx, tenantKey{}, tenant))
	},
	Outgoing: func(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
		if t, ok := ctx.Value(tenantKey{}).(string); ok {
			out.Headers()["x-tenant"] = t
		}
		return next.Call(ctx)
	},
}

// An incoming middleware runs on a stage context with no bus; the
// recorded next tells whether and with what context it was called, and
// passes its error on.
func TestIncomingMiddlewareRunsWithoutABus(t *testing.T) {
	ctx := context.Background()

	rec := bustest.RecordNext(nil)
	in := bustest.Incoming(bustest.Delivery(orderPlaced{ID: "1"}, bus.Attributes{}))
	if err := tenancy.Incoming(ctx, in, rec.IncomingNext()); err != nil || rec.Called() {
		t.Fatalf("no tenant: err %v, next called %v", err, rec.Called())
	}

	rec = bustest.RecordNext(nil)
	in = bustest.Incoming(bustest.Delivery(orderPlaced{ID: "1"}, bus.Attributes{}.WithSticky("tenant", "acme")))
	if err := tenancy.Incoming(ctx, in, rec.IncomingNext()); err != nil || rec.Calls() != 1 {
		t.Fatalf("tenant: err %v, next calls %d", err, rec.Calls())
	}
	if got := rec.Ctx().Value(tenantKey{}); got != "acme" {
		t.Fatalf("tenant in ctx: %v", got)
	}

	boom := errors.New("handler failed")
	rec = bustest.RecordNext(boom)
	if err := tenancy.Incoming(ctx, in, rec.IncomingNext()); !errors.Is(err, boom) {
		t.Fatalf("error of next not passed on: %v", err)
	}
}

// An outgoing middleware's changes are read back from the stage context;
// a recorder made from a function runs it as the rest of the chain.
func TestOutgoingMiddlewareRunsWithoutABus(t *testing.T) {
	ctx := context.WithValue(context.Background(), tenantKey{}, "acme")
	out := bustest.Outgoing(bus.KindPublish, orderPlaced{ID: "1"}, bus.Attributes{MessageID: "m-1"})
	var headerInNext string
	rec := bustest.RecordNextFunc(func(ctx context.Context) error {
		headerInNext = out.Headers()["x-tenant"]
		return nil
	})
	if err := tenancy.Outgoing(ctx, out, rec.OutgoingNext()); err != nil {
		t.Fatal(err)
	}
	if headerInNext != "acme" || rec.Calls() != 1 {
		t.Fatalf("header seen by the rest of the chain %q, next calls %d", headerInNext, rec.Calls())
	}
	if out.Name() != "shop.order_placed" || out.Kind() != bus.KindPublish || out.Attributes().MessageID != "m-1" {
		t.Fatalf("context: %s %s %s", out.Name(), out.Kind(), out.Attributes().MessageID)
	}
}

// A handler stage context reports the handler and the message, and its
// UseOutbox records nothing.
func TestHandlingContextWithoutABus(t *testing.T) {
	h := bustest.Handling("charge", orderPlaced{ID: "1"}, bus.Attributes{MessageID: "m-1"})
	if h.HandlerName() != "charge" || h.MessageName() != "shop.order_placed" || h.Message() != (orderPlaced{ID: "1"}) || h.Attributes().MessageID != "m-1" {
		t.Fatalf("handling context: %s %s %v", h.HandlerName(), h.MessageName(), h.Message())
	}
	if restore, err := h.UseOutbox(context.Background(), nil); err != nil || restore == nil { // no bus: records nothing
		t.Fatal(err)
	}
}

// Start runs a bus until the test ends.
func TestStartRunsABusForTheTest(t *testing.T) {
	got := make(chan string, 1)
	b := bustest.Start(t, bus.WithEndpoint("ep"), bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
		got <- m.ID
		return nil
	}))
	if err := b.Send(t.Context(), orderPlaced{ID: "x"}); err != nil {
		t.Fatal(err)
	}
	if id := <-got; id != "x" {
		t.Fatal(id)
	}
}
