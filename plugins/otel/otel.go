// Package otel traces and measures a bus with OpenTelemetry.
//
// Enable it with one middleware:
//
//	b, err := bus.New(bus.WithEndpoint("orders"), bus.WithHandler(placeOrder),
//		bus.WithMiddleware(otel.New()))
//
// Every received message gets a consumer span "process <message name>" that
// continues the trace of the span that sent it, every handler a child span
// named after the handler, and every Send or Publish a producer span
// "send <message name>" or "publish <message name>" whose context is written
// into the message's attributes (traceparent, tracestate, baggage), so it
// travels on every transport. A message sent from a handler is a child of
// that handler's span even though the bus hands it to the transport only
// after the handler succeeded. Spans and metrics follow the OpenTelemetry
// messaging semantic conventions (semconv v1.43.0); docs/plugins/otel.md
// lists them.
//
// The plugin is instantiated once per bus: two buses in one process with
// different tracer or meter providers never see each other's telemetry.
package otel

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	gotel "go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/semconv/v1.43.0/messagingconv"
	"go.opentelemetry.io/otel/trace"

	"github.com/plugbus/plugbus/bus"
)

// ScopeName is the instrumentation scope of the tracer and meter the plugin
// gets from its providers.
const ScopeName = "github.com/plugbus/plugbus/plugins/otel"

// MiddlewareName is the name of the middleware in the bus's logs and errors.
const MiddlewareName = "otel"

// DefaultSystem is the messaging.system of a bus whose transport does not
// name its messaging system (bus.MessagingSystemNamer).
const DefaultSystem = "plugbus"

// Attribute keys the plugin sets beside the semantic conventions' own.
const (
	// MessageNameKey is the message's wire name, on process and send spans.
	MessageNameKey = attribute.Key("plugbus.message.name")
	// HandlerNameKey is the handler's name, on handler spans.
	HandlerNameKey = attribute.Key("plugbus.handler.name")
	// AttemptKey is the delivery attempt (1 the first time), on process spans.
	AttemptKey = attribute.Key("plugbus.delivery.attempt")
	// UnhandledKey is true on the process span, the consumed-messages
	// counter and the process-duration histogram of a message the bus
	// discarded because none of its handlers handles the message's name
	// (bus.UnhandledDiscard, read from bus.Incoming.Unhandled). An
	// unhandled message the bus dead-letters (the default) has error.type
	// *bus.NoHandlerError instead.
	UnhandledKey = attribute.Key("plugbus.message.unhandled")
	// DueKey is the earliest delivery time of a scheduled message
	// (bus.Delay, bus.At, bus.Outgoing.SetDue), on send spans, in RFC
	// 3339 with nanoseconds, UTC; absent for a message that goes now. It
	// is read after the rest of the chain ran, so it is the due time the
	// transport was given.
	DueKey = attribute.Key("plugbus.message.due")
)

// Option configures the plugin. Options are applied once, by [New].
type Option func(*config)

type config struct {
	tp           trace.TracerProvider
	mp           metric.MeterProvider
	prop         propagation.TextMapPropagator
	noHandler    bool
	newTrace     bool
	system       string
	systemForced bool
}

// WithTracerProvider sets the tracer provider. The default (and nil) is the
// global one, otel.GetTracerProvider.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tp = tp }
}

// WithMeterProvider sets the meter provider. The default (and nil) is the
// global one, otel.GetMeterProvider.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.mp = mp }
}

// WithPropagator sets how the span context and baggage are written to and
// read from message attributes. The default (and nil) is the global
// propagator, otel.GetTextMapPropagator, when one was set by the time the bus
// is built; otherwise W3C trace context and baggage, so that traces connect
// across services without further setup.
func WithPropagator(p propagation.TextMapPropagator) Option {
	return func(c *config) { c.prop = p }
}

