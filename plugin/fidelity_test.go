package plugin_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugin/internal/scenarios"
	"github.com/plugbus/plugbus/sdk"
	"github.com/plugbus/plugbus/sdk/sdktest"
)

// A before-only stage that ends with `return next.Call(nctx)`, nctx having a
// shorter deadline, has the rest of the chain run under that deadline, as
// in process.
func TestBeforeOnlyShorterDeadline(t *testing.T) {
	sdktest.Run(t, sdk.BeforeOnly(scenarios.New("shorter")), func(t *testing.T, p bus.Plugin) {
		var got time.Duration = -1
		b, err := bus.New(bus.WithEndpoint("svc"), bus.WithMiddleware(p), bus.WithLogger(testLogger(t)),
			bus.WithHandler(func(ctx context.Context, _ Ping, _ bus.Attributes) error {
				if dl, ok := ctx.Deadline(); ok {
					got = time.Until(dl)
				}
				return nil
			}))
		if err != nil {
			t.Fatal(err)
		}
		if err := deliverOnce(t, b); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatal(err)
		}
		if got < 0 || got > 10*scenarios.ShorterDeadline {
			t.Fatalf("the handler ran with %v left before its deadline (-1: none); want at most %v (the deadline the before-only stage gave next)", got, scenarios.ShorterDeadline)
		}
	}, sdktest.WithModes(sdktest.InProcess, sdktest.Wire))
}

// A handler-stage middleware reads the received message's native headers
// out of process as in process.
func TestHandlerStageReadsTheHeaders(t *testing.T) {
	mw := bus.Middleware{Name: "tenant-guard", Handling: func(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
		if v, ok := h.Header("x-tenant"); !ok || v != "acme" {
			return bus.Permanent(errors.New("handler stage: no x-tenant header"))
		}
		if all := maps.Collect(h.Headers()); len(all) != 2 || all["x-region"] != "eu" {
			return bus.Permanent(fmt.Errorf("handler stage: headers %v", all))
		}
		return next.Call(ctx)
	}}
	sdktest.Run(t, mw, func(t *testing.T, p bus.Plugin) {
		handled := 0
		b, err := bus.New(bus.WithEndpoint("svc"), bus.WithMiddleware(p), bus.WithLogger(testLogger(t)),
			bus.WithHandler(func(context.Context, Ping, bus.Attributes) error { handled++; return nil }))
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if err := b.Start(ctx); err != nil {
			t.Fatal(err)
		}
		derr := b.Deliver(ctx, delivery(t, Ping{N: 1}, bus.Headers{"x-tenant": "acme", "x-region": "eu"}))
		if err := b.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if derr != nil || handled != 1 {
			t.Fatalf("Deliver returned %v, handled %d times; want nil and once", derr, handled)
		}
	}, sdktest.WithModes(sdktest.InProcess, sdktest.Wire))
}
