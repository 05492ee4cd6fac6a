package otel_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugins/otel"
	"github.com/plugbus/plugbus/transports/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type PlaceOrder struct{ ID string }

func (PlaceOrder) MessageName() string { return "PlaceOrder" }

type ChargeCard struct{ OrderID string }

func (ChargeCard) MessageName() string { return "ChargeCard" }

// telemetry is one tracer provider and one meter provider with in-memory readers.
type telemetry struct {
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
	mp     *sdkmetric.MeterProvider
}

func newTelemetry(t *testing.T) *telemetry {
	t.Helper()
	tel := &telemetry{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	tel.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tel.spans))
	tel.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(tel.reader))
	t.Cleanup(func() {
		_ = tel.tp.Shutdown(context.Background())
		_ = tel.mp.Shutdown(context.Background())
	})
	return tel
}

func (tel *telemetry) plugin(opts ...otel.Option) *otel.Plugin {
	return otel.New(append([]otel.Option{otel.WithTracerProvider(tel.tp), otel.WithMeterProvider(tel.mp)}, opts...)...)
}

// span returns the one ended span named name.
func (tel *telemetry) span(t *testing.T, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	for _, s := range tel.spans.Ended() {
		if s.Name() == name {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one span %q, got %d; spans: %s", name, len(found), spanNames(tel.spans.Ended()))
	}
	return found[0]
}

func spanNames(spans []sdktrace.ReadOnlySpan) string {
	names := make([]string, len(spans))
	for i, s := range spans {
		names[i] = s.Name()
	}
	return strings.Join(names, ", ")
}

// collect reads the metrics recorded so far.
func (tel *telemetry) collect(t *testing.T) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := tel.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatalf("collecting metrics: %v", err)
	}
	return rm
}

func findMetric(rm metricdata.ResourceMetrics, name string) (metricdata.Metrics, bool) {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

// counter returns the value of the counter name at the data point whose
// attributes are exactly want.
func counter(t *testing.T, rm metricdata.ResourceMetrics, name string, want ...attribute.KeyValue) int64 {
	t.Helper()
	m, ok := findMetric(rm, name)
	if !ok {
		return 0
	}
	sum, ok := m.Data.(metricdata.Sum[int64])
	if !ok {
		t.Fatalf("metric %s is a %T, want a Sum[int64]", name, m.Data)
	}
	set := attribute.NewSet(want...)
	for _, dp := range sum.DataPoints {
		if dp.Attributes.Equals(&set) {
			return dp.Value
		}
	}
	return 0
}

// histogramCount returns how many values the histogram name recorded at
// the data point whose attributes are exactly want.
func histogramCount(t *testing.T, rm metricdata.ResourceMetrics, name string, want ...attribute.KeyValue) uint64 {
	t.Helper()
	m, ok := findMetric(rm, name)
	if !ok {
		return 0
	}
	h, ok := m.Data.(metricdata.Histogram[float64])
	if !ok {
		t.Fatalf("metric %s is a %T, want a Histogram[float64]", name, m.Data)
	}
	set := attribute.NewSet(want...)
	for _, dp := range h.DataPoints {
		if dp.Attributes.Equals(&set) {
			return dp.Count
		}
	}
	return 0
}

func attr(t *testing.T, s sdktrace.ReadOnlySpan, key string) attribute.Value {
	t.Helper()
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value
		}
	}
	t.Errorf("span %q has no attribute %s; it has %v", s.Name(), key, s.Attributes())
	return attribute.Value{}
}

func wantAttrs(t *testing.T, s sdktrace.ReadOnlySpan, want map[string]any) {
	t.Helper()
	for k, v := range want {
		if got := attr(t, s, k).AsInterface(); got != v {
			t.Errorf("span %q: %s = %v (%T), want %v (%T)", s.Name(), k, got, got, v, v)
		}
	}
}

func wantParent(t *testing.T, child, parent sdktrace.ReadOnlySpan) {
	t.Helper()
	if child.Parent().SpanID() != parent.SpanContext().SpanID() || child.Parent().TraceID() != parent.SpanContext().TraceID() {
		t.Errorf("span %q: parent is %v, want %q (%v)", child.Name(), child.Parent(), parent.Name(), parent.SpanContext())
	}
}