// WithHandlerSpans turns the per-handler spans on (the default) or off.
// Without them, a handler's sends are children of the process span.
func WithHandlerSpans(on bool) Option {
	return func(c *config) { c.noHandler = !on }
}

// WithNewTrace(true) makes each received message start a new trace whose
// process span links to the sender's span, instead of continuing the
// sender's trace as a child (the default). Use it for long-lived flows
// where one trace per hop reads better than one huge trace. Baggage is
// propagated either way.
func WithNewTrace(on bool) Option {
	return func(c *config) { c.newTrace = on }
}

// WithSystem sets messaging.system, overriding what the transport reports
// through bus.MessagingSystemNamer.
func WithSystem(name string) Option {
	return func(c *config) { c.system, c.systemForced = name, name != "" }
}

// Plugin is the OpenTelemetry plugin: pass it to bus.WithMiddleware. It
// keeps no state of its own; each bus it is instantiated for gets its own
// tracer, meter and instruments.
type Plugin struct {
	opts []Option
}

// New returns the plugin configured by opts. It has no side effects: the
// providers are resolved when a bus instantiates it.
func New(opts ...Option) *Plugin {
	return &Plugin{opts: opts}
}

// Instantiate returns the middleware of one bus: incoming, handler (unless
// turned off with [WithHandlerSpans]) and outgoing stages. The plugin runs
// once per bus: bus.New refuses it given twice, which would double every
// span and metric, with a *bus.DuplicateMiddlewareError (to export to two
// backends, give one tracer provider two span processors).
func (p *Plugin) Instantiate(info bus.PluginInfo) (bus.Middleware, error) {
	var c config
	for _, o := range p.opts {
		if o != nil {
			o(&c)
		}
	}
	if c.tp == nil {
		c.tp = gotel.GetTracerProvider()
	}
	if c.mp == nil {
		c.mp = gotel.GetMeterProvider()
	}
	if c.prop == nil {
		c.prop = gotel.GetTextMapPropagator()
		if len(c.prop.Fields()) == 0 { // the global no-op: nothing would travel
			c.prop = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
		}
	}
	if !c.systemForced {
		c.system = DefaultSystem
		if s, ok := info.Transport.(bus.MessagingSystemNamer); ok && s.MessagingSystem() != "" {
			c.system = s.MessagingSystem()
		}
	}
	m, err := newMiddleware(c, info)
	if err != nil {
		return bus.Middleware{}, fmt.Errorf("otel: bus %q: %w", info.Name, err)
	}
	// Unique: a second plugin would record every span and metric twice.
	mw := bus.Middleware{Name: MiddlewareName, Unique: true, Incoming: m.incoming, Outgoing: m.outgoing}
	if !c.noHandler {
		mw.Handling = m.handling
	}
	return mw, nil
}

// middleware is the plugin's state for one bus.
type middleware struct {
	tracer   trace.Tracer
	prop     propagation.TextMapPropagator
	newTrace bool
	system   attribute.KeyValue

	process  *operation // receiving at this bus's endpoint
	discard  *operation // process, for a message discarded unhandled
	sends    cache[sentKey, *operation]
	handlers cache[string, []trace.SpanStartOption]

	processName map[string]string // message name → span name, for the messages the bus handles

	consumed   messagingconv.ClientConsumedMessages
	processDur messagingconv.ProcessDuration
	sent       messagingconv.ClientSentMessages
}

// operation is what the plugin prepares once for the messages of one
// operation on one destination: the span start options (kind and the
// attributes a sampler may look at) and the metric attributes.
type operation struct {
	start   []trace.SpanStartOption
	kvs     []attribute.KeyValue // metric attributes, without error.type
	addOpts []metric.AddOption
	recOpts []metric.RecordOption
}

