package sqslambda_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/sqstest"
	"github.com/plugbus/plugbus/transports/memory"
	"github.com/plugbus/plugbus/transports/sqs"
	"github.com/plugbus/plugbus/transports/sqs/sqslambda"
)

// lambdaEvent receives n messages from queue and shapes them as the JSON
// event Lambda would pass, decoded the way a Lambda runtime decodes it.
func lambdaEvent(ctx context.Context, t *testing.T, client *awssqs.Client, queueURL string, n int) sqslambda.Event {
	t.Helper()
	var recs []map[string]any
	for len(recs) < n && ctx.Err() == nil {
		out, err := client.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{
			QueueUrl: &queueURL, MaxNumberOfMessages: 10, WaitTimeSeconds: 1,
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll},
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range out.Messages {
			attrs := map[string]any{}
			for k, v := range m.MessageAttributes {
				attrs[k] = map[string]any{"stringValue": aws.ToString(v.StringValue), "stringListValues": []string{}, "binaryListValues": []string{}, "dataType": aws.ToString(v.DataType)}
			}
			recs = append(recs, map[string]any{
				"messageId": aws.ToString(m.MessageId), "receiptHandle": aws.ToString(m.ReceiptHandle), "body": aws.ToString(m.Body),
				"attributes": m.Attributes, "messageAttributes": attrs, "md5OfBody": aws.ToString(m.MD5OfBody),
				"eventSource": "aws:sqs", "eventSourceARN": "arn:aws:sqs:us-east-1:000000000000:q", "awsRegion": "us-east-1",
			})
		}
	}
	js, err := json.Marshal(map[string]any{"Records": recs})
	if err != nil {
		t.Fatal(err)
	}
	var ev sqslambda.Event
	if err := json.Unmarshal(js, &ev); err != nil {
		t.Fatalf("decoding a Lambda SQS event: %v", err)
	}
	return ev
}

type job struct {
	N    int  `json:"n"`
	Fail bool `json:"fail"`
}

func (job) MessageName() string { return "test.job" }

func TestHandlerReportsFailedRecords(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	tr := openTransport(t)
	if err := tr.Setup(ctx, bus.Topology{Endpoint: "worker", Handles: []string{"test.job"}, MaxAttempts: 3, Concurrency: 1}); err != nil {
		t.Fatal(err)
	}
	var rawSeen []string
	b, err := bus.New(
		bus.WithEndpoint("worker"),
		bus.WithTransport(tr),
		bus.WithMaxAttempts(3),
		bus.WithMiddleware(bus.Middleware{Name: "raw", Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
			if m, ok := in.Raw().(sqstypes.Message); ok {
				rawSeen = append(rawSeen, aws.ToString(m.MessageId))
			}
			return next.Call(ctx)
		}}),
		bus.WithHandler(func(_ context.Context, j job, _ bus.Attributes) error {
			if j.Fail {
				return errors.New("job failed")
			}
			return nil
		}),
	)
	if err != nil {
		t.Fatal(err)
	}
	client := tr.SQS()
	url, err := client.GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(tr.QueueName("worker"))})
	if err != nil {
		t.Fatal(err)
	}
	for i, fail := range []bool{false, true, false, true} {
		if err := b.Send(ctx, job{N: i, Fail: fail}, bus.WithMessageID("job-"+string(rune('a'+i)))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client.SendMessage(ctx, &awssqs.SendMessageInput{QueueUrl: url.QueueUrl, MessageBody: aws.String("not plugbus")}); err != nil {
		t.Fatal(err)
	}
	ev := lambdaEvent(ctx, t, client, *url.QueueUrl, 5)
	if len(ev.Records) != 5 {
		t.Fatalf("event has %d records, want 5", len(ev.Records))
	}
	var wantFailed []string
	foreign := ""
	for _, rec := range ev.Records {
		var j job
		if rec.Body == "not plugbus" {
			foreign = rec.MessageID
			continue
		}
		if err := json.Unmarshal([]byte(rec.Body), &j); err != nil {
			t.Fatal(err)
		}
		if j.Fail {
			wantFailed = append(wantFailed, rec.MessageID)
		}
	}
	handler := newHandler(t, b, sqslambda.WithMaxAttempts(3))
	resp, err := handler(ctx, ev)
	if err != nil {
		t.Fatal(err)
	}
	var failed []string
	for _, f := range resp.BatchItemFailures {
		failed = append(failed, f.ItemIdentifier)
	}
	slices.Sort(failed)
	slices.Sort(wantFailed)
	if !slices.Equal(failed, wantFailed) {
		t.Fatalf("batch item failures = %v, want exactly the failed records %v", failed, wantFailed)
	}
	if len(rawSeen) != 4 {
		t.Errorf("incoming middleware saw %d raw SQS messages, want 4 (the foreign record is dead-lettered without middleware)", len(rawSeen))
	}
	// The foreign record was dead-lettered with its reason and reported as handled.
	dl := sqstest.DeadLetters(ctx, t, tr, "worker", 1)
	if len(dl) != 1 || !strings.Contains(dl[0].Failure.Reason, "plugbus") || dl[0].Failure.Endpoint != "worker" {
		t.Fatalf("dead letters = %+v (foreign record %s)", dl, foreign)
	}

	// On its last attempt a failing record is dead-lettered, not retried.
	last := ev.Records[slices.IndexFunc(ev.Records, func(r sqslambda.Record) bool { return r.MessageID == wantFailed[0] })]
	last.Attributes["ApproximateReceiveCount"] = "3"
	resp, err = handler(ctx, sqslambda.Event{Records: []sqslambda.Record{last}})
	if err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("last attempt: failures %v, err %v; want none (dead-lettered)", resp.BatchItemFailures, err)
	}
	dl = sqstest.DeadLetters(ctx, t, tr, "worker", 1)
	if len(dl) != 1 || dl[0].Failure.Attempts != 3 || !strings.Contains(dl[0].Failure.Reason, "job failed") {
		t.Fatalf("dead letter of the last attempt = %+v", dl)
	}

	// Records left when the context ends are reported as failed.
	done, stop := context.WithCancel(ctx)
	stop()
	resp, _ = handler(done, ev)
	if len(resp.BatchItemFailures) != len(ev.Records) {
		t.Fatalf("with a cancelled context: %d failures, want %d", len(resp.BatchItemFailures), len(ev.Records))
	}
}

