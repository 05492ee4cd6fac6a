package sqs_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/dltest"
	"github.com/plugbus/plugbus/internal/sqstest"
	"github.com/plugbus/plugbus/transports/sqs"
)

var errAlwaysFails = errors.New("payment provider unavailable")

// A message whose handler keeps failing is retried MaxAttempts times, then
// lands in the dead-letter queue with its failure.
func TestRetriesThenDeadLetter(t *testing.T) {
	cfg := awsConfig(t)
	prefix := sqstest.UniquePrefix(t, cfg)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	tr := sqstest.New(t, cfg, sqstest.FastOptions(prefix)...)
	var calls atomic.Int32
	attempts := make(chan int, 8)
	b, err := bus.New(
		bus.WithEndpoint("payments"),
		bus.WithTransport(tr),
		bus.WithMaxAttempts(3),
		bus.WithConcurrency(2),
		bus.WithMiddleware(bus.Middleware{Name: "attempts", Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
			attempts <- in.Attempt()
			return next.Call(ctx)
		}}),
		bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error {
			calls.Add(1)
			return errAlwaysFails
		}),
	)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(ctx, orderPlaced{ID: "p-1"}, bus.WithMessageID("poison-1"), bus.WithAttribute("k", "v")); err != nil {
		t.Fatal(err)
	}
	probe := sqstest.New(t, cfg, sqstest.FastOptions(prefix)...)
	dl := sqstest.DeadLetters(ctx, t, probe, "payments", 1)
	if err := b.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	close(attempts)
	var seen []int
	for a := range attempts {
		seen = append(seen, a)
	}
	if len(seen) != 3 || seen[0] != 1 || seen[1] != 2 || seen[2] != 3 {
		t.Errorf("attempts seen by incoming middleware = %v, want [1 2 3]", seen)
	}
	if len(dl) != 1 {
		t.Fatalf("dead letters = %d, want 1", len(dl))
	}
	got := dl[0]
	if got.Envelope.Name != (orderPlaced{}).MessageName() || got.Envelope.Attributes.MessageID != "poison-1" || string(got.Envelope.Body) != `{"id":"p-1"}` {
		t.Errorf("dead-letter envelope = %+v", got.Envelope)
	}
	if v, _ := got.Envelope.Attributes.Value("k"); v != "v" {
		t.Errorf("dead-letter attribute k = %q", v)
	}
	f := got.Failure
	if !strings.Contains(f.Reason, errAlwaysFails.Error()) || f.Attempts != 3 || f.Endpoint != "payments" || time.Since(f.Time) > time.Minute {
		t.Errorf("failure = %+v", f)
	}
	if calls.Load() != 3 {
		t.Errorf("handler ran %d times, want 3", calls.Load())
	}
}

// The queue's redrive policy dead-letters a message that is received
// MaxAttempts times and never settled (a consumer that keeps crashing).
func TestRedrivePolicy(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	tr, _ := openTransport(t)
	if err := tr.Setup(ctx, bus.Topology{Endpoint: "crashy", MaxAttempts: 2, Concurrency: 1}); err != nil {
		t.Fatal(err)
	}
	env := &bus.Envelope{Name: "test.job", Body: []byte(`{"job":1}`), Attributes: bus.NewAttributes("job-1", "c", time.Now(), nil, nil)}
	if err := tr.Send(ctx, env, "crashy"); err != nil {
		t.Fatal(err)
	}
	client := tr.SQS()
	url, err := client.GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(tr.QueueName("crashy"))})
	if err != nil {
		t.Fatal(err)
	}
	// Receive it without settling, making it visible again at once, as a
	// crashing consumer would after its visibility timeout.
	for i := range 3 {
		out, err := client.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{QueueUrl: url.QueueUrl, WaitTimeSeconds: 1})
		if err != nil {
			t.Fatal(err)
		}
		if i < 2 && len(out.Messages) != 1 {
			t.Fatalf("receive %d got %d messages", i+1, len(out.Messages))
		}
		for _, m := range out.Messages {
			if _, err := client.ChangeMessageVisibility(ctx, &awssqs.ChangeMessageVisibilityInput{QueueUrl: url.QueueUrl, ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: 0}); err != nil {
				t.Fatal(err)
			}
		}
		if i == 2 && len(out.Messages) != 0 {
			t.Fatalf("receive 3 still got the message; the redrive policy should have moved it")
		}
	}
	dlURL, err := client.GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(tr.DeadLetterQueueName("crashy"))})
	if err != nil {
		t.Fatal(err)
	}
	out, err := client.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{QueueUrl: dlURL.QueueUrl, WaitTimeSeconds: 1, MessageAttributeNames: []string{"All"}})
	if err != nil || len(out.Messages) != 1 {
		t.Fatalf("dead-letter queue: %v messages, %v", len(out.Messages), err)
	}
	dl, err := sqs.DecodeDeadLetter(out.Messages[0])
	if err == nil || !strings.Contains(err.Error(), "redrive") {
		t.Errorf("DecodeDeadLetter of a redriven message: %v, want an error saying it has no failure", err)
	}
	if dl.Envelope.Attributes.MessageID != "job-1" || string(dl.Envelope.Body) != `{"job":1}` {
		t.Errorf("redriven envelope = %+v", dl.Envelope)
	}
}

