// Package sqslambda runs a plugbus bus on AWS Lambda, fed by an SQS event
// source mapping instead of the sqs transport's poller.
//
// Lambda receives and deletes; [NewHandler] returns a handler that runs
// each record of an SQS event through a bus (bus.(*Bus).Deliver: incoming
// middleware, then handlers) and reports the records that failed, so that
// Lambda retries only those:
//
//	tr, err := sqs.New(cfg)
//	if err != nil {
//		log.Fatal(err)
//	}
//	b, err := bus.New(bus.WithEndpoint("billing"), bus.WithTransport(tr), bus.WithHandler(invoice))
//	if err != nil {
//		log.Fatal(err)
//	}
//	handler, err := sqslambda.NewHandler(b, sqslambda.WithMaxAttempts(5))
//	if err != nil {
//		log.Fatal(err)
//	}
//	lambda.Start(handler) // github.com/aws/aws-lambda-go
//
// [Event], [Record] and [BatchResponse] mirror Lambda's JSON, so this
// package needs no Lambda library; any runtime that decodes the event into
// them works. A record is read exactly as the sqs transport reads a
// message it received, and, when the bus's transport is an
// *sqs.Transport, dead-lettered and retried as that transport does.
// docs/transports/sqs.md describes the set-up.
package sqslambda

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/sqs"
	"github.com/plugbus/plugbus/transports/sqs/internal/sqshook"
)

// Handler handles one SQS event. It has the shape a Lambda runtime accepts
// as a handler: func(ctx, event) (response, error).
type Handler func(ctx context.Context, ev Event) (BatchResponse, error)

// Option configures [NewHandler].
type Option func(*options)

type options struct {
	maxAttempts int
	logger      *slog.Logger
	backoff     bus.Backoff
}

// WithMaxAttempts sets the attempt at which a failing record is
// dead-lettered instead of retried: the queue's maxReceiveCount, which
// Setup sets to the most deliveries the bus's retry policies give a
// message. The default is 5.
func WithMaxAttempts(n int) Option { return func(o *options) { o.maxAttempts = n } }

// WithBackoff sets how long a failed record stays invisible before Lambda
// receives it again: its n-th failure waits backoff.Delay(n). The
// default is bus.Backoff{Initial: time.Second, Max: 5 * time.Minute};
// delays are rounded to whole seconds, at most 12 hours. A zero
// bus.Backoff leaves a failed record to the queue's visibility timeout.
func WithBackoff(backoff bus.Backoff) Option { return func(o *options) { o.backoff = backoff } }

// WithLogger sets the logger. The default is slog.Default().
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// NewHandler returns a Lambda handler that runs each record of an SQS
// event through b and reports the records that failed, so that Lambda
// retries only those. Enable ReportBatchItemFailures on the event source
// mapping: without it Lambda retries the whole batch when any record
// fails.
//
// b need not be started. When b's transport is an *sqs.Transport, a record
// that cannot be decoded, or that failed on its last attempt, is sent to
// the endpoint's dead-letter queue with its failure and reported as
// handled; otherwise it is reported as failed and the queue's redrive
// policy dead-letters it. A failed record is made visible again after a
// back-off ([WithBackoff]) rather than the queue's visibility timeout.
// Records left when ctx ends are reported as failed.
//
// A nil bus is refused, and so is an option out of range (fewer than one
// attempt, a non-zero back-off that [bus.Backoff.Validate] refuses) with
// an [*sqs.OptionError].
func NewHandler(b *bus.Bus, opts ...Option) (Handler, error) {
	if b == nil {
		return nil, errors.New("sqslambda: NewHandler needs a bus")
	}
	o := options{maxAttempts: 5, backoff: bus.Backoff{Initial: time.Second, Max: 5 * time.Minute}}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if o.maxAttempts < 1 {
		return nil, &sqs.OptionError{Option: "sqslambda.WithMaxAttempts", Value: strconv.Itoa(o.maxAttempts),
			Reason: "a record needs at least one attempt: give the queue's maxReceiveCount, the most deliveries the bus's retry policies give a message"}
	}
	if o.backoff != (bus.Backoff{}) {
		if err := o.backoff.Validate(); err != nil {
			return nil, &sqs.OptionError{Option: "sqslambda.WithBackoff", Value: fmt.Sprintf("{Initial: %s, Max: %s}", o.backoff.Initial, o.backoff.Max),
				Reason: strings.TrimPrefix(err.Error(), "bus: ") + " (or a zero bus.Backoff, to leave a failed record to the queue's visibility timeout)"}
		}
	}
	if o.logger == nil {
		o.logger = slog.Default()
	}
	log := o.logger.With(slog.String("transport", "sqs"), slog.String("receiver", "lambda"))
	tr, _ := b.Transport().(*sqs.Transport)
	return func(ctx context.Context, ev Event) (BatchResponse, error) {
		var resp BatchResponse
		for _, rec := range ev.Records {
			if ctx.Err() != nil || !deliver(ctx, b, tr, o, log, rec) {
				resp.BatchItemFailures = append(resp.BatchItemFailures, BatchItemFailure{ItemIdentifier: rec.MessageID})
			}
		}
		return resp, nil
	}, nil
}

