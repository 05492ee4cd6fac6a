package sqs_test

import (
	"context"
	"errors"
	"testing"
	"time"

	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/dltest"
	"github.com/plugbus/plugbus/internal/sqstest"
)

// deleteQueue deletes the queue name.
func deleteQueue(ctx context.Context, t *testing.T, client *awssqs.Client, name string) {
	t.Helper()
	url, err := client.GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: &name})
	if err != nil {
		t.Fatalf("looking up queue %s: %v", name, err)
	}
	if _, err := client.DeleteQueue(ctx, &awssqs.DeleteQueueInput{QueueUrl: url.QueueUrl}); err != nil {
		t.Fatalf("deleting queue %s: %v", name, err)
	}
}

// An endpoint exists when either of its queues does: one whose
// dead-letter queue is gone has no dead letters, and one whose queue is
// gone still has its dead letters (a replay to it is refused and leaves
// them). Neither is an unknown endpoint.
func TestDeadLettersOfAnEndpointWithOneOfItsQueues(t *testing.T) {
	cfg := awsConfig(t)
	prefix := sqstest.UniquePrefix(t, cfg) // deletes every queue of the test at cleanup
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	const noDLQ, noQueue = "no-dlq", "no-queue"
	for _, ep := range []string{noDLQ, noQueue} {
		tr := sqstest.New(t, cfg, sqstest.FastOptions(prefix)...)
		if err := tr.Setup(ctx, bus.Topology{Endpoint: ep, MaxAttempts: 1, Concurrency: 1}); err != nil {
			t.Fatal(err)
		}
		if ep == noQueue {
			dltest.Make(ctx, t, tr, ep, dltest.Message{Name: "unknown.msg", Body: `{}`, Reason: "a"}, dltest.Message{Name: "unknown.msg", Body: `{}`, Reason: "b"})
		}
		if err := tr.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	m := sqstest.New(t, cfg, sqstest.FastOptions(prefix)...)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	deleteQueue(ctx, t, m.SQS(), m.DeadLetterQueueName(noDLQ))
	deleteQueue(ctx, t, m.SQS(), m.QueueName(noQueue))

	dltest.CheckOneQueueLeft(ctx, t, m, noDLQ, noQueue)
}

// A replay to the address of an instance queue that no longer exists (its
// instance stopped) is refused and leaves the dead letter: Send drops a
// message to such a queue with a warning, and the replay then deleted the
// dead letter of a copy that went nowhere.
func TestReplayToAMissingInstanceQueueKeepsTheDeadLetter(t *testing.T) {
	cfg := awsConfig(t)
	prefix := sqstest.UniquePrefix(t, cfg)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	gone := sqstest.GoneInstanceAddress(ctx, t, cfg, prefix)
	const ep = "replay-instance"
	tr := sqstest.New(t, cfg, sqstest.FastOptions(prefix)...)
	t.Cleanup(func() { _ = tr.Close(context.Background()) })
	if err := tr.Setup(ctx, bus.Topology{Endpoint: ep, MaxAttempts: 1, Concurrency: 1}); err != nil {
		t.Fatal(err)
	}
	dltest.Make(ctx, t, tr, ep, dltest.Message{Name: "unknown.msg", Body: `{}`, Reason: "failed"})
	n, err := tr.ReplayDeadLetters(ctx, bus.DeadLetterFilter{Endpoint: ep}, bus.Replay{To: gone}, nil)
	var ue *bus.UnknownEndpointError
	if n != 0 || !errors.As(err, &ue) || ue.Endpoint != gone {
		t.Errorf("replay to %s = %d, %v; want 0 and a *bus.UnknownEndpointError naming it", gone, n, err)
	}
	if dls, err := tr.ListDeadLetters(ctx, bus.DeadLetterFilter{Endpoint: ep}); err != nil || len(dls) != 1 {
		t.Errorf("after the replay %d dead letters (%v), want the 1 as it was", len(dls), err)
	}
}
