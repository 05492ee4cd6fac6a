package rabbitmq

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// benchDeliveries are received messages of the shapes the decoder meets:
// what plugbus sends (no headers table), a plugbus message with headers,
// attributes and a retry count, and a foreign message.
func benchDeliveries() map[string]*amqp.Delivery {
	id := "0190a6d2-3c4e-7f00-8000-000000000001"
	return map[string]*amqp.Delivery{
		"plugbus": {Type: "bench.order", ContentType: "application/json", MessageId: id, Body: []byte(`{"id":1}`)},
		"headers": {Type: "bench.order", ContentType: "application/json", MessageId: id, CorrelationId: "c-1", Body: []byte(`{"id":1}`),
			Headers: amqp.Table{"x-tenant": "acme", HeaderAttempt: int32(2), HeaderAttributePrefix + "k": "v", HeaderStickyPrefix + "s": "t"}},
		"foreign": {Type: "bench.order", ContentType: "application/json", MessageId: "m-1", Timestamp: time.Unix(1700000000, 0), Body: []byte(`{"id":1}`),
			Headers: amqp.Table{"x-int": int32(42), "CC": []any{"elsewhere"}, "x-delivery-count": int64(1)}},
	}
}

// BenchmarkEnvelope measures the decoding of a received message into a
// bus envelope, the transport's part of every delivery.
func BenchmarkEnvelope(b *testing.B) {
	for name, m := range benchDeliveries() {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			limits := decodeLimits{maxAttempts: 5, clock: newSkewClock(time.Now)}
			for b.Loop() {
				env, _, _, err := envelope(m, limits)
				if err != nil || env.Name != "bench.order" || string(env.Body) != `{"id":1}` {
					b.Fatalf("decoded %+v, %v", env, err)
				}
			}
		})
	}
}

// BenchmarkRepublishing measures the copy Return makes of a delivery.
func BenchmarkRepublishing(b *testing.B) {
	t := &Transport{user: "guest"}
	for name, m := range benchDeliveries() {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				msg, h := t.republishing(m, 1)
				h[HeaderAttempt] = int32(2)
				if msg.Type != m.Type || string(msg.Body) != string(m.Body) {
					b.Fatalf("republished %+v", msg)
				}
			}
		})
	}
}
