package sqs_test

import (
	"context"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/sqstest"
	"github.com/plugbus/plugbus/transports/sqs"
)

func benchEnvelope() *bus.Envelope {
	return &bus.Envelope{
		Name: "orders.order-placed", ContentType: "application/json",
		Body:       []byte(`{"order":"o-123","customer":"c-9","total":1299,"currency":"EUR"}`),
		Attributes: bus.NewAttributes("0190a5c2-7f1e-7c3a-9b1d-3f2e4a5b6c7d", "0190a5c2-7f1e-7c3a-9b1d-3f2e4a5b6c7d", time.Now(), map[string]string{"tenant": "acme"}, nil),
		Headers:    bus.Headers{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
	}
}

// BenchmarkEncode measures turning an envelope into an SQS body and
// message attributes (done on every Send and Publish).
func BenchmarkEncode(b *testing.B) {
	env := benchEnvelope()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := sqs.Encode(env); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecode measures reading a received SQS message into a delivery.
func BenchmarkDecode(b *testing.B) {
	msg, err := sqs.Encode(benchEnvelope())
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if d := sqs.Decode(msg, nil); d.Err != nil {
			b.Fatal(d.Err)
		}
	}
}

// BenchmarkSendReceiveDelete measures one message through the local
// emulator: Send, Receive, Delete (batched), sequentially.
func BenchmarkSendReceiveDelete(b *testing.B) {
	cfg := awsConfig(b)
	prefix := sqstest.UniquePrefix(b, cfg)
	ctx := context.Background()
	tr := sqstest.New(b, cfg, sqstest.FastOptions(prefix)...)
	defer tr.Close(ctx)
	if err := tr.Setup(ctx, bus.Topology{Endpoint: "bench", MaxAttempts: 5, Concurrency: 8}); err != nil {
		b.Fatal(err)
	}
	env := benchEnvelope()
	b.ReportAllocs()
	for b.Loop() {
		if err := tr.Send(ctx, env, "bench"); err != nil {
			b.Fatal(err)
		}
		d, err := tr.Receive(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := tr.Delete(ctx, d); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkBatchVersusSingleSends measures sending 100 messages to one
// queue on the local emulator, one Send at a time and with one SendBatch
// (10 SendMessageBatch calls, up to 8 at once). One op is 100 messages;
// msgs/s is reported. The emulator is not AWS: the ratio, not the
// figures, is what carries over, and only roughly.
func BenchmarkBatchVersusSingleSends(b *testing.B) {
	cfg := awsConfig(b)
	prefix := sqstest.UniquePrefix(b, cfg)
	ctx := context.Background()
	tr := sqstest.New(b, cfg, sqstest.FastOptions(prefix)...)
	defer tr.Close(ctx)
	if err := tr.Setup(ctx, bus.Topology{Endpoint: "bench", MaxAttempts: 5, Concurrency: 8}); err != nil {
		b.Fatal(err)
	}
	const n = 100
	batch := make([]bus.Outbound, n)
	for i := range batch {
		batch[i] = bus.Outbound{Kind: bus.KindSend, Envelope: benchEnvelope(), Destination: "bench"}
	}
	b.Run("Send", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			for _, m := range batch {
				if err := tr.Send(ctx, m.Envelope, m.Destination); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "msgs/s")
	})
	b.Run("SendBatch", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := tr.SendBatch(ctx, batch); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "msgs/s")
	})
}