func wantKind(t *testing.T, s sdktrace.ReadOnlySpan, kind trace.SpanKind) {
	t.Helper()
	if s.SpanKind() != kind {
		t.Errorf("span %q: kind %v, want %v", s.Name(), s.SpanKind(), kind)
	}
}

func newBus(t *testing.T, opts ...bus.Option) *bus.Bus {
	t.Helper()
	b, err := bus.New(opts...)
	if err != nil {
		t.Fatalf("bus.New: %v", err)
	}
	if err := b.Start(context.Background()); err != nil {
		t.Fatalf("starting bus %s: %v", b.Name(), err)
	}
	t.Cleanup(func() { stop(t, b) })
	return b
}

// stop stops b, which waits for in-flight messages: their spans have ended
// when it returns.
func stop(t *testing.T, buses ...*bus.Bus) {
	t.Helper()
	for _, b := range buses {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := b.Stop(ctx); err != nil {
			t.Errorf("stopping bus %s: %v", b.Name(), err)
		}
		cancel()
	}
}

func wait(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// checkout is the flow of the trace tests: a client sends PlaceOrder to
// "orders", whose handler sends ChargeCard to "billing".
type checkout struct {
	client, orders, billing *bus.Bus
	ordersEP, billingEP     string

	mu           sync.Mutex
	placeAttrs   bus.Attributes // of the PlaceOrder the orders handler received
	chargeAttrs  bus.Attributes // of the ChargeCard the billing handler received
	chargeCtx    context.Context
	charged      chan struct{}
	chargeFailed error // returned by the billing handler when set
}

// newCheckout builds the three buses, each with its own transport from
// newTransport and the plugins of its name.
func newCheckout(t *testing.T, newTransport func() bus.Transport, plugins func(name string) bus.Plugin, extra ...bus.Option) *checkout {
	return newCheckoutAt(t, "orders", "billing", newTransport, plugins, extra...)
}

// newCheckoutAt is newCheckout with the endpoints named ordersEP and billingEP.
func newCheckoutAt(t *testing.T, ordersEP, billingEP string, newTransport func() bus.Transport, plugins func(name string) bus.Plugin, extra ...bus.Option) *checkout {
	t.Helper()
	c := &checkout{charged: make(chan struct{}, 16), ordersEP: ordersEP, billingEP: billingEP}
	c.billing = newBus(t, append([]bus.Option{bus.WithEndpoint(billingEP), bus.WithTransport(newTransport()),
		bus.WithMiddleware(plugins("billing")),
		bus.WithHandler(func(ctx context.Context, m ChargeCard, a bus.Attributes) error {
			c.mu.Lock()
			c.chargeAttrs, c.chargeCtx = a, ctx
			err := c.chargeFailed
			c.mu.Unlock()
			c.charged <- struct{}{}
			return err
		}, bus.HandlerName("billing.charge"))}, extra...)...)
	var orders *bus.Bus
	orders = newBus(t, append([]bus.Option{bus.WithEndpoint(ordersEP), bus.WithTransport(newTransport()),
		bus.WithMiddleware(plugins("orders")),
		bus.WithHandler(func(ctx context.Context, m PlaceOrder, a bus.Attributes) error {
			c.mu.Lock()
			c.placeAttrs = a
			c.mu.Unlock()
			return orders.Send(ctx, ChargeCard{OrderID: m.ID}, bus.To(billingEP))
		}, bus.HandlerName("orders.place"))}, extra...)...)
	c.orders = orders
	c.client = newBus(t, append([]bus.Option{bus.WithName("client"), bus.WithTransport(newTransport()),
		bus.WithMiddleware(plugins("client"))}, extra...)...)
	return c
}

// run sends one PlaceOrder from inside a "checkout" span, waits until
// billing handled it and stops the buses so that every span has ended.
func (c *checkout) run(t *testing.T, ctx context.Context) {
	t.Helper()
	if err := c.client.Send(ctx, PlaceOrder{ID: "o-1"}, bus.To(c.ordersEP)); err != nil {
		t.Fatalf("Send: %v", err)
	}
	wait(t, c.charged, "billing to handle ChargeCard")
	stop(t, c.client, c.orders, c.billing)
}

func memoryTransports() func() bus.Transport {
	broker := memory.NewBroker()
	return func() bus.Transport { return memory.New(memory.WithBroker(broker)) }
}

// testOneTrace checks send → process → handler → send → process → handler
// as one trace, over the transports newTransport makes.
func testOneTrace(t *testing.T, c *checkout, tel *telemetry, system string) {
	orders, billing := c.ordersEP, c.billingEP

	ctx, root := tel.tp.Tracer("test").Start(context.Background(), "checkout")
	member, err := baggage.NewMember("tenant", "acme")
	if err != nil {
		t.Fatal(err)
	}
	bag, err := baggage.New(member)
	if err != nil {
		t.Fatal(err)
	}
	ctx = baggage.ContextWithBaggage(ctx, bag)
	c.run(t, ctx)
	root.End()

	sendPlace := tel.span(t, "send PlaceOrder")
	processPlace := tel.span(t, "process PlaceOrder")
	handlePlace := tel.span(t, "orders.place")
	sendCharge := tel.span(t, "send ChargeCard")
	processCharge := tel.span(t, "process ChargeCard")
	handleCharge := tel.span(t, "billing.charge")
	rootSpan := tel.span(t, "checkout")

	wantParent(t, sendPlace, rootSpan)
	wantParent(t, processPlace, sendPlace)
	wantParent(t, handlePlace, processPlace)
	wantParent(t, sendCharge, handlePlace)
	wantParent(t, processCharge, sendCharge)
	wantParent(t, handleCharge, processCharge)
	if !processPlace.Parent().IsRemote() || !processCharge.Parent().IsRemote() {
		t.Errorf("process spans should continue a remote (extracted) parent")
	}
	if n := len(tel.spans.Ended()); n != 7 {
		t.Errorf("want 7 spans, got %d: %s", n, spanNames(tel.spans.Ended()))
	}

	wantKind(t, sendPlace, trace.SpanKindProducer)
	wantKind(t, sendCharge, trace.SpanKindProducer)
	wantKind(t, processPlace, trace.SpanKindConsumer)
	wantKind(t, processCharge, trace.SpanKindConsumer)
	wantKind(t, handlePlace, trace.SpanKindInternal)
	wantKind(t, handleCharge, trace.SpanKindInternal)

	c.mu.Lock()
	placeAttrs, chargeAttrs, chargeCtx := c.placeAttrs, c.chargeAttrs, c.chargeCtx
	c.mu.Unlock()

	wantAttrs(t, sendPlace, map[string]any{
		"messaging.system":                  system,
		"messaging.operation.name":          "send",
		"messaging.operation.type":          "send",
		"messaging.destination.name":        orders,
		"messaging.message.id":              placeAttrs.MessageID,
		"messaging.message.conversation_id": placeAttrs.CorrelationID,
		"plugbus.message.name":              "PlaceOrder",
	})
	wantAttrs(t, processPlace, map[string]any{
		"messaging.system":                  system,
		"messaging.operation.name":          "process",
		"messaging.operation.type":          "process",
		"messaging.destination.name":        orders,
		"messaging.consumer.group.name":     orders,
		"messaging.message.id":              placeAttrs.MessageID,
		"messaging.message.conversation_id": placeAttrs.CorrelationID,
		"plugbus.message.name":              "PlaceOrder",
		"plugbus.delivery.attempt":          int64(1),
	})
	wantAttrs(t, handlePlace, map[string]any{"plugbus.handler.name": "orders.place", "plugbus.message.name": "PlaceOrder"})
	wantAttrs(t, sendCharge, map[string]any{
		"messaging.destination.name":        billing,
		"messaging.message.id":              chargeAttrs.MessageID,
		"messaging.message.conversation_id": placeAttrs.CorrelationID, // inherited while handling
	})
	wantAttrs(t, processCharge, map[string]any{
		"messaging.destination.name":        billing,
		"messaging.consumer.group.name":     billing,
		"messaging.message.id":              chargeAttrs.MessageID,
		"messaging.message.conversation_id": placeAttrs.CorrelationID,
	})
	for _, s := range tel.spans.Ended() {
		if s.Status().Code != codes.Unset {
			t.Errorf("span %q: status %v, want unset", s.Name(), s.Status())
		}
	}

	// The context travels in the attributes: the traceparent of ChargeCard
	// names its producer span; baggage crossed both hops.
	tp, _ := chargeAttrs.Value("traceparent")
	if want := fmt.Sprintf("00-%s-%s-01", sendCharge.SpanContext().TraceID(), sendCharge.SpanContext().SpanID()); tp != want {
		t.Errorf("ChargeCard traceparent = %q, want %q", tp, want)
	}
	if got := baggage.FromContext(chargeCtx).Member("tenant").Value(); got != "acme" {
		t.Errorf("baggage tenant in billing's handler = %q, want acme", got)
	}
	if got := trace.SpanFromContext(chargeCtx).SpanContext().SpanID(); got != handleCharge.SpanContext().SpanID() {
		t.Errorf("the handler's ctx should hold its handler span")
	}

	rm := tel.collect(t)
	sys := attribute.String("messaging.system", system)
	for _, ep := range []string{orders, billing} {
		kvs := []attribute.KeyValue{sys, attribute.String("messaging.operation.name", "process"),
			attribute.String("messaging.destination.name", ep), attribute.String("messaging.consumer.group.name", ep)}
		if n := counter(t, rm, "messaging.client.consumed.messages", kvs...); n != 1 {
			t.Errorf("consumed messages at %s = %d, want 1", ep, n)
		}
		if n := histogramCount(t, rm, "messaging.process.duration", kvs...); n != 1 {
			t.Errorf("process durations at %s = %d, want 1", ep, n)
		}
		if n := counter(t, rm, "messaging.client.sent.messages", sys,
			attribute.String("messaging.operation.name", "send"), attribute.String("messaging.destination.name", ep)); n != 1 {
			t.Errorf("sent messages to %s = %d, want 1", ep, n)
		}
	}
}

func TestOneTraceMemory(t *testing.T) {
	tel := newTelemetry(t)
	c := newCheckout(t, memoryTransports(), func(string) bus.Plugin { return tel.plugin() })
	testOneTrace(t, c, tel, otel.DefaultSystem)
}

func TestNewTraceLinksToSender(t *testing.T) {
	tel := newTelemetry(t)
	c := newCheckout(t, memoryTransports(), func(string) bus.Plugin { return tel.plugin(otel.WithNewTrace(true)) })
	c.run(t, context.Background())

	sendPlace := tel.span(t, "send PlaceOrder")
	processPlace := tel.span(t, "process PlaceOrder")
	handlePlace := tel.span(t, "orders.place")
	sendCharge := tel.span(t, "send ChargeCard")
	processCharge := tel.span(t, "process ChargeCard")

	for _, pair := range [][2]sdktrace.ReadOnlySpan{{processPlace, sendPlace}, {processCharge, sendCharge}} {
		process, send := pair[0], pair[1]
		if process.Parent().IsValid() {
			t.Errorf("span %q: has parent %v, want a new root", process.Name(), process.Parent())
		}
		if process.SpanContext().TraceID() == send.SpanContext().TraceID() {
			t.Errorf("span %q: same trace as its sender, want a new trace", process.Name())
		}
		links := process.Links()
		if len(links) != 1 || !links[0].SpanContext.Equal(send.SpanContext().WithRemote(true)) {
			t.Errorf("span %q: links %v, want one link to %v", process.Name(), links, send.SpanContext())
		}
	}
	wantParent(t, handlePlace, processPlace)
	wantParent(t, sendCharge, handlePlace)
}

func TestHandlerSpansOff(t *testing.T) {
	tel := newTelemetry(t)
	c := newCheckout(t, memoryTransports(), func(string) bus.Plugin { return tel.plugin(otel.WithHandlerSpans(false)) })
	c.run(t, context.Background())

	if n := len(tel.spans.Ended()); n != 4 {
		t.Errorf("want 4 spans (no handler spans), got %d: %s", n, spanNames(tel.spans.Ended()))
	}
	wantParent(t, tel.span(t, "send ChargeCard"), tel.span(t, "process PlaceOrder"))
}

// declinedError classifies itself for error.type.
type declinedError struct{ card string }

func (e *declinedError) Error() string     { return "card " + e.card + " declined" }
func (e *declinedError) ErrorType() string { return "card_declined" }

func TestFailingHandler(t *testing.T) {
	tel := newTelemetry(t)
	broker := memory.NewBroker()
	c := newCheckout(t, func() bus.Transport { return memory.New(memory.WithBroker(broker)) },
		func(string) bus.Plugin { return tel.plugin() }, bus.WithMaxAttempts(2))
	c.chargeFailed = fmt.Errorf("charging: %w", &declinedError{card: "4242"})
	if err := c.client.Send(context.Background(), PlaceOrder{ID: "o-1"}); !errors.Is(err, bus.ErrNoRoute) {
		t.Fatalf("Send without a route: %v, want ErrNoRoute", err)
	}
	if err := c.client.Send(context.Background(), PlaceOrder{ID: "o-1"}, bus.To("orders")); err != nil {
		t.Fatal(err)
	}
	wait(t, c.charged, "the first attempt")
	wait(t, c.charged, "the second attempt")
	stop(t, c.client, c.orders, c.billing)

	if dl := broker.DeadLetters("billing"); len(dl) != 1 || dl[0].Failure.Attempts != 2 {
		t.Fatalf("dead letters of billing: %+v, want ChargeCard after 2 attempts", dl)
	}
	var processes, handlers []sdktrace.ReadOnlySpan
	for _, s := range tel.spans.Ended() {
		switch s.Name() {
		case "process ChargeCard":
			processes = append(processes, s)
		case "billing.charge":
			handlers = append(handlers, s)
		}
	}
	if len(processes) != 2 || len(handlers) != 2 {
		t.Fatalf("want 2 process and 2 handler spans of ChargeCard, got %d and %d", len(processes), len(handlers))
	}
	for i, s := range append(processes, handlers...) {
		if s.Status().Code != codes.Error || !strings.Contains(s.Status().Description, "card 4242 declined") {
			t.Errorf("span %q: status %+v, want an error naming the cause", s.Name(), s.Status())
		}
		if got := attr(t, s, "error.type").AsString(); got != "card_declined" {
			t.Errorf("span %q: error.type %q, want card_declined", s.Name(), got)
		}
		if !slices.ContainsFunc(s.Events(), func(e sdktrace.Event) bool { return e.Name == "exception" }) {
			t.Errorf("span %q: no exception event", s.Name())
		}
		if i < 2 {
			if got := attr(t, s, "plugbus.delivery.attempt").AsInt64(); got != int64(i+1) {
				t.Errorf("span %q: attempt %d, want %d", s.Name(), got, i+1)
			}
		}
	}
	// Retries stay in the sender's trace.
	send := tel.span(t, "send ChargeCard")
	for _, s := range processes {
		wantParent(t, s, send)
	}

	rm := tel.collect(t)
	kvs := []attribute.KeyValue{attribute.String("messaging.system", otel.DefaultSystem), attribute.String("messaging.operation.name", "process"),
		attribute.String("messaging.destination.name", "billing"), attribute.String("messaging.consumer.group.name", "billing")}
	failed := append(slices.Clone(kvs), attribute.String("error.type", "card_declined"))
	if n := counter(t, rm, "messaging.client.consumed.messages", failed...); n != 2 {
		t.Errorf("failed consumed messages = %d, want 2", n)
	}
	if n := histogramCount(t, rm, "messaging.process.duration", failed...); n != 2 {
		t.Errorf("failed process durations = %d, want 2", n)
	}
	if n := counter(t, rm, "messaging.client.consumed.messages", kvs...); n != 0 {
		t.Errorf("successful consumed messages at billing = %d, want 0", n)
	}
}

// A send that fails is recorded on its span and counted with its error.type.
func TestFailingSend(t *testing.T) {
	tel := newTelemetry(t)
	client := newBus(t, bus.WithName("client"), bus.WithMiddleware(tel.plugin()))
	stop(t, client)
	if err := client.Publish(context.Background(), PlaceOrder{ID: "o-1"}); !errors.Is(err, bus.ErrClosed) {
		t.Fatalf("Publish on a stopped bus: %v, want ErrClosed", err)
	}
	// ErrClosed is returned before the pipeline runs: no span.
	if n := len(tel.spans.Ended()); n != 0 {
		t.Fatalf("want no span for a send on a closed bus, got %s", spanNames(tel.spans.Ended()))
	}

	b := newBus(t, bus.WithName("client"), bus.WithMiddleware(tel.plugin(), bus.Middleware{Name: "refuse",
		Outgoing: func(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
			return &declinedError{card: "0000"}
		}}))
	if err := b.Publish(context.Background(), PlaceOrder{ID: "o-1"}); err == nil {
		t.Fatal("Publish: want the middleware's error")
	}
	s := tel.span(t, "publish PlaceOrder")
	wantKind(t, s, trace.SpanKindProducer)
	wantAttrs(t, s, map[string]any{"messaging.operation.name": "publish", "messaging.destination.name": "PlaceOrder", "error.type": "card_declined"})
	if s.Status().Code != codes.Error {
		t.Errorf("status %+v, want error", s.Status())
	}
	rm := tel.collect(t)
	if n := counter(t, rm, "messaging.client.sent.messages", attribute.String("messaging.system", otel.DefaultSystem),
		attribute.String("messaging.operation.name", "publish"), attribute.String("messaging.destination.name", "PlaceOrder"),
		attribute.String("error.type", "card_declined")); n != 1 {
		t.Errorf("failed sent messages = %d, want 1", n)
	}
}

// Two buses in one process, each with its own providers: each records only
// its own side, yet the trace connects through the message.
func TestBusesDoNotMix(t *testing.T) {
	a, b := newTelemetry(t), newTelemetry(t)
	broker := memory.NewBroker()
	done := make(chan struct{}, 1)
	receiver := newBus(t, bus.WithEndpoint("orders"), bus.WithTransport(memory.New(memory.WithBroker(broker))),
		bus.WithMiddleware(b.plugin()),
		bus.WithHandler(func(ctx context.Context, m PlaceOrder, _ bus.Attributes) error {
			done <- struct{}{}
			return nil
		}, bus.HandlerName("orders.place")))
	sender := newBus(t, bus.WithName("client"), bus.WithTransport(memory.New(memory.WithBroker(broker))), bus.WithMiddleware(a.plugin()))
	if err := sender.Send(context.Background(), PlaceOrder{ID: "o-1"}, bus.To("orders")); err != nil {
		t.Fatal(err)
	}
	wait(t, done, "the receiver")
	stop(t, sender, receiver)

	if got := spanNames(a.spans.Ended()); got != "send PlaceOrder" {
		t.Errorf("sender's spans: %s, want send PlaceOrder only", got)
	}
	got := spanNames(b.spans.Ended())
	if got != "orders.place, process PlaceOrder" {
		t.Errorf("receiver's spans: %s, want orders.place, process PlaceOrder", got)
	}
	wantParent(t, b.span(t, "process PlaceOrder"), a.span(t, "send PlaceOrder"))

	if _, ok := findMetric(a.collect(t), "messaging.client.consumed.messages"); ok {
		t.Errorf("the sender's meter recorded consumed messages")
	}
	if _, ok := findMetric(b.collect(t), "messaging.client.sent.messages"); ok {
		t.Errorf("the receiver's meter recorded sent messages")
	}
}

// An unsampled parent is not recorded downstream, but its context still
// travels: every hop stays in its trace with the not-sampled flag, so no
// service starts a fresh, sampled trace of its own.
func TestUnsampledParentPropagates(t *testing.T) {
	tel := newTelemetry(t)
	c := newCheckout(t, memoryTransports(), func(string) bus.Plugin { return tel.plugin() })
	parent := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:  trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
	})
	c.run(t, trace.ContextWithSpanContext(context.Background(), parent))

	if n := len(tel.spans.Ended()); n != 0 {
		t.Errorf("want no recorded span under an unsampled parent, got %s", spanNames(tel.spans.Ended()))
	}
	c.mu.Lock()
	placeAttrs, chargeAttrs, chargeCtx := c.placeAttrs, c.chargeAttrs, c.chargeCtx
	c.mu.Unlock()
	for name, a := range map[string]bus.Attributes{"PlaceOrder": placeAttrs, "ChargeCard": chargeAttrs} {
		tp, ok := a.Value("traceparent")
		if !ok {
			t.Errorf("%s carries no traceparent", name)
			continue
		}
		parts := strings.Split(tp, "-")
		if len(parts) != 4 || parts[1] != parent.TraceID().String() || parts[3] != "00" {
			t.Errorf("%s traceparent %q, want trace %s, not sampled", name, tp, parent.TraceID())
		}
	}
	sc := trace.SpanContextFromContext(chargeCtx)
	if sc.TraceID() != parent.TraceID() || sc.IsSampled() {
		t.Errorf("billing's handler context %v, want trace %s, not sampled", sc, parent.TraceID())
	}
}

