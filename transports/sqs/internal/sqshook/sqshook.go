// Package sqshook gives package sqslambda, the AWS Lambda receiver, what
// it shares with package sqs without making it public: the reading of a
// received message, and a transport's retry back-off and dead-lettering.
// The reading of a message stays in one place, package sqs, whatever
// receives it (the transport's poller or Lambda).
//
// Package sqs sets the functions in an init function, before any code of
// sqslambda runs, and nothing writes them afterwards.
package sqshook

import (
	"context"
	"log/slog"
	"time"

	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/plugbus/plugbus/bus"
)

var (
	// Decode reads msg into d as the transport's poller does; what it
	// ignores is logged on log (nil: not logged).
	Decode func(ctx context.Context, log *slog.Logger, msg sqstypes.Message, d *bus.Delivery)

	// Backoff returns the retry back-off of t (an *sqs.Transport) after
	// attempt: how long its Return keeps a failed message invisible.
	Backoff func(t bus.Transport, attempt int) time.Duration

	// ChangeVisibility makes the message with receiptHandle, received from
	// the queue named queue, visible again after delay, through t (an
	// *sqs.Transport). Once the queue is known, the change is made even if
	// ctx ends.
	ChangeVisibility func(ctx context.Context, t bus.Transport, queue, receiptHandle string, delay time.Duration) error

	// DeadLetter sends msg to the dead-letter queue of endpoint with f
	// added, as the Fail of t (an *sqs.Transport) does. Once the queue is
	// known, the message is sent even if ctx ends.
	DeadLetter func(ctx context.Context, t bus.Transport, endpoint string, msg sqstypes.Message, f bus.Failure) error
)