func newOperation(kind trace.SpanKind, spanKVs, metricKVs []attribute.KeyValue) *operation {
	set := attribute.NewSet(metricKVs...)
	return &operation{
		start:   []trace.SpanStartOption{trace.WithSpanKind(kind), trace.WithAttributes(spanKVs...)},
		kvs:     slices.Clip(metricKVs),
		addOpts: []metric.AddOption{metric.WithAttributeSet(set)},
		recOpts: []metric.RecordOption{metric.WithAttributeSet(set)},
	}
}

// failed returns the metric attributes of a failed operation.
func (o *operation) failed(errType attribute.KeyValue) attribute.Set {
	return attribute.NewSet(append(o.kvs, errType)...)
}

type sentKey struct {
	kind bus.Kind
	dest string
}

// processDurationBuckets are the boundaries the semantic conventions
// recommend for messaging durations, in seconds.
var processDurationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}

func newMiddleware(c config, info bus.PluginInfo) (*middleware, error) {
	m := &middleware{
		tracer:      c.tp.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL)),
		prop:        c.prop,
		newTrace:    c.newTrace,
		system:      semconv.MessagingSystemKey.String(c.system),
		processName: make(map[string]string, len(info.Handles)),
	}
	for _, h := range info.Handles {
		m.processName[h] = "process " + h
	}
	opName := semconv.MessagingOperationName("process")
	dest := semconv.MessagingDestinationName(info.Endpoint)
	group := semconv.MessagingConsumerGroupName(info.Endpoint)
	m.process = newOperation(trace.SpanKindConsumer,
		[]attribute.KeyValue{m.system, opName, semconv.MessagingOperationTypeProcess, dest, group},
		[]attribute.KeyValue{m.system, opName, dest, group})
	m.discard = newOperation(trace.SpanKindConsumer, nil, []attribute.KeyValue{m.system, opName, dest, group, UnhandledKey.Bool(true)})

	meter := c.mp.Meter(ScopeName, metric.WithSchemaURL(semconv.SchemaURL))
	var err, errs error
	m.consumed, err = messagingconv.NewClientConsumedMessages(meter)
	errs = errors.Join(errs, err)
	m.processDur, err = messagingconv.NewProcessDuration(meter, metric.WithExplicitBucketBoundaries(processDurationBuckets...))
	errs = errors.Join(errs, err)
	m.sent, err = messagingconv.NewClientSentMessages(meter)
	errs = errors.Join(errs, err)
	if errs != nil {
		return nil, fmt.Errorf("creating metric instruments: %w", errs)
	}
	return m, nil
}

// send returns the operation of sending (kind) to dest.
func (m *middleware) send(kind bus.Kind, dest string) *operation {
	return m.sends.get(sentKey{kind, dest}, func() *operation {
		opName := semconv.MessagingOperationName(kind.String())
		d := semconv.MessagingDestinationName(dest)
		return newOperation(trace.SpanKindProducer,
			[]attribute.KeyValue{m.system, opName, semconv.MessagingOperationTypeSend, d},
			[]attribute.KeyValue{m.system, opName, d})
	})
}

// handler returns the span start options of the handler named name.
func (m *middleware) handler(name string) []trace.SpanStartOption {
	return m.handlers.get(name, func() []trace.SpanStartOption {
		return []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(HandlerNameKey.String(name))}
	})
}

// cache keeps values made once per key, up to maxCached keys; past that,
// values are made on each use. Keys are destinations and handler names, a
// small set in any real bus.
type cache[K comparable, V any] struct {
	mu sync.RWMutex
	m  map[K]V
}

const maxCached = 1024

func (c *cache[K, V]) get(k K, make func() V) V {
	c.mu.RLock()
	v, ok := c.m[k]
	c.mu.RUnlock()
	if ok {
		return v
	}
	v = make()
	c.mu.Lock()
	if c.m == nil {
		c.m = map[K]V{}
	}
	if len(c.m) < maxCached {
		c.m[k] = v
	}
	c.mu.Unlock()
	return v
}

var _ bus.Plugin = (*Plugin)(nil)