type systemTransport struct{ *memory.Transport }

func (systemTransport) MessagingSystem() string { return "rabbitmq" }

func TestSystemFromTransport(t *testing.T) {
	tel := newTelemetry(t)
	b := newBus(t, bus.WithName("client"), bus.WithTransport(systemTransport{memory.New()}), bus.WithMiddleware(tel.plugin()))
	if err := b.Publish(context.Background(), PlaceOrder{}); err != nil {
		t.Fatal(err)
	}
	forced := newBus(t, bus.WithName("client"), bus.WithTransport(systemTransport{memory.New()}), bus.WithMiddleware(tel.plugin(otel.WithSystem("kafka"))))
	if err := forced.Send(context.Background(), PlaceOrder{}, bus.To("orders")); err != nil {
		t.Fatal(err)
	}
	stop(t, b, forced)
	wantAttrs(t, tel.span(t, "publish PlaceOrder"), map[string]any{"messaging.system": "rabbitmq"})
	wantAttrs(t, tel.span(t, "send PlaceOrder"), map[string]any{"messaging.system": "kafka"})
}

// A panic in a handler ends the handler span with an error; the bus turns
// it into a failure of the message.
func TestPanickingHandler(t *testing.T) {
	tel := newTelemetry(t)
	done := make(chan struct{}, 1)
	b := newBus(t, bus.WithEndpoint("orders"), bus.WithMaxAttempts(1), bus.WithMiddleware(tel.plugin()),
		bus.WithHandler(func(ctx context.Context, m PlaceOrder, _ bus.Attributes) error {
			done <- struct{}{}
			panic("boom")
		}, bus.HandlerName("orders.place")))
	if err := b.Send(context.Background(), PlaceOrder{}); err != nil {
		t.Fatal(err)
	}
	wait(t, done, "the handler")
	stop(t, b)
	h := tel.span(t, "orders.place")
	if h.Status().Code != codes.Error {
		t.Errorf("handler span status %+v, want error", h.Status())
	}
	wantAttrs(t, h, map[string]any{"error.type": "*bus.PanicError"})
	p := tel.span(t, "process PlaceOrder")
	if p.Status().Code != codes.Error {
		t.Errorf("process span status %+v, want error", p.Status())
	}
}

