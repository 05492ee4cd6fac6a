package plugin_test

import (
	"context"
	"errors"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/sdk/sdktest"
)

// A plugin marked bus.Middleware.Unique is written exactly like an
// in-process one: out of process too, bus.New refuses it given twice (or
// on the bus and on a handler) with a *bus.DuplicateMiddlewareError, and
// a plugin that leaves Unique unset may still be stacked.
func TestUniqueCrossesTheProcessBoundary(t *testing.T) {
	pass := func(ctx context.Context, _ *bus.Handling, next *bus.HandlingNext) error { return next.Call(ctx) }
	once := bus.Middleware{Name: "once", Unique: true, Handling: pass}
	stackable := bus.Middleware{Name: "stackable", Handling: pass}
	handle := func(context.Context, Ping, bus.Attributes) error { return nil }
	sdktest.Run(t, once, func(t *testing.T, p bus.Plugin) {
		for name, opts := range map[string][]bus.Option{
			"twice on the bus":          {bus.WithMiddleware(p, p), bus.WithHandler(handle)},
			"on the bus and a handler":  {bus.WithMiddleware(p), bus.WithHandler(handle, bus.HandlerMiddleware(p))},
			"beside an in-process copy": {bus.WithMiddleware(once, p), bus.WithHandler(handle)},
		} {
			_, err := bus.New(append([]bus.Option{bus.WithEndpoint("svc"), bus.WithLogger(testLogger(t))}, opts...)...)
			var dup *bus.DuplicateMiddlewareError
			if !errors.As(err, &dup) || dup.Middleware != "once" {
				t.Errorf("%s: bus.New = %v; want a *bus.DuplicateMiddlewareError for once", name, err)
			}
		}
	}, sdktest.WithModes(sdktest.InProcess, sdktest.Wire))
	sdktest.Run(t, stackable, func(t *testing.T, p bus.Plugin) {
		if _, err := bus.New(bus.WithEndpoint("svc"), bus.WithLogger(testLogger(t)), bus.WithMiddleware(p, p), bus.WithHandler(handle)); err != nil {
			t.Errorf("bus.New with a stackable plugin twice: %v", err)
		}
	}, sdktest.WithModes(sdktest.InProcess, sdktest.Wire))
}
