package otel_test

import (
	"context"
	"log/slog"
	"slices"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugins/otel"
)

// A message no handler handles is counted apart from handled ones: with
// error.type *bus.NoHandlerError when the bus dead-letters it (the
// default), with plugbus.message.unhandled=true when it discards it.
func TestUnhandledMessagesCounted(t *testing.T) {
	for _, c := range []struct {
		name   string
		policy bus.UnhandledPolicy
		extra  attribute.KeyValue // on the unhandled message's data point
		status codes.Code
	}{
		{"dead-lettered", bus.UnhandledDeadLetter, attribute.String("error.type", "*bus.NoHandlerError"), codes.Error},
		{"discarded", bus.UnhandledDiscard, otel.UnhandledKey.Bool(true), codes.Unset},
	} {
		t.Run(c.name, func(t *testing.T) {
			tel := newTelemetry(t)
			handled := make(chan struct{}, 1)
			b := newBus(t, bus.WithEndpoint("orders"), bus.WithConcurrency(1), bus.WithUnhandled(c.policy),
				bus.WithLogger(slog.New(slog.DiscardHandler)), bus.WithMiddleware(tel.plugin()),
				bus.WithHandler(func(context.Context, PlaceOrder, bus.Attributes) error {
					handled <- struct{}{}
					return nil
				}))
			ctx := context.Background()
			if err := b.Send(ctx, ChargeCard{OrderID: "o-1"}, bus.To("orders")); err != nil { // orders has no handler of it
				t.Fatal(err)
			}
			if err := b.Send(ctx, PlaceOrder{ID: "o-1"}); err != nil {
				t.Fatal(err)
			}
			wait(t, handled, "the handled message, received after the unhandled one by the only worker")
			stop(t, b)

			rm := tel.collect(t)
			kvs := []attribute.KeyValue{attribute.String("messaging.system", otel.DefaultSystem), attribute.String("messaging.operation.name", "process"),
				attribute.String("messaging.destination.name", "orders"), attribute.String("messaging.consumer.group.name", "orders")}
			unhandled := append(slices.Clone(kvs), c.extra)
			if n := counter(t, rm, "messaging.client.consumed.messages", unhandled...); n != 1 {
				t.Errorf("consumed messages with %v = %d, want 1 (the unhandled one)", c.extra, n)
			}
			if n := histogramCount(t, rm, "messaging.process.duration", unhandled...); n != 1 {
				t.Errorf("process durations with %v = %d, want 1", c.extra, n)
			}
			if n := counter(t, rm, "messaging.client.consumed.messages", kvs...); n != 1 {
				t.Errorf("consumed messages without error or unhandled = %d, want 1 (the handled one)", n)
			}
			p := tel.span(t, "process ChargeCard")
			if p.Status().Code != c.status {
				t.Errorf("process span status %+v, want %v", p.Status(), c.status)
			}
			if c.policy == bus.UnhandledDiscard {
				wantAttrs(t, p, map[string]any{"plugbus.message.unhandled": true})
			}
		})
	}
}
