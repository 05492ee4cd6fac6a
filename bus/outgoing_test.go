package bus_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
)

// Outgoing middleware sets and deletes attributes, the correlation id and
// native headers, and the receiver sees them.
func TestOutgoingMutatesAttributesAndHeaders(t *testing.T) {
	type seen struct {
		attrs  bus.Attributes
		header string
	}
	got := make(chan seen, 1)
	var headerInIncoming string
	e := newEnv(t, nil,
		bus.WithMiddleware(bus.Middleware{
			Name: "stamp",
			Outgoing: func(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
				out.SetValue("stamped", "yes")
				out.SetSticky("tenant", "acme")
				out.SetCorrelationID("corr-stamp")
				out.DeleteValue("drop-me")
				out.Headers()["x-tenant"] = "acme"
				return next.Call(ctx)
			},
			Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
				headerInIncoming, _ = in.Header("x-tenant")
				return next.Call(ctx)
			},
		}),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			got <- seen{attrs: a, header: headerInIncoming}
			return nil
		}))
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}, bus.WithAttribute("drop-me", "x")); err != nil {
		t.Fatal(err)
	}
	s := await(t, got)
	v, _ := s.attrs.Value("stamped")
	st, _ := s.attrs.StickyValue("tenant")
	_, dropped := s.attrs.Value("drop-me")
	if v != "yes" || st != "acme" || s.attrs.CorrelationID != "corr-stamp" || dropped || s.header != "acme" {
		t.Fatalf("received attributes %+v (stamped %q tenant %q dropped %v) header %q", s.attrs, v, st, !dropped, s.header)
	}
	e.expect(bustest.Deleted)
}

// An outgoing middleware drops a message by not calling next (Send
// returns nil, a debug log names it) and rejects one by returning an
// error (Send returns it); neither reaches the transport, in a handler or
// out of one.
func TestOutgoingDropAndReject(t *testing.T) {
	ran := make(chan string, 4)
	sendErr := make(chan error, 1)
	reject := errors.New("not allowed")
	e := newEnv(t, nil,
		bus.WithMiddleware(bus.Middleware{Name: "policy", Outgoing: func(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
			switch out.Name() {
			case "shop.charge_card":
				return nil // drop
			case "shop.order_shipped":
				return reject
			}
			return next.Call(ctx)
		}}),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			ran <- "placed"
			sendErr <- handlingBus(ctx).Publish(ctx, orderShipped{OrderID: m.ID})
			return nil
		}),
		bus.WithHandler(func(ctx context.Context, m chargeCard, a bus.Attributes) error { ran <- "charge"; return nil }),
		bus.WithHandler(func(ctx context.Context, m orderShipped, a bus.Attributes) error { ran <- "shipped"; return nil }))
	ctx := t.Context()
	if err := e.bus.Send(ctx, chargeCard{OrderID: "1"}); err != nil {
		t.Fatalf("dropped send returned %v, want nil", err)
	}
	if logs := e.logs.String(); !strings.Contains(logs, "outgoing message dropped") || !strings.Contains(logs, `"middleware":"policy"`) {
		t.Fatalf("no debug log naming the middleware that dropped the message:\n%s", logs)
	}
	if err := e.bus.Publish(ctx, orderShipped{OrderID: "1"}); !errors.Is(err, reject) {
		t.Fatalf("rejected publish returned %v", err)
	}
	if err := e.bus.Send(ctx, orderPlaced{ID: "1"}); err != nil {
		t.Fatal(err)
	}
	if got := await(t, ran); got != "placed" {
		t.Fatalf("ran %s", got)
	}
	if err := await(t, sendErr); !errors.Is(err, reject) {
		t.Fatalf("publish inside handler returned %v", err)
	}
	e.expect(bustest.Deleted) // the handler ignored the error: nothing buffered
	e.waitIdle()
	if len(ran) != 0 {
		t.Fatalf("a dropped or rejected message was handled: %s", <-ran)
	}
	for _, s := range e.rec.Sent() {
		if s.Envelope.Name != (orderPlaced{}).MessageName() {
			t.Fatalf("a dropped or rejected %s reached the transport", s.Envelope.Name)
		}
	}
}
