package sqs_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/sqs"
)

// A send to an endpoint whose queue does not exist is a *NoQueueError
// that matches bus.ErrNoRoute.
func TestSendToAnEndpointWithoutAQueue(t *testing.T) {
	tr, _ := openTransport(t)
	err := tr.Send(t.Context(), &bus.Envelope{Name: "n", Body: []byte("{}")}, "nobody")
	var nq *sqs.NoQueueError
	if !errors.As(err, &nq) || !errors.Is(err, bus.ErrNoRoute) || nq.Endpoint != "nobody" {
		t.Fatalf("Send to a missing queue: %v", err)
	}
}

// A send to the URL of a queue that does not exist is a *NoQueueError,
// unless the queue is an instance queue: the instance that waited for the
// message is gone, and the message is dropped.
func TestSendToTheURLOfAMissingQueue(t *testing.T) {
	tr, prefix := openTransport(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := tr.Setup(ctx, bus.Topology{Endpoint: "ep", Concurrency: 1, MaxAttempts: 1}); err != nil {
		t.Fatal(err)
	}
	out, err := tr.SQS().GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(tr.QueueName("ep"))})
	if err != nil {
		t.Fatal(err)
	}
	base := aws.ToString(out.QueueUrl)
	base = base[:strings.LastIndexByte(base, '/')+1]
	err = tr.Send(ctx, envelope("Order", "o1"), base+prefix+"billing-typo")
	var nq *sqs.NoQueueError
	if !errors.As(err, &nq) || !errors.Is(err, bus.ErrNoRoute) || nq.Queue != prefix+"billing-typo" {
		t.Errorf("Send to the URL of a missing queue: %v, want *sqs.NoQueueError", err)
	}
	if err := tr.Send(ctx, envelope("Reply", "r1"), base+prefix+"instance-0123456789abcdef"); err != nil {
		t.Errorf("Send to a missing instance queue: %v, want nil (dropped with a warning)", err)
	}
}
