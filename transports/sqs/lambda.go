package sqs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/plugbus/plugbus/bus"
)

// Event is the payload AWS Lambda passes to a function triggered by an SQS
// queue. Its JSON shape is Lambda's, so a Lambda runtime can decode the
// event straight into it.
type Event struct {
	Records []EventRecord `json:"Records"`
}

// EventRecord is one SQS message of an [Event].
type EventRecord struct {
	MessageID              string                           `json:"messageId"`
	ReceiptHandle          string                           `json:"receiptHandle"`
	Body                   string                           `json:"body"`
	MD5OfBody              string                           `json:"md5OfBody"`
	MD5OfMessageAttributes string                           `json:"md5OfMessageAttributes,omitempty"`
	Attributes             map[string]string                `json:"attributes"`
	MessageAttributes      map[string]EventMessageAttribute `json:"messageAttributes"`
	EventSourceARN         string                           `json:"eventSourceARN"`
	EventSource            string                           `json:"eventSource"`
	AWSRegion              string                           `json:"awsRegion"`
}

// EventMessageAttribute is one message attribute of an [EventRecord].
type EventMessageAttribute struct {
	StringValue      *string  `json:"stringValue,omitempty"`
	BinaryValue      []byte   `json:"binaryValue,omitempty"`
	StringListValues []string `json:"stringListValues,omitempty"`
	BinaryListValues [][]byte `json:"binaryListValues,omitempty"`
	DataType         string   `json:"dataType"`
}

// BatchResponse is what a Lambda function with ReportBatchItemFailures
// enabled on its SQS event source mapping returns: the records to retry.
// Lambda deletes the others.
type BatchResponse struct {
	BatchItemFailures []BatchItemFailure `json:"batchItemFailures"`
}

// BatchItemFailure names one record to retry by its message id.
type BatchItemFailure struct {
	ItemIdentifier string `json:"itemIdentifier"`
}

// LambdaHandler handles one SQS event. It has the shape a Lambda runtime
// accepts as a handler: func(ctx, event) (response, error).
type LambdaHandler func(ctx context.Context, ev Event) (BatchResponse, error)

// LambdaOption configures [NewLambdaHandler].
type LambdaOption func(*lambdaOptions)

type lambdaOptions struct {
	maxAttempts int
	logger      *slog.Logger
}

// LambdaMaxAttempts sets the attempt at which a failing record is
// dead-lettered instead of retried; use the bus's bus.WithMaxAttempts
// value and the queue's maxReceiveCount. The default is 5, the bus's.
func LambdaMaxAttempts(n int) LambdaOption { return func(o *lambdaOptions) { o.maxAttempts = n } }

// LambdaLogger sets the logger. The default is slog.Default().
func LambdaLogger(l *slog.Logger) LambdaOption { return func(o *lambdaOptions) { o.logger = l } }

// NewLambdaHandler returns a Lambda handler that runs each record of an SQS
// event through b (bus.(*Bus).Deliver: the incoming pipeline, then the
// handlers) and reports the records that failed, so that Lambda retries
// only those. Enable ReportBatchItemFailures on the event source mapping:
// without it Lambda retries the whole batch when any record fails.
//
// b need not be started. When b's transport is a *Transport, a record that
// cannot be decoded, or that failed on its last attempt, is sent to the
// endpoint's dead-letter queue with its failure and reported as handled;
// otherwise it is reported as failed and the queue's redrive policy
// dead-letters it. A failed record is made visible again after the
// transport's retry back-off ([WithRetryBackoff]) rather than the queue's
// visibility timeout. Records left when ctx ends are reported as failed.
func NewLambdaHandler(b *bus.Bus, opts ...LambdaOption) LambdaHandler {
	o := lambdaOptions{maxAttempts: 5}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if o.logger == nil {
		o.logger = slog.Default()
	}
	log := o.logger.With(slog.String("transport", transportName), slog.String("receiver", "lambda"))
	tr, _ := b.Transport().(*Transport)
	return func(ctx context.Context, ev Event) (BatchResponse, error) {
		var resp BatchResponse
		for _, rec := range ev.Records {
			if ctx.Err() != nil {
				resp.BatchItemFailures = append(resp.BatchItemFailures, BatchItemFailure{ItemIdentifier: rec.MessageID})
				continue
			}
			if !deliverRecord(ctx, b, tr, o.maxAttempts, log, rec) {
				resp.BatchItemFailures = append(resp.BatchItemFailures, BatchItemFailure{ItemIdentifier: rec.MessageID})
			}
		}
		return resp, nil
	}
}