// A failed record comes back after the transport's retry back-off, not
// after the queue's (longer) visibility timeout.
func TestHandlerBacksOffFailedRecords(t *testing.T) {
	cfg := awsConfig(t)
	prefix := sqstest.UniquePrefix(t, cfg)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	// Queue visibility timeout 20s; back-off 1s.
	tr := sqstest.New(t, cfg, sqstest.FastOptions(prefix, sqs.WithVisibilityTimeout(20*time.Second))...)
	defer tr.Close(context.Background())
	if err := tr.Setup(ctx, bus.Topology{Endpoint: "retrying", MaxAttempts: 5, Concurrency: 1}); err != nil {
		t.Fatal(err)
	}
	b, err := bus.New(bus.WithEndpoint("retrying"), bus.WithTransport(tr),
		bus.WithHandler(func(context.Context, job, bus.Attributes) error { return errors.New("not yet") }))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Send(ctx, job{N: 1}); err != nil {
		t.Fatal(err)
	}
	url, err := tr.SQS().GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(tr.QueueName("retrying"))})
	if err != nil {
		t.Fatal(err)
	}
	ev := lambdaEvent(ctx, t, tr.SQS(), *url.QueueUrl, 1)
	ev.Records[0].EventSourceARN = "arn:aws:sqs:us-east-1:000000000000:" + tr.QueueName("retrying")
	resp, err := newHandler(t, b, sqslambda.WithBackoff(bus.Backoff{Initial: time.Second, Max: time.Second}))(ctx, ev)
	if err != nil || len(resp.BatchItemFailures) != 1 {
		t.Fatalf("failures %v, err %v", resp.BatchItemFailures, err)
	}
	wait, stop := context.WithTimeout(ctx, 5*time.Second) // well under the 20s visibility timeout
	defer stop()
	again := lambdaEvent(wait, t, tr.SQS(), *url.QueueUrl, 1)
	if len(again.Records) != 1 || again.Records[0].MessageID != ev.Records[0].MessageID {
		t.Fatalf("the failed record did not come back after the back-off: %d records", len(again.Records))
	}
	if got := again.Records[0].Attributes["ApproximateReceiveCount"]; got != "2" {
		t.Errorf("receive count = %s, want 2", got)
	}
}