// With no providers given, the plugin uses the global ones, and W3C trace
// context while no global propagator is set.
func TestGlobalDefaults(t *testing.T) {
	done := make(chan bus.Attributes, 1)
	b := newBus(t, bus.WithEndpoint("orders"), bus.WithMiddleware(otel.New()),
		bus.WithHandler(func(ctx context.Context, m PlaceOrder, a bus.Attributes) error {
			done <- a
			return nil
		}))
	tel := newTelemetry(t)
	ctx, span := tel.tp.Tracer("test").Start(context.Background(), "root")
	if err := b.Send(ctx, PlaceOrder{}); err != nil {
		t.Fatal(err)
	}
	span.End()
	var a bus.Attributes
	select {
	case a = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("timed out")
	}
	// The global tracer provider is a no-op: the producer span is the
	// parent's context itself, which travels.
	tp, _ := a.Value("traceparent")
	if !strings.Contains(tp, span.SpanContext().TraceID().String()) {
		t.Errorf("traceparent %q, want trace %s", tp, span.SpanContext().TraceID())
	}
}

// The sender's trace state travels with the message and is continued by
// the receiver.
func TestTraceStatePropagates(t *testing.T) {
	tel := newTelemetry(t)
	c := newCheckout(t, memoryTransports(), func(string) bus.Plugin { return tel.plugin() })
	ts, err := trace.ParseTraceState("vendor=abc")
	if err != nil {
		t.Fatal(err)
	}
	parent := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, SpanID: trace.SpanID{1, 2, 3, 4, 5, 6, 7, 8},
		TraceFlags: trace.FlagsSampled, TraceState: ts, Remote: true,
	})
	c.run(t, trace.ContextWithRemoteSpanContext(context.Background(), parent))

	c.mu.Lock()
	chargeAttrs := c.chargeAttrs
	c.mu.Unlock()
	if got, _ := chargeAttrs.Value("tracestate"); got != "vendor=abc" {
		t.Errorf("ChargeCard tracestate = %q, want vendor=abc", got)
	}
	if got := tel.span(t, "process ChargeCard").SpanContext().TraceState().String(); got != "vendor=abc" {
		t.Errorf("process span trace state = %q, want vendor=abc", got)
	}
	wantParent(t, tel.span(t, "send PlaceOrder"), tracetest.SpanStub{SpanContext: parent}.Snapshot())
}

