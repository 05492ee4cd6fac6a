package otel_test

import (
	"context"
	"fmt"
	"slices"
	"time"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugins/otel"
)

// One bus whose handler sends on: the send, the processing, the handler
// and the send it makes form one trace.
func Example() {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	ctx := context.Background()

	var b *bus.Bus
	done := make(chan struct{})
	b, err := bus.New(
		bus.WithEndpoint("orders"),
		bus.WithMiddleware(otel.New(otel.WithTracerProvider(tp))),
		bus.WithHandler(func(ctx context.Context, m PlaceOrder, _ bus.Attributes) error {
			return b.Publish(ctx, ChargeCard{OrderID: m.ID}) // no subscriber: the span is still recorded
		}, bus.HandlerName("orders.place")),
		bus.WithHandler(func(ctx context.Context, m PlaceOrder, _ bus.Attributes) error {
			close(done)
			return nil
		}, bus.HandlerName("orders.notify")),
	)
	if err != nil {
		panic(err)
	}
	if err := b.Start(ctx); err != nil {
		panic(err)
	}
	if err := b.Send(ctx, PlaceOrder{ID: "o-1"}); err != nil {
		panic(err)
	}
	<-done
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_ = b.Stop(stopCtx) // waits for the message in flight: every span has ended

	printTree(spans.Ended())
	// Output:
	// send PlaceOrder (producer)
	//   process PlaceOrder (consumer)
	//     orders.place (internal)
	//       publish ChargeCard (producer)
	//     orders.notify (internal)
}

// printTree prints spans under their parents, in start order.
func printTree(spans []sdktrace.ReadOnlySpan) {
	slices.SortStableFunc(spans, func(a, b sdktrace.ReadOnlySpan) int { return a.StartTime().Compare(b.StartTime()) })
	var walk func(parent sdktrace.ReadOnlySpan, depth int)
	walk = func(parent sdktrace.ReadOnlySpan, depth int) {
		for _, s := range spans {
			if (parent == nil && !s.Parent().IsValid()) || (parent != nil && s.Parent().SpanID() == parent.SpanContext().SpanID()) {
				fmt.Printf("%*s%s (%s)\n", 2*depth, "", s.Name(), s.SpanKind())
				walk(s, depth+1)
			}
		}
	}
	walk(nil, 0)
}

// Options: a tracer and meter provider of the bus's own, W3C trace context
// and baggage explicitly, no per-handler spans, and a new trace (linked to
// the sender's span) for every received message.
func ExampleNew() {
	tp := sdktrace.NewTracerProvider()
	plugin := otel.New(
		otel.WithTracerProvider(tp),
		otel.WithPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})),
		otel.WithHandlerSpans(false),
		otel.WithNewTrace(true),
	)
	b, err := bus.New(bus.WithName("client"), bus.WithMiddleware(plugin))
	if err != nil {
		panic(err)
	}
	fmt.Println(b.Name())
	// Output: client
}
