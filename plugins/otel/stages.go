package otel

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/plugbus/plugbus/bus"
)

// panicErrorType is the error.type of a span a panic unwound through: the
// bus turns the panic into a *bus.PanicError further up.
var panicErrorType = semconv.ErrorType(&bus.PanicError{})

// fmtWrapError is the type of an error fmt.Errorf wraps one error in.
var fmtWrapError = reflect.TypeOf(fmt.Errorf("%w", errors.New("")))

// errorType is the error.type of err: for a failure marked permanent
// (bus.Permanent), also under fmt.Errorf wrappers, the type of its cause,
// which says more than the mark.
func errorType(err error) attribute.KeyValue {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if p, ok := e.(*bus.PermanentError); ok && p.Unwrap() != nil {
			return semconv.ErrorType(p.Unwrap())
		}
		if reflect.TypeOf(e) != fmtWrapError {
			break
		}
	}
	return semconv.ErrorType(err)
}

// incoming runs once per received message: a consumer span around the rest
// of the chain and the handlers, and the consumed and process metrics.
func (m *middleware) incoming(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
	start := time.Now()
	// The message's trace context is the only parent: a span or baggage
	// in ctx (what the context given to Start or Deliver carried) is not
	// the message's, and a message sent without trace context starts a
	// trace of its own rather than join, say, the application's start-up.
	if trace.SpanContextFromContext(ctx).IsValid() {
		ctx = trace.ContextWithSpanContext(ctx, trace.SpanContext{})
	}
	if baggage.FromContext(ctx).Len() > 0 {
		ctx = baggage.ContextWithoutBaggage(ctx)
	}
	ctx = m.prop.Extract(ctx, incomingCarrier{in})
	name := in.Name()
	spanName, ok := m.processName[name]
	if !ok {
		spanName = "process " + name
	}
	opts := m.process.start
	if m.newTrace {
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() && sc.IsRemote() {
			opts = append(slices.Clip(opts), trace.WithNewRoot(), trace.WithLinks(trace.Link{SpanContext: sc}))
		}
	}
	ctx, span := m.tracer.Start(ctx, spanName, opts...)
	if span.IsRecording() {
		attrs := in.Attributes()
		span.SetAttributes(
			semconv.MessagingMessageID(attrs.MessageID),
			semconv.MessagingMessageConversationID(attrs.CorrelationID),
			semconv.MessagingMessageBodySize(len(in.Body())),
			MessageNameKey.String(name),
			AttemptKey.Int(in.Attempt()),
		)
	}
	returned := false
	defer func() {
		if !returned { // a panic is unwinding: the bus recovers it above us
			failSpanWith(span, panicErrorType, "panic")
			m.recordProcess(ctx, start, panicErrorType)
		}
		span.End()
	}()
	err := next.Call(ctx)
	returned = true
	if err != nil {
		et := errorType(err)
		failSpan(span, et, err)
		m.recordProcess(ctx, start, et)
		return err
	}
	if in.Unhandled() { // discarded by the bus: no handler, nothing failed
		if span.IsRecording() {
			span.SetAttributes(UnhandledKey.Bool(true))
		}
		m.consumed.Int64Counter.Add(ctx, 1, m.discard.addOpts...)
		m.processDur.Float64Histogram.Record(ctx, time.Since(start).Seconds(), m.discard.recOpts...)
		return nil
	}
	m.recordProcess(ctx, start, attribute.KeyValue{})
	return nil
}

// recordProcess records one consumed message and its process duration;
// errType is empty on success.
func (m *middleware) recordProcess(ctx context.Context, start time.Time, errType attribute.KeyValue) {
	d := time.Since(start).Seconds()
	if !errType.Valid() {
		m.consumed.Int64Counter.Add(ctx, 1, m.process.addOpts...)
		m.processDur.Float64Histogram.Record(ctx, d, m.process.recOpts...)
		return
	}
	set := m.process.failed(errType)
	m.consumed.AddSet(ctx, 1, set)
	m.processDur.RecordSet(ctx, d, set)
}

// handling wraps each handler in an internal span named after it.
func (m *middleware) handling(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
	name := h.HandlerName()
	ctx, span := m.tracer.Start(ctx, name, m.handler(name)...)
	if span.IsRecording() {
		span.SetAttributes(MessageNameKey.String(h.MessageName()))
	}
	returned := false
	defer func() {
		if !returned {
			failSpanWith(span, panicErrorType, "panic")
		}
		span.End()
	}()
	err := next.Call(ctx)
	returned = true
	if err != nil {
		failSpan(span, errorType(err), err)
	}
	return err
}

// outgoing runs at Send or Publish: a producer span, current while the rest
// of the chain runs, whose context is injected into the message attributes.
func (m *middleware) outgoing(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
	kind := out.Kind()
	name := out.Name()
	dest := out.Destination()
	if kind == bus.KindPublish {
		dest = name // a published message goes to whoever subscribed to its name
	}
	op := m.send(kind, dest)
	ctx, span := m.tracer.Start(ctx, kind.String()+" "+name, op.start...)
	if span.IsRecording() {
		attrs := out.Attributes()
		span.SetAttributes(
			semconv.MessagingMessageID(attrs.MessageID),
			semconv.MessagingMessageConversationID(attrs.CorrelationID),
			MessageNameKey.String(name),
		)
	}
	// Always inject, sampled or not: a non-recording span still carries the
	// trace id and the sampling decision the receiver must honour.
	m.prop.Inject(ctx, OutgoingCarrier(out))
	returned := false
	defer func() {
		if !returned {
			failSpanWith(span, panicErrorType, "panic")
			m.sent.AddSet(ctx, 1, op.failed(panicErrorType))
		}
		span.End()
	}()
	err := next.Call(ctx)
	returned = true
	if due := out.Due(); !due.IsZero() && span.IsRecording() {
		span.SetAttributes(DueKey.String(due.UTC().Format(time.RFC3339Nano)))
	}
	if err != nil {
		et := errorType(err)
		failSpan(span, et, err)
		m.sent.AddSet(ctx, 1, op.failed(et))
		return err
	}
	m.sent.Int64Counter.Add(ctx, 1, op.addOpts...)
	return nil
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