// A failure marked permanent is recorded with the error.type of its cause,
// which says more than the mark.
func TestPermanentFailureHasItsCausesErrorType(t *testing.T) {
	tel := newTelemetry(t)
	b := newBus(t, bus.WithName("client"), bus.WithMiddleware(tel.plugin(), bus.Middleware{Name: "refuse",
		Outgoing: func(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
			return bus.Permanent(&invalidOrder{})
		}}))
	if err := b.Publish(context.Background(), PlaceOrder{ID: "o-1"}); !errors.Is(err, bus.ErrPermanent) {
		t.Fatalf("Publish: %v, want the middleware's permanent error", err)
	}
	wantAttrs(t, tel.span(t, "publish PlaceOrder"), map[string]any{"error.type": "*otel_test.invalidOrder"})
}

// invalidOrder is an error with no ErrorType method: its error.type is its
// Go type.
type invalidOrder struct{}

func (*invalidOrder) Error() string { return "invalid order" }

// A permanent mark wrapped with fmt.Errorf (a middleware adding context:
// "tenancy: %w") is still recorded with the error.type of its cause, not
// of the mark.
func TestWrappedPermanentFailureHasItsCausesErrorType(t *testing.T) {
	tel := newTelemetry(t)
	b := newBus(t, bus.WithName("client"), bus.WithMiddleware(tel.plugin(), bus.Middleware{Name: "refuse",
		Outgoing: func(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
			return fmt.Errorf("refuse: order o-1: %w", bus.Permanent(&invalidOrder{}))
		}}))
	if err := b.Publish(context.Background(), PlaceOrder{ID: "o-1"}); !errors.Is(err, bus.ErrPermanent) {
		t.Fatalf("Publish: %v, want the middleware's permanent error", err)
	}
	wantAttrs(t, tel.span(t, "publish PlaceOrder"), map[string]any{"error.type": "*otel_test.invalidOrder"})
}
