package otel

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/plugbus/plugbus/bus"
)

// panicErrorType is the error.type of a span a panic unwound through: the
// bus turns the panic into a *bus.PanicError further up.
var panicErrorType = semconv.ErrorTypeKey.String(semconv.ErrorType(&bus.PanicError{}).Value.AsString())

// incoming runs once per received message: a consumer span around the rest
// of the chain and the handlers, and the consumed and process metrics.
func (m *middleware) incoming(ctx context.Context, in *bus.Incoming, next bus.Next) (err error) {
	start := time.Now()
	ctx = m.prop.Extract(ctx, incomingCarrier{in})
	name := in.Name()
	spanName, ok := m.processName[name]
	if !ok {
		spanName = "process " + name
	}
	attrs := in.Attributes()
	kv := [...]attribute.KeyValue{
		m.processKVs[0], m.processKVs[1], m.processKVs[2], m.processKVs[3], m.processKVs[4],
		semconv.MessagingMessageID(attrs.MessageID),
		semconv.MessagingMessageConversationID(attrs.CorrelationID),
		semconv.MessagingMessageBodySize(len(in.Body())),
		MessageNameKey.String(name),
		AttemptKey.Int(in.Attempt()),
	}
	opts := make([]trace.SpanStartOption, 0, 4)
	opts = append(opts, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(kv[:]...))
	if m.newTrace {
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() && sc.IsRemote() {
			opts = append(opts, trace.WithNewRoot(), trace.WithLinks(trace.Link{SpanContext: sc}))
		}
	}
	ctx, span := m.tracer.Start(ctx, spanName, opts...)
	returned := false
	defer func() {
		if !returned { // a panic is unwinding: the bus recovers it above us
			failSpanWith(span, panicErrorType, "panic")
			m.recordProcess(ctx, start, panicErrorType)
		}
		span.End()
	}()
	err = next(ctx)
	returned = true
	if err != nil {
		et := semconv.ErrorType(err)
		failSpan(span, et, err)
		m.recordProcess(ctx, start, et)
		return err
	}
	m.recordProcess(ctx, start, attribute.KeyValue{})
	return nil
}

// recordProcess records one consumed message and its process duration;
// errType is empty on success.
func (m *middleware) recordProcess(ctx context.Context, start time.Time, errType attribute.KeyValue) {
	d := time.Since(start).Seconds()
	set := m.processSet
	if errType.Valid() {
		set = attribute.NewSet(append(m.metricProcessKVs(), errType)...)
	}
	m.consumed.AddSet(ctx, 1, set)
	m.processDur.RecordSet(ctx, d, set)
}

// handling wraps each handler in an internal span named after it.
func (m *middleware) handling(ctx context.Context, h *bus.Handling, next bus.Next) error {
	name := h.HandlerName()
	ctx, span := m.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(HandlerNameKey.String(name), MessageNameKey.String(h.MessageName())))
	returned := false
	defer func() {
		if !returned {
			failSpanWith(span, panicErrorType, "panic")
		}
		span.End()
	}()
	err := next(ctx)
	returned = true
	if err != nil {
		failSpan(span, semconv.ErrorType(err), err)
	}
	return err
}

// outgoing runs at Send or Publish: a producer span, current while the rest
// of the chain runs, whose context is injected into the message attributes.
func (m *middleware) outgoing(ctx context.Context, out *bus.Outgoing, next bus.Next) error {
	kind := out.Kind()
	name := out.Name()
	dest := out.Destination()
	if kind == bus.KindPublish {
		dest = name // a published message goes to whoever subscribed to its name
	}
	attrs := out.Attributes()
	op := kind.String()
	kv := [...]attribute.KeyValue{
		m.system,
		semconv.MessagingOperationName(op),
		semconv.MessagingOperationTypeSend,
		semconv.MessagingDestinationName(dest),
		semconv.MessagingMessageID(attrs.MessageID),
		semconv.MessagingMessageConversationID(attrs.CorrelationID),
		MessageNameKey.String(name),
	}
	ctx, span := m.tracer.Start(ctx, op+" "+name, trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(kv[:]...))
	// Always inject, sampled or not: a non-recording span still carries the
	// trace id and the sampling decision the receiver must honour.
	m.prop.Inject(ctx, OutgoingCarrier(out))
	returned := false
	defer func() {
		if !returned {
			failSpanWith(span, panicErrorType, "panic")
			m.recordSent(ctx, kind, dest, panicErrorType)
		}
		span.End()
	}()
	err := next(ctx)
	returned = true
	if err != nil {
		et := semconv.ErrorType(err)
		failSpan(span, et, err)
		m.recordSent(ctx, kind, dest, et)
		return err
	}
	m.recordSent(ctx, kind, dest, attribute.KeyValue{})
	return nil
}

func (m *middleware) recordSent(ctx context.Context, kind bus.Kind, dest string, errType attribute.KeyValue) {
	set := m.sentSet(kind, dest)
	if errType.Valid() {
		set = attribute.NewSet(append(set.ToSlice(), errType)...)
	}
	m.sent.AddSet(ctx, 1, set)
}

func failSpan(span trace.Span, errType attribute.KeyValue, err error) {
	if !span.IsRecording() {
		return
	}
	span.RecordError(err)
	failSpanWith(span, errType, err.Error())
}

func failSpanWith(span trace.Span, errType attribute.KeyValue, desc string) {
	span.SetStatus(codes.Error, desc)
	span.SetAttributes(errType)
}
