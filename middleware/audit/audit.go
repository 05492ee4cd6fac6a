// Package audit writes one slog record per message per stage outcome: a
// message received and how its handling ended, each handler's run and
// its result, each message sent and whether it went out.
//
//	bus.WithMiddleware(audit.New()) // every stage, the bus's logger, INFO and WARN
//	bus.WithHandler(refund, bus.HandlerMiddleware(audit.New(audit.WithBody()))) // this handler's runs, with the body
//
// The records carry the fields chosen with [WithFields] (by default all
// but the body) under stable keys, with the message "audit" and the key
// "audit" naming the stage; the outcome is under "outcome":
//
//	stage     outcome
//	incoming  handled, discarded (no handler, bus.UnhandledDiscard),
//	          failed, permanent (dead-lettered at once), returned (for
//	          later, outside the retry policy: bus.RetryAfterDelay)
//	handler   succeeded, failed, permanent, returned (it asked for
//	          bus.RetryAfter; the message is returned for later only
//	          when every failed handler did)
//	outgoing  sent (to the transport, or buffered in the handler's outbox), failed
//
// Successes are logged at INFO and failures at WARN unless [WithLevels]
// says otherwise. The body is left out unless [WithBody] asks for it: a
// message may carry personal data.
//
// Given to one handler ([bus.HandlerMiddleware]) it audits the handler
// stage of that handler only. Served from another process it logs through
// that process's logger, which the host logs with its own.
package audit

import (
	"context"
	"errors"
	"log/slog"
	"time"
	"unicode/utf8"

	"github.com/plugbus/plugbus/bus"
)

// Field is a piece of a record [WithFields] can choose.
type Field uint16

// The fields, with the key each is logged under.
const (
	MessageName   Field = 1 << iota // "message_name"
	MessageID                       // "message_id"
	CorrelationID                   // "correlation_id"
	Attempt                         // "attempt" (incoming, handler)
	Endpoint                        // "endpoint" (incoming); "destination" (outgoing sends)
	Handler                         // "handler" (handler)
	Duration                        // "duration": how long the stage took, next included
	Error                           // "error", on failures
	Kind                            // "kind": send or publish (outgoing)
	Body                            // "body": the encoded body (incoming, handler), the message (outgoing)

	// DefaultFields is every field but Body.
	DefaultFields = MessageName | MessageID | CorrelationID | Attempt | Endpoint | Handler | Duration | Error | Kind
)

// Option configures [New].
type Option func(*auditor)

// WithLogger logs to l instead of the bus's logger.
func WithLogger(l *slog.Logger) Option { return func(a *auditor) { a.logger = l } }

// WithFields chooses the fields of each record (default [DefaultFields]).
func WithFields(f Field) Option { return func(a *auditor) { a.fields = f } }

// WithBody adds the body to the fields: the encoded body as received
// (as text when it is UTF-8, else as bytes), the message value as sent.
func WithBody() Option { return func(a *auditor) { a.fields |= Body } }

// WithAttributes adds the named attributes of each message (one-hop or
// sticky; "tenant", say) to its records, under "attr.<key>".
func WithAttributes(keys ...string) Option {
	return func(a *auditor) { a.attributes = append(a.attributes, keys...) }
}

// WithLevels sets the levels of the records of successes and of failures
// (default slog.LevelInfo and slog.LevelWarn).
func WithLevels(success, failure slog.Level) Option {
	return func(a *auditor) { a.success, a.failure = success, failure }
}

// WithStages audits only the given stages (default all three; per handler
// only the handler stage runs).
func WithStages(stages ...bus.Stage) Option {
	return func(a *auditor) { a.stages = stages }
}

type auditor struct {
	logger           *slog.Logger
	fields           Field
	attributes       []string
	success, failure slog.Level
	stages           []bus.Stage
	canDelay         bool // the bus's transport is a bus.Delayer, or not known
}

// New returns a plugin that audits every message of the bus, or of one
// handler. Records go to the bus's logger unless [WithLogger] says
// otherwise.
func New(opts ...Option) bus.Plugin {
	return bus.PluginFunc(func(info bus.PluginInfo) (bus.Middleware, error) {
		a := &auditor{fields: DefaultFields, success: slog.LevelInfo, failure: slog.LevelWarn,
			stages: []bus.Stage{bus.StageIncoming, bus.StageHandler, bus.StageOutgoing}}
		for _, o := range opts {
			o(a)
		}
		// Served from another process the transport is not known: every
		// first-party transport delays.
		_, delays := info.Transport.(bus.Delayer)
		a.canDelay = delays || info.Transport == nil
		if a.logger == nil {
			a.logger = info.Logger
		}
		if a.logger == nil {
			a.logger = slog.Default()
		}
		m := bus.Middleware{Name: "audit"}
		for _, s := range a.stages {
			switch {
			case s == bus.StageHandler:
				m.Handling = a.handling
			case s == bus.StageIncoming && info.Handler == "":
				m.Incoming = a.incoming
			case s == bus.StageOutgoing && info.Handler == "":
				m.Outgoing = a.outgoing
			}
		}
		if m.Handling == nil && m.Incoming == nil && m.Outgoing == nil {
			return m, errors.New("audit.WithStages: no stage to audit here (per handler, only bus.StageHandler runs)")
		}
		return m, nil
	})
}

