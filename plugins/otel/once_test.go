package otel_test

import (
	"errors"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugins/otel"
)

// TestPluginTwiceOnOneBusIsRefused: two otel plugins on one bus record
// every span and metric twice; bus.New refuses the second with a
// *bus.DuplicateMiddlewareError naming the plugin, even with two tracer
// providers (one provider with two span processors exports to two
// backends).
func TestPluginTwiceOnOneBusIsRefused(t *testing.T) {
	first := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tracetest.NewSpanRecorder()))
	second := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tracetest.NewSpanRecorder()))
	t.Cleanup(func() { _ = first.Shutdown(t.Context()); _ = second.Shutdown(t.Context()) })
	for name, plugins := range map[string][]bus.Plugin{
		"two plugins":               {otel.New(), otel.New()},
		"two tracer providers":      {otel.New(otel.WithTracerProvider(first)), otel.New(otel.WithTracerProvider(second))},
		"without handler spans too": {otel.New(), otel.New(otel.WithHandlerSpans(false))},
	} {
		_, err := bus.New(bus.WithEndpoint("orders"), bus.WithMiddleware(plugins...))
		var dup *bus.DuplicateMiddlewareError
		if !errors.As(err, &dup) || dup.Middleware != otel.MiddlewareName {
			t.Errorf("%s: bus.New = %v; want a *bus.DuplicateMiddlewareError for %s", name, err, otel.MiddlewareName)
		}
	}
}
