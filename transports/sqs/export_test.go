package sqs

import (
	"context"
	"log/slog"
	"time"

	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/plugbus/plugbus/bus"
)

// Encode exposes the envelope encoding to the black-box tests: it returns
// the SQS message a receiver would get for env.
func Encode(env *bus.Envelope) (sqstypes.Message, error) {
	e, err := encode(env, DefaultMaxMessageSize)
	if err != nil {
		return sqstypes.Message{}, err
	}
	return sqstypes.Message{Body: &e.body, MessageAttributes: e.sqsAttributes()}, nil
}

// Decode exposes the reading of a received message, as the poller reads
// it (what a delayed copy carries is read, not applied); what it ignores
// is logged on log (nil: not logged).
func Decode(msg sqstypes.Message, log *slog.Logger) *bus.Delivery {
	d := &bus.Delivery{}
	decodeCarried(context.Background(), log, msg, d)
	return d
}

// AddFailure exposes how a failure is added to the attributes of a message
// being dead-lettered.
func AddFailure(attrs map[string]sqstypes.MessageAttributeValue, f bus.Failure) (map[string]sqstypes.MessageAttributeValue, error) {
	return withFailure(attrs, f)
}

// SNSNotification exposes the recognition of an SNS envelope.
func SNSNotification(body string) (topic string, ok bool) { return snsNotification(body) }

// WithHop sets the longest delay of one SQS message, 15 minutes in
// production, so that tests can exercise delays carried in hops.
func WithHop(d time.Duration) Option { return func(o *options) { o.hop = d } }

// WithInstanceHop sets the longest delay of one message on an instance
// queue, 45 s in production (the queue keeps a message 60 s).
func WithInstanceHop(d time.Duration) Option { return func(o *options) { o.instanceHop = d } }

// SendAt exposes the delayed send: env goes to the queue of dest, to be
// delivered no earlier than due.
func (t *Transport) SendAt(ctx context.Context, env *bus.Envelope, dest string, due time.Time) error {
	return t.send(ctx, env, dest, due)
}

// PublishAt exposes the delayed publish: every subscribed queue delivers
// env no earlier than due.
func (t *Transport) PublishAt(ctx context.Context, env *bus.Envelope, due time.Time) error {
	return t.publish(ctx, env, due)
}

// Carry exposes how the poller reads a received message: decoded, then
// with what a delayed copy carries applied, against maxAttempts. It
// returns the delivery and when it is due (zero: now).
func Carry(msg sqstypes.Message, maxAttempts int, log *slog.Logger) (*bus.Delivery, time.Time) {
	t := &Transport{log: log, maxAttempts: maxAttempts} // all that carry reads
	d := &bus.Delivery{}
	due := t.carry(context.Background(), d, decodeCarried(context.Background(), log, msg, d))
	return d, due
}

// CopyAttributes exposes the attributes ReturnAfter gives the delayed
// copy of a message with attrs.
func CopyAttributes(attrs map[string]sqstypes.MessageAttributeValue, prior int, due time.Time, retries bus.RetryHistory) (map[string]sqstypes.MessageAttributeValue, error) {
	return withCarried(attrs, prior, due, retries)
}

// MaxDelay is the longest delay of every Transport.
const MaxDelay = maxDelay
