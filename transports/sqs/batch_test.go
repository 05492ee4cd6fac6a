package sqs_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/smithy-go/middleware"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/sqstest"
	"github.com/plugbus/plugbus/transports/sqs"
)

// batchCalls records the number of entries of each SendMessageBatch call.
type batchCalls struct {
	mu      sync.Mutex
	entries []int
}

func (c *batchCalls) option(o *awssqs.Options) {
	o.APIOptions = append(o.APIOptions, func(s *middleware.Stack) error {
		return s.Initialize.Add(middleware.InitializeMiddlewareFunc("count-batches",
			func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
				if b, ok := in.Parameters.(*awssqs.SendMessageBatchInput); ok {
					c.mu.Lock()
					c.entries = append(c.entries, len(b.Entries))
					c.mu.Unlock()
				}
				return next.HandleInitialize(ctx, in)
			}), middleware.After)
	})
}

// A batch is split into calls of at most 10 entries and 256 KiB: of 25
// messages of 30 KiB, 8 fit in a call; the 25 small ones after them fill
// the last call of big ones and two more. Every message arrives. A send to an endpoint without a queue
// fails alone, with a *NoQueueError.
func TestBatchSplitsByCountAndSize(t *testing.T) {
	cfg := awsConfig(t)
	prefix := sqstest.UniquePrefix(t, cfg)
	var calls batchCalls
	tr := sqstest.New(t, cfg, append(sqstest.FastOptions(prefix), sqs.WithSQSOptions(calls.option))...)
	t.Cleanup(func() { _ = tr.Close(context.Background()) })
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	// MaxAttempts 3, not 1: SQS counts a receive whose answer was lost (a
	// 300 KiB answer the SDK failed to read and asked again for, seen under
	// load) as a receive, and with a redrive after one receive the message
	// would go to the dead-letter queue once its visibility timeout ends.
	if err := tr.Setup(ctx, bus.Topology{Endpoint: "ep", Handles: []string{"big", "small"}, Concurrency: 1, MaxAttempts: 3}); err != nil {
		t.Fatal(err)
	}
	var batch []bus.Outbound
	for i := range 25 {
		env := envelope("big", "big-"+strconv.Itoa(i))
		env.Body = []byte(`"` + strings.Repeat("x", 30<<10) + `"`)
		batch = append(batch, bus.Outbound{Kind: bus.KindSend, Envelope: env, Destination: "ep"})
	}
	for i := range 25 {
		batch = append(batch, bus.Outbound{Kind: bus.KindSend, Envelope: envelope("small", "small-"+strconv.Itoa(i)), Destination: "ep"})
	}
	batch = append(batch, bus.Outbound{Kind: bus.KindSend, Envelope: envelope("small", "lost"), Destination: "nobody"})
	err := tr.SendBatch(ctx, batch)
	var be *bus.BatchError
	var nq *sqs.NoQueueError
	if !errors.As(err, &be) || len(be.Failures) != 1 || be.Failures[0].Index != 50 || !errors.As(be.Failures[0].Err, &nq) {
		t.Fatalf("SendBatch = %v, want the send to nobody (index 50) alone failed with a *sqs.NoQueueError", err)
	}
	calls.mu.Lock()
	entries := append([]int(nil), calls.entries...)
	calls.mu.Unlock()
	slices.Sort(entries)
	if !slices.Equal(entries, []int{6, 8, 8, 8, 10, 10}) {
		t.Errorf("calls of %v entries, want 8, 8, 8 (256 KiB each), 1 big + 9 small, 10 and 6", entries)
	}
	seen := map[string]bool{}
	for len(seen) < 50 {
		d, err := tr.Receive(ctx)
		if err != nil {
			t.Fatalf("Receive after %d of 50 (%v): %v", len(seen), seen, err)
		}
		if d.Err != nil {
			t.Errorf("received %s with error %v", d.Attributes.MessageID, d.Err)
		}
		seen[d.Attributes.MessageID] = true
		if err := tr.Delete(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
}

// An entry SQS or SNS refuses fails alone, named by its index in the
// batch however the batch was split into calls, while the entries around
// it are sent. The queue takes messages of 2 KiB at most and SNS of
// 256 KiB: of 25 messages, the sends of 3000 bytes (every third) and the
// publishes of 300 KiB (indexes 0 and 14) are refused, each with a
// *sqs.EntryError; the 21 sends went out in three calls (10, 10, 1), the 4
// publishes in four (one of 300 KiB is alone in its call).
func TestBatchEntryFailuresNameTheirIndexes(t *testing.T) {
	cfg := awsConfig(t)
	prefix := sqstest.UniquePrefix(t, cfg)
	var calls batchCalls
	tr := sqstest.New(t, cfg, append(sqstest.FastOptions(prefix), sqs.WithMaxMessageSize(1<<20), sqs.WithSQSOptions(calls.option))...)
	t.Cleanup(func() { _ = tr.Close(context.Background()) })
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := tr.Setup(ctx, bus.Topology{Endpoint: "ep", Handles: []string{"evt"}, Concurrency: 1, MaxAttempts: 3}); err != nil {
		t.Fatal(err)
	}
	url, err := tr.SQS().GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(tr.QueueName("ep"))})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.SQS().SetQueueAttributes(ctx, &awssqs.SetQueueAttributesInput{QueueUrl: url.QueueUrl,
		Attributes: map[string]string{"MaximumMessageSize": "2048"}}); err != nil {
		t.Fatal(err)
	}
	var batch []bus.Outbound
	refused := map[int]bool{}
	for i := range 25 {
		m := bus.Outbound{Kind: bus.KindSend, Envelope: envelope("cmd", "m-"+strconv.Itoa(i)), Destination: "ep"}
		switch {
		case i%7 == 0:
			m = bus.Outbound{Kind: bus.KindPublish, Envelope: envelope("evt", "m-"+strconv.Itoa(i))}
			if i%2 == 0 {
				m.Envelope.Body = []byte(`"` + strings.Repeat("x", 300<<10) + `"`)
				refused[i] = true
			}
		case i%3 == 0:
			m.Envelope.Body = []byte(`"` + strings.Repeat("x", 3000) + `"`)
			refused[i] = true
		}
		batch = append(batch, m)
	}
	err = tr.SendBatch(ctx, batch)
	var be *bus.BatchError
	if !errors.As(err, &be) {
		t.Fatalf("SendBatch = %v, want a *bus.BatchError", err)
	}
	var got []int
	for _, f := range be.Failures {
		got = append(got, f.Index)
		var ee *sqs.EntryError
		if !errors.As(f.Err, &ee) || !ee.SenderFault {
			t.Errorf("message %d failed with %v, want a *sqs.EntryError with SenderFault", f.Index, f.Err)
		}
	}
	if want := []int{0, 3, 6, 9, 12, 14, 15, 18, 24}; !slices.Equal(got, want) {
		t.Errorf("failed indexes %v, want %v", got, want)
	}
	calls.mu.Lock()
	entries := append([]int(nil), calls.entries...)
	calls.mu.Unlock()
	slices.Sort(entries)
	if !slices.Equal(entries, []int{1, 10, 10}) {
		t.Errorf("SendMessageBatch calls of %v entries, want 10, 10 and 1", entries)
	}
	seen := map[string]bool{}
	for len(seen) < 25-len(refused) {
		d, err := tr.Receive(ctx)
		if err != nil {
			t.Fatalf("Receive after %d of %d (%v): %v", len(seen), 25-len(refused), seen, err)
		}
		id := d.Attributes.MessageID
		if i, _ := strconv.Atoi(strings.TrimPrefix(id, "m-")); refused[i] || seen[id] {
			t.Errorf("received %s: refused, or twice", id)
		}
		seen[id] = true
		if err := tr.Delete(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
}