// A message not sent by plugbus cannot be read: the bus dead-letters it at
// once with the reason, keeping its body and attributes.
func TestForeignMessageDeadLettered(t *testing.T) {
	cfg := awsConfig(t)
	prefix := sqstest.UniquePrefix(t, cfg)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	b, err := bus.New(
		bus.WithEndpoint("inbox"),
		bus.WithTransport(sqstest.New(t, cfg, sqstest.FastOptions(prefix)...)),
		bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error { return nil }),
	)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer b.Stop(context.Background())
	probe := sqstest.New(t, cfg, sqstest.FastOptions(prefix)...)
	url, err := probe.SQS().GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(probe.QueueName("inbox"))})
	if err != nil {
		t.Fatal(err)
	}
	_, err = probe.SQS().SendMessage(ctx, &awssqs.SendMessageInput{QueueUrl: url.QueueUrl, MessageBody: aws.String("hello"),
		MessageAttributes: map[string]sqstypes.MessageAttributeValue{"origin": {DataType: aws.String("String"), StringValue: aws.String("legacy")}}})
	if err != nil {
		t.Fatal(err)
	}
	dlURL, err := probe.SQS().GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(probe.DeadLetterQueueName("inbox"))})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []sqstypes.Message
	for len(msgs) == 0 && ctx.Err() == nil {
		out, err := probe.SQS().ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{QueueUrl: dlURL.QueueUrl, WaitTimeSeconds: 1, MessageAttributeNames: []string{"All"}})
		if err != nil {
			t.Fatal(err)
		}
		msgs = out.Messages
	}
	if len(msgs) != 1 {
		t.Fatalf("dead letters: %d", len(msgs))
	}
	m := msgs[0]
	if aws.ToString(m.Body) != "hello" || aws.ToString(m.MessageAttributes["origin"].StringValue) != "legacy" {
		t.Errorf("dead letter body %q attributes %v", aws.ToString(m.Body), m.MessageAttributes)
	}
	dl, _ := sqs.DecodeDeadLetter(m)
	if !strings.Contains(dl.Failure.Reason, `no "plugbus" attribute`) || dl.Failure.Endpoint != "inbox" {
		t.Errorf("failure = %+v", dl.Failure)
	}
}

// An interrupted replay that cannot make the dead letters it still holds
// visible again says so besides ctx's error: they come back only after
// the management visibility timeout. The queue is deleted under the
// replay, so that making them visible fails.
func TestInterruptedReplayReportsDeadLettersLeftHidden(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	probe, _ := openTransport(t)
	if err := probe.Setup(ctx, bus.Topology{Endpoint: "hidden", MaxAttempts: 1, Concurrency: 1}); err != nil {
		t.Fatal(err)
	}
	dead := dltest.Message{Name: "test.job", Body: `{}`, Reason: "boom"}
	dltest.Make(ctx, t, probe, "hidden", dead, dead, dead)
	dlURL, err := probe.SQS().GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(probe.DeadLetterQueueName("hidden"))})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	n, err := probe.ReplayDeadLetters(rctx, bus.DeadLetterFilter{Endpoint: "hidden"}, bus.Replay{By: "test"}, func(bus.DeadLetter) {
		if _, err := probe.SQS().DeleteQueue(ctx, &awssqs.DeleteQueueInput{QueueUrl: dlURL.QueueUrl}); err != nil {
			t.Error(err)
		}
		stop()
	})
	if n != 1 || !errors.Is(err, context.Canceled) || !strings.Contains(fmt.Sprint(err), "visible again failed") {
		t.Fatalf("ReplayDeadLetters = %d, %v; want 1 and context.Canceled joined with the failure to make 2 visible again", n, err)
	}
}