// deliver runs one record and reports whether Lambda may delete it.
func deliver(ctx context.Context, b *bus.Bus, tr *sqs.Transport, o options, log *slog.Logger, rec Record) bool {
	msg := rec.Message()
	d := &bus.Delivery{}
	sqshook.Decode(ctx, log, msg, d)
	err := b.Deliver(ctx, d)
	if err == nil {
		return true
	}
	attrs := []any{slog.String("sqs_message_id", rec.MessageID), slog.String("message_name", d.Name),
		slog.String("message_id", d.Attributes.MessageID), slog.Int("attempt", d.Attempt), slog.Any("error", err)}
	final := bus.IsPermanent(err) || d.Attempt >= o.maxAttempts
	if !final || errors.Is(err, bus.ErrClosed) {
		log.WarnContext(ctx, "record failed; Lambda will retry it", attrs...)
		if tr != nil {
			retryLater(ctx, tr, rec, o.backoff.Delay(d.Attempt), log)
		}
		return false
	}
	if tr == nil {
		log.ErrorContext(ctx, "record failed for good; the queue's redrive policy will dead-letter it (the bus's transport is not an sqs.Transport, so the failure is not stored)", attrs...)
		return false
	}
	endpoint := b.Endpoint()
	if err2 := sqshook.DeadLetter(ctx, tr, endpoint, msg, bus.Failure{Reason: err.Error(), Attempts: d.Attempt, Endpoint: endpoint}); err2 != nil {
		log.ErrorContext(ctx, "record failed for good and dead-lettering it failed; Lambda will retry it", append(attrs, slog.Any("dead_letter_error", err2))...)
		return false
	}
	log.ErrorContext(ctx, "record dead-lettered", attrs...)
	return true
}

// retryLater makes a failed record visible again after delay, rather than
// after the queue's visibility timeout.
func retryLater(ctx context.Context, tr *sqs.Transport, rec Record, delay time.Duration, log *slog.Logger) {
	if delay <= 0 || rec.ReceiptHandle == "" {
		return
	}
	// arn:aws:sqs:region:account:name
	parts := strings.Split(rec.EventSourceARN, ":")
	if len(parts) != 6 {
		log.WarnContext(ctx, "record has no queue ARN; it comes back after the queue's visibility timeout", slog.String("event_source_arn", rec.EventSourceARN))
		return
	}
	if err := sqshook.ChangeVisibility(ctx, tr, parts[5], rec.ReceiptHandle, delay); err != nil {
		log.WarnContext(ctx, "delaying a failed record failed; it comes back after the queue's visibility timeout", slog.String("sqs_message_id", rec.MessageID), slog.Any("error", err))
	}
}