// outcome names how a stage ended, and whether it is a failure: returned
// when the bus gives the message back for later rather than apply its
// retry policy (bus.RetryAfterDelay, on a transport that can delay).
func (a *auditor) outcome(err error, success string) (string, bool) {
	switch {
	case err == nil:
		return success, false
	case bus.IsPermanent(err):
		return "permanent", true
	}
	if _, later := bus.RetryAfterDelay(err); later && a.canDelay {
		return "returned", true
	}
	return "failed", true
}

// level returns the level of a record of an outcome, and whether the
// logger takes it: when it does not, the record is not even built.
func (a *auditor) level(ctx context.Context, failed bool) (slog.Level, bool) {
	level := a.success
	if failed {
		level = a.failure
	}
	return level, a.logger.Enabled(ctx, level)
}

func (a *auditor) common(attrs []slog.Attr, name string, ba bus.Attributes, started time.Time, err error) []slog.Attr {
	if a.fields&MessageName != 0 {
		attrs = append(attrs, slog.String("message_name", name))
	}
	if a.fields&MessageID != 0 {
		attrs = append(attrs, slog.String("message_id", ba.MessageID))
	}
	if a.fields&CorrelationID != 0 {
		attrs = append(attrs, slog.String("correlation_id", ba.CorrelationID))
	}
	for _, k := range a.attributes {
		v, ok := ba.Value(k)
		if !ok {
			v, ok = ba.StickyValue(k)
		}
		if ok {
			attrs = append(attrs, slog.String("attr."+k, v))
		}
	}
	if a.fields&Duration != 0 {
		attrs = append(attrs, slog.Duration("duration", time.Since(started)))
	}
	if err != nil && a.fields&Error != 0 {
		attrs = append(attrs, slog.String("error", err.Error()))
	}
	return attrs
}

func bodyAttr(b []byte) slog.Attr {
	if utf8.Valid(b) {
		return slog.String("body", string(b))
	}
	return slog.Any("body", b)
}

func (a *auditor) incoming(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
	started := time.Now()
	err := next.Call(ctx)
	name, failed := a.outcome(err, "handled")
	if err == nil && in.Unhandled() {
		name = "discarded"
	}
	level, enabled := a.level(ctx, failed)
	if !enabled {
		return err
	}
	attrs := make([]slog.Attr, 0, 12)
	attrs = append(attrs, slog.String("audit", "incoming"), slog.String("outcome", name))
	attrs = a.common(attrs, in.Name(), in.Attributes(), started, err)
	if a.fields&Attempt != 0 {
		attrs = append(attrs, slog.Int("attempt", in.Attempt()))
	}
	if a.fields&Endpoint != 0 {
		attrs = append(attrs, slog.String("endpoint", in.Endpoint()))
	}
	if a.fields&Body != 0 {
		attrs = append(attrs, bodyAttr(in.Body()))
	}
	a.logger.LogAttrs(ctx, level, "audit", attrs...)
	return err
}

func (a *auditor) handling(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
	started := time.Now()
	err := next.Call(ctx)
	name, failed := a.outcome(err, "succeeded")
	level, enabled := a.level(ctx, failed)
	if !enabled {
		return err
	}
	attrs := make([]slog.Attr, 0, 12)
	attrs = append(attrs, slog.String("audit", "handler"), slog.String("outcome", name))
	attrs = a.common(attrs, h.MessageName(), h.Attributes(), started, err)
	if a.fields&Handler != 0 {
		attrs = append(attrs, slog.String("handler", h.HandlerName()))
	}
	if a.fields&Attempt != 0 {
		attrs = append(attrs, slog.Int("attempt", h.Attempt()))
	}
	if a.fields&Body != 0 {
		attrs = append(attrs, bodyAttr(h.Body()))
	}
	a.logger.LogAttrs(ctx, level, "audit", attrs...)
	return err
}

func (a *auditor) outgoing(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
	started := time.Now()
	err := next.Call(ctx)
	name, failed := a.outcome(err, "sent")
	level, enabled := a.level(ctx, failed)
	if !enabled {
		return err
	}
	attrs := make([]slog.Attr, 0, 12)
	attrs = append(attrs, slog.String("audit", "outgoing"), slog.String("outcome", name))
	attrs = a.common(attrs, out.Name(), out.Attributes(), started, err)
	if a.fields&Kind != 0 {
		attrs = append(attrs, slog.String("kind", out.Kind().String()))
	}
	if a.fields&Endpoint != 0 && out.Destination() != "" {
		attrs = append(attrs, slog.String("destination", out.Destination()))
	}
	if a.fields&Body != 0 {
		attrs = append(attrs, slog.Any("body", out.Message()))
	}
	a.logger.LogAttrs(ctx, level, "audit", attrs...)
	return err
}
