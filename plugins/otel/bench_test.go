package otel_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugins/otel"
)

// providers are the tracer providers the stage benchmarks run with: the
// SDK sampling everything (no exporter: the cost of the plugin and the
// SDK, not of exporting), the SDK sampling nothing, and the no-op API.
func providers() map[string]trace.TracerProvider {
	return map[string]trace.TracerProvider{
		"sdk-sampled":   sdktrace.NewTracerProvider(),
		"sdk-unsampled": sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample())),
		"noop":          noop.NewTracerProvider(),
	}
}

func instantiate(b *testing.B, tp trace.TracerProvider) bus.Middleware {
	b.Helper()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	m, err := otel.New(otel.WithTracerProvider(tp), otel.WithMeterProvider(mp)).
		Instantiate(bus.PluginInfo{Name: "orders", Endpoint: "orders", Handles: []string{"PlaceOrder"}})
	if err != nil {
		b.Fatal(err)
	}
	return m
}

func BenchmarkIncoming(b *testing.B) {
	attrs := bus.NewAttributes("0190a5f4-6c1e-7000-8000-000000000001", "0190a5f4-6c1e-7000-8000-000000000001", time.Now(),
		map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}, nil)
	d := &bus.Delivery{Envelope: bus.Envelope{Name: "PlaceOrder", Body: []byte(`{"ID":"o-1"}`), Attributes: attrs}, Attempt: 1}
	next := bus.NewIncomingNext(func(context.Context) error { return nil })
	for name, tp := range providers() {
		b.Run(name, func(b *testing.B) {
			m := instantiate(b, tp)
			in := bus.NewIncoming(d, bus.StageInfo{Endpoint: "orders"})
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				next.Reset()
				if err := m.Incoming(ctx, in, next); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkOutgoing(b *testing.B) {
	next := bus.NewOutgoingNext(func(context.Context) error { return nil })
	for name, tp := range providers() {
		b.Run(name, func(b *testing.B) {
			m := instantiate(b, tp)
			ctx, span := tp.Tracer("bench").Start(context.Background(), "parent")
			defer span.End()
			attrs := bus.NewAttributes("0190a5f4-6c1e-7000-8000-000000000001", "0190a5f4-6c1e-7000-8000-000000000001", time.Now(), nil, nil)
			b.ReportAllocs()
			for b.Loop() {
				out := bus.NewOutgoing(bus.OutgoingMessage{Kind: bus.KindSend, Name: "PlaceOrder", Destination: "orders", Attributes: attrs}, bus.StageInfo{})
				next.Reset()
				if err := m.Outgoing(ctx, out, next); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkBaseline is what BenchmarkOutgoing's loop costs without the
// plugin: making the standalone stage context.
func BenchmarkBaseline(b *testing.B) {
	attrs := bus.NewAttributes("0190a5f4-6c1e-7000-8000-000000000001", "0190a5f4-6c1e-7000-8000-000000000001", time.Now(), nil, nil)
	b.ReportAllocs()
	for b.Loop() {
		out := bus.NewOutgoing(bus.OutgoingMessage{Kind: bus.KindSend, Name: "PlaceOrder", Destination: "orders", Attributes: attrs}, bus.StageInfo{})
		out.SetValue("k", "v")
	}
}

// BenchmarkSendReceive is one message sent and handled on a bus over the
// memory transport, with and without the plugin (SDK, sampling everything).
func BenchmarkSendReceive(b *testing.B) {
	for _, withPlugin := range []bool{false, true} {
		name := "without-otel"
		if withPlugin {
			name = "with-otel"
		}
		b.Run(name, func(b *testing.B) {
			done := make(chan struct{}, 1)
			opts := []bus.Option{bus.WithEndpoint("orders"), bus.WithConcurrency(1), bus.WithLogger(slog.New(slog.DiscardHandler)),
				bus.WithHandler(func(ctx context.Context, m PlaceOrder, _ bus.Attributes) error {
					done <- struct{}{}
					return nil
				})}
			if withPlugin {
				tp := sdktrace.NewTracerProvider()
				mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
				opts = append(opts, bus.WithMiddleware(otel.New(otel.WithTracerProvider(tp), otel.WithMeterProvider(mp))))
			}
			bb, err := bus.New(opts...)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			if err := bb.Start(ctx); err != nil {
				b.Fatal(err)
			}
			defer func() { _ = bb.Stop(ctx) }()
			b.ReportAllocs()
			for b.Loop() {
				if err := bb.Send(ctx, PlaceOrder{ID: "o-1"}); err != nil {
					b.Fatal(err)
				}
				<-done
			}
		})
	}
}
