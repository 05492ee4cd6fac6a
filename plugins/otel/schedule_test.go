package otel_test

import (
	"context"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugins/otel"
)

// The send span of a scheduled message records its due time; one sent
// now has none.
func TestSendSpanRecordsTheDueTime(t *testing.T) {
	tel := newTelemetry(t)
	b := newBus(t, bus.WithName("client"), bus.WithMiddleware(tel.plugin()))
	due := time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC)
	if err := b.Publish(context.Background(), PlaceOrder{ID: "o-1"}, bus.At(due)); err != nil {
		t.Fatal(err)
	}
	s := tel.span(t, "publish PlaceOrder")
	wantAttrs(t, s, map[string]any{string(otel.DueKey): "2030-01-02T03:04:05.000000006Z"})
	if err := b.Send(context.Background(), ChargeCard{}, bus.To("billing")); err != nil {
		t.Fatal(err)
	}
	for _, kv := range tel.span(t, "send ChargeCard").Attributes() {
		if kv.Key == otel.DueKey {
			t.Errorf("a message sent now has %s = %v", otel.DueKey, kv.Value.AsInterface())
		}
	}
}
