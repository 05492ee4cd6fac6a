package sdk_test

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/sdk"
)

// tenancy stamps a tenant on every outgoing message. Its stage ends with
// `return next.Call(ctx)`: it may be declared before-only.
var tenancy = bus.Middleware{Name: "tenancy", Outgoing: func(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
	out.Headers()["x-tenant"] = "acme"
	return next.Call(ctx)
}}

// The main of a plugin binary is one call. The host loads the binary with
// plugin.Load (pinned by its SHA-256) and runs the middleware as one of
// its own.
func ExampleServe() {
	sdk.Serve(sdk.BeforeOnly(tenancy), sdk.WithVersion("v1.0.0"))
}

// Ping is a message.
type Ping struct{}

func (Ping) MessageName() string { return "example.ping" }

// In process, a plugin declared before-only runs exactly like the plain
// one; out of process its stages cost one round trip instead of two.
func ExampleBeforeOnly() {
	ctx := context.Background()
	tenants := make(chan string, 1)
	readTenant := bus.Middleware{Name: "read-tenant", Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
		t, _ := in.Header("x-tenant")
		tenants <- t
		return next.Call(ctx)
	}}
	b, err := bus.New(bus.WithEndpoint("orders"), bus.WithLogger(slog.New(slog.DiscardHandler)),
		bus.WithMiddleware(sdk.BeforeOnly(tenancy, bus.StageOutgoing), readTenant),
		bus.WithHandler(func(context.Context, Ping, bus.Attributes) error { return nil }))
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := b.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer b.Stop(ctx)
	if err := b.Send(ctx, Ping{}, bus.To("orders")); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("tenant:", <-tenants)
	// Output: tenant: acme
}

// Inside a plugin process, a handler or outgoing stage sees the message
// as its name and JSON body.
func ExampleRawMessage_Decode() {
	m := sdk.RawMessage{Name: "orders.placed", Body: []byte(`{"id":42}`)}
	var placed struct {
		ID int `json:"id"`
	}
	if err := m.Decode(&placed); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(m.MessageName(), placed.ID)
	// Output: orders.placed 42
}
