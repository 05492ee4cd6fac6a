package bustest_test

import (
	"context"
	"errors"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
)

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
	Incoming: func(ctx context.Context, in *bus.Incoming, next bus.Next) error {
		tenant, ok := in.Attributes().StickyValue("tenant")
		if !ok {
			in.Logger().Warn("message without tenant dropped")
			return nil
		}
		return next(context.WithValue(ctx, tenantKey{}, tenant))
	},
	Outgoing: func(ctx context.Context, out *bus.Outgoing, next bus.Next) error {
		if t, ok := ctx.Value(tenantKey{}).(string); ok {
			out.Headers()["x-tenant"] = t
		}
		return next(ctx)
	},
}

func TestIncomingWithoutBus(t *testing.T) {
	ctx := context.Background()

	next := bustest.Next(nil)
	in := bustest.Incoming(bustest.Delivery(orderPlaced{ID: "1"}, bus.Attributes{}))
	if err := tenancy.Incoming(ctx, in, next.Next); err != nil || next.Called() {
		t.Fatalf("no tenant: err %v, next called %v", err, next.Called())
	}

	next = bustest.Next(nil)
	in = bustest.Incoming(bustest.Delivery(orderPlaced{ID: "1"}, bus.Attributes{}.WithSticky("tenant", "acme")))
	if err := tenancy.Incoming(ctx, in, next.Next); err != nil || next.Calls() != 1 {
		t.Fatalf("tenant: err %v, next calls %d", err, next.Calls())
	}
	if got := next.Ctx().Value(tenantKey{}); got != "acme" {
		t.Fatalf("tenant in ctx: %v", got)
	}

	boom := errors.New("handler failed")
	next = bustest.Next(boom)
	if err := tenancy.Incoming(ctx, in, next.Next); !errors.Is(err, boom) {
		t.Fatalf("error of next not passed on: %v", err)
	}
}

func TestOutgoingWithoutBus(t *testing.T) {
	ctx := context.WithValue(context.Background(), tenantKey{}, "acme")
	out := bustest.Outgoing(bus.KindPublish, orderPlaced{ID: "1"}, bus.Attributes{MessageID: "m-1"})
	next := bustest.NextFunc(func(ctx context.Context) error { return nil })
	if err := tenancy.Outgoing(ctx, out, next.Next); err != nil {
		t.Fatal(err)
	}
	if out.Headers()["x-tenant"] != "acme" || next.Calls() != 1 {
		t.Fatalf("headers %v, next calls %d", out.Headers(), next.Calls())
	}
	if out.Name() != "shop.order_placed" || out.Kind() != bus.KindPublish || out.Attributes().MessageID != "m-1" {
		t.Fatalf("context: %s %s %s", out.Name(), out.Kind(), out.Attributes().MessageID)
	}
}

func TestHandlingWithoutBus(t *testing.T) {
	h := bustest.Handling("charge", orderPlaced{ID: "1"}, bus.Attributes{MessageID: "m-1"})
	if h.HandlerName() != "charge" || h.MessageName() != "shop.order_placed" || h.Message() != (orderPlaced{ID: "1"}) || h.Attributes().MessageID != "m-1" {
		t.Fatalf("handling context: %s %s %v", h.HandlerName(), h.MessageName(), h.Message())
	}
	if restore, err := h.UseOutbox(context.Background(), nil); err != nil || restore == nil { // no bus: records nothing
		t.Fatal(err)
	}
}

func TestStart(t *testing.T) {
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