// The handler reads records as the transport's poller reads messages: an
// attribute under a reserved name never reaches handlers as a header, and
// is logged at WARN.
func TestHandlerIgnoresForeignReservedAttributes(t *testing.T) {
	const event = `{"Records":[{"messageId":"m-1","receiptHandle":"h","body":"{\"n\":1}",
		"attributes":{"ApproximateReceiveCount":"1"},
		"messageAttributes":{
			"plugbus":{"stringValue":"{\"v\":1,\"name\":\"test.job\",\"id\":\"job-1\"}","stringListValues":[],"binaryListValues":[],"dataType":"String"},
			"PLUGBUS.ATTEMPT":{"stringValue":"99","stringListValues":[],"binaryListValues":[],"dataType":"Number"},
			"origin":{"stringValue":"legacy","stringListValues":[],"binaryListValues":[],"dataType":"String"}},
		"eventSource":"aws:sqs","eventSourceARN":"arn:aws:sqs:us-east-1:000000000000:worker","awsRegion":"us-east-1"}]}`
	var ev sqslambda.Event
	if err := json.Unmarshal([]byte(event), &ev); err != nil {
		t.Fatal(err)
	}
	headers := make(chan map[string]string, 1)
	b, err := bus.New(bus.WithEndpoint("worker"), bus.WithTransport(memory.New()),
		bus.WithMiddleware(bus.Middleware{Name: "headers", Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
			headers <- maps.Collect(in.Headers())
			return next.Call(ctx)
		}}),
		bus.WithHandler(func(context.Context, job, bus.Attributes) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	logs := &sqstest.LogRecorder{}
	resp, err := newHandler(t, b, sqslambda.WithLogger(logs.Logger()))(t.Context(), ev)
	if err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("handler: %v, %v", resp, err)
	}
	if h := <-headers; len(h) != 1 || h["origin"] != "legacy" {
		t.Errorf("headers = %v, want only origin=legacy", h)
	}
	w := logs.Warnings(t, "reserved attribute ignored")
	if len(w) != 1 || w[0]["attribute"] != "PLUGBUS.ATTEMPT" || w[0]["message_id"] != "job-1" || w[0]["sqs_message_id"] != "m-1" {
		t.Errorf("warnings = %v, want one naming PLUGBUS.ATTEMPT of job-1 (m-1)", w)
	}
}

type decodeFailure struct{}

func (decodeFailure) MessageName() string { return "test.decode-failure" }

// The handler retries a bus handler's error like the poller does, even one
// that wraps a *bus.DecodeError: only the bus's own decode failure is
// poison.
func TestHandlerRetriesAHandlerErrorWrappingADecodeError(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	tr := openTransport(t)
	if err := tr.Setup(ctx, bus.Topology{Endpoint: "worker", Handles: []string{"test.decode-failure"}, MaxAttempts: 3, Concurrency: 1}); err != nil {
		t.Fatal(err)
	}
	b, err := bus.New(bus.WithEndpoint("worker"), bus.WithTransport(tr), bus.WithMaxAttempts(3),
		bus.WithHandler(func(context.Context, decodeFailure, bus.Attributes) error {
			// A handler reading a nested document it cannot decode.
			return &bus.DecodeError{Message: "nested", Type: "doc", Err: errors.New("bad nested JSON")}
		}))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Send(ctx, decodeFailure{}); err != nil {
		t.Fatal(err)
	}
	url, err := tr.SQS().GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(tr.QueueName("worker"))})
	if err != nil {
		t.Fatal(err)
	}
	ev := lambdaEvent(ctx, t, tr.SQS(), *url.QueueUrl, 1)
	resp, err := newHandler(t, b, sqslambda.WithMaxAttempts(3))(ctx, ev)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.BatchItemFailures) != 1 {
		t.Errorf("first attempt of a record whose handler failed: %d batch item failures, want 1 (retried, not dead-lettered)", len(resp.BatchItemFailures))
	}
}

func newHandler(t *testing.T, b *bus.Bus, opts ...sqslambda.Option) sqslambda.Handler {
	t.Helper()
	h, err := sqslambda.NewHandler(b, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// NewHandler refuses what it cannot work with: no bus, fewer than one
// attempt, a back-off whose delays make no sense (it took them all). A zero back-off is
// allowed: it leaves a failed record to the visibility timeout.
func TestNewHandlerRefusesOptionsOutOfRange(t *testing.T) {
	b, err := bus.New(bus.WithEndpoint("billing"), bus.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	for name, opts := range map[string][]sqslambda.Option{
		"0 attempts":        {sqslambda.WithMaxAttempts(0)},
		"-1 attempts":       {sqslambda.WithMaxAttempts(-1)},
		"negative back-off": {sqslambda.WithBackoff(bus.Backoff{Initial: -time.Second, Max: time.Second})},
		"Max below Initial": {sqslambda.WithBackoff(bus.Backoff{Initial: time.Minute, Max: time.Second})},
		"Max alone":         {sqslambda.WithBackoff(bus.Backoff{Max: time.Second})},
	} {
		if h, err := sqslambda.NewHandler(b, opts...); h != nil || !errors.Is(err, sqs.ErrInvalidOption) {
			t.Errorf("%s: NewHandler = %v; want a *sqs.OptionError and no handler", name, err)
		}
	}
	if _, err := sqslambda.NewHandler(nil); err == nil {
		t.Error("NewHandler(nil) succeeded")
	}
	for name, opts := range map[string][]sqslambda.Option{
		"defaults":      nil,
		"1 attempt":     {sqslambda.WithMaxAttempts(1)},
		"zero back-off": {sqslambda.WithBackoff(bus.Backoff{})},
		"equal bounds":  {sqslambda.WithBackoff(bus.Backoff{Initial: time.Second, Max: time.Second})},
	} {
		if h, err := sqslambda.NewHandler(b, opts...); h == nil || err != nil {
			t.Errorf("%s: NewHandler = %v; want a handler", name, err)
		}
	}
}