// deliverRecord runs one record and reports whether Lambda may delete it.
func deliverRecord(ctx context.Context, b *bus.Bus, tr *Transport, maxAttempts int, log *slog.Logger, rec EventRecord) bool {
	msg := rec.Message()
	d := &bus.Delivery{}
	decode(ctx, log, msg, d)
	err := b.Deliver(ctx, d)
	if err == nil {
		return true
	}
	attrs := []any{slog.String("sqs_message_id", rec.MessageID), slog.String("message_name", d.Name),
		slog.String("message_id", d.Attributes.MessageID), slog.Int("attempt", d.Attempt), slog.Any("error", err)}
	final := bus.IsPoison(err) || d.Attempt >= maxAttempts
	if !final || errors.Is(err, bus.ErrClosed) {
		log.WarnContext(ctx, "record failed; Lambda will retry it", attrs...)
		if tr != nil {
			tr.delayRecord(ctx, rec, d.Attempt, log)
		}
		return false
	}
	if tr == nil {
		log.ErrorContext(ctx, "record failed for good; the queue's redrive policy will dead-letter it (the bus's transport is not an sqs.Transport, so the failure is not stored)", attrs...)
		return false
	}
	endpoint := b.Endpoint()
	dlq, err2 := tr.queueURLByName(ctx, tr.DeadLetterQueueName(endpoint))
	if err2 == nil {
		err2 = tr.deadLetter(context.WithoutCancel(ctx), dlq, msg, bus.Failure{Reason: err.Error(), Attempts: d.Attempt, Endpoint: endpoint})
	}
	if err2 != nil {
		log.ErrorContext(ctx, "record failed for good and dead-lettering it failed; Lambda will retry it", append(attrs, slog.Any("dead_letter_error", err2))...)
		return false
	}
	log.ErrorContext(ctx, "record dead-lettered", attrs...)
	return true
}

// Message returns the record as the SQS message a poller would have
// received: what Delivery.Raw holds, for incoming middleware.
func (r EventRecord) Message() sqstypes.Message {
	m := sqstypes.Message{
		MessageId: aws.String(r.MessageID), ReceiptHandle: aws.String(r.ReceiptHandle), Body: aws.String(r.Body),
		Attributes: r.Attributes,
	}
	if r.MD5OfBody != "" {
		m.MD5OfBody = aws.String(r.MD5OfBody)
	}
	if r.MD5OfMessageAttributes != "" {
		m.MD5OfMessageAttributes = aws.String(r.MD5OfMessageAttributes)
	}
	if len(r.MessageAttributes) > 0 {
		m.MessageAttributes = make(map[string]sqstypes.MessageAttributeValue, len(r.MessageAttributes))
		for k, v := range r.MessageAttributes {
			m.MessageAttributes[k] = sqstypes.MessageAttributeValue{
				DataType: aws.String(v.DataType), StringValue: v.StringValue, BinaryValue: v.BinaryValue,
				StringListValues: v.StringListValues, BinaryListValues: v.BinaryListValues,
			}
		}
	}
	return m
}

// delayRecord applies the retry back-off to a failed record, which would
// otherwise come back after the queue's visibility timeout.
func (t *Transport) delayRecord(ctx context.Context, rec EventRecord, attempt int, log *slog.Logger) {
	delay := t.backoff(attempt)
	if delay <= 0 || rec.ReceiptHandle == "" {
		return
	}
	// arn:aws:sqs:region:account:name
	parts := strings.Split(rec.EventSourceARN, ":")
	if len(parts) != 6 {
		log.WarnContext(ctx, "record has no queue ARN; it comes back after the queue's visibility timeout", slog.String("event_source_arn", rec.EventSourceARN))
		return
	}
	url, err := t.queueURLByName(ctx, parts[5])
	if err == nil {
		_, err = t.sqs.ChangeMessageVisibility(context.WithoutCancel(ctx), &awssqs.ChangeMessageVisibilityInput{
			QueueUrl: &url, ReceiptHandle: aws.String(rec.ReceiptHandle), VisibilityTimeout: int32((delay + time.Second/2) / time.Second),
		})
	}
	if err != nil {
		log.WarnContext(ctx, "delaying a failed record failed; it comes back after the queue's visibility timeout", slog.String("sqs_message_id", rec.MessageID), slog.Any("error", err))
	}
}

// queueURLByName looks a queue up by name, once.
func (t *Transport) queueURLByName(ctx context.Context, name string) (string, error) {
	t.cacheMu.Lock()
	url, ok := t.urls[name]
	t.cacheMu.Unlock()
	if ok {
		return url, nil
	}
	url, err := t.lookupQueue(ctx, name)
	if err != nil {
		return "", fmt.Errorf("looking up queue %s: %w", name, err)
	}
	return url, nil
}
