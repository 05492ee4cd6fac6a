package sqs

import (
	"context"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/sqs/internal/sqshook"
)

// This file is what package sqslambda, the AWS Lambda receiver, uses of
// the transport through internal/sqshook: the same reading of a message,
// retry back-off and dead-lettering as the poller's.

func init() {
	sqshook.Decode = decode
	sqshook.ChangeVisibility = func(ctx context.Context, t bus.Transport, queue, receiptHandle string, delay time.Duration) error {
		return t.(*Transport).changeVisibility(ctx, queue, receiptHandle, delay)
	}
	sqshook.DeadLetter = func(ctx context.Context, t bus.Transport, endpoint string, msg sqstypes.Message, f bus.Failure) error {
		tr := t.(*Transport)
		dlq, err := tr.queueURLByName(ctx, tr.DeadLetterQueueName(endpoint))
		if err != nil {
			return err
		}
		return tr.deadLetter(context.WithoutCancel(ctx), dlq, msg, f) // the record failed for good: store it even if ctx ended meanwhile
	}
}

// changeVisibility makes a message received from the queue named queue
// visible again after delay. Once the queue is known the change is made
// even if ctx ends: the message failed already, and without the change it
// comes back only after the queue's visibility timeout.
func (t *Transport) changeVisibility(ctx context.Context, queue, receiptHandle string, delay time.Duration) error {
	url, err := t.queueURLByName(ctx, queue)
	if err != nil {
		return err
	}
	_, err = t.sqs.ChangeMessageVisibility(context.WithoutCancel(ctx), &awssqs.ChangeMessageVisibilityInput{
		QueueUrl: &url, ReceiptHandle: aws.String(receiptHandle), VisibilityTimeout: int32((min(delay, 12*time.Hour) + time.Second/2) / time.Second),
	})
	return err
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
