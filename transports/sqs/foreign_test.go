package sqs_test

import (
	"bytes"
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssns "github.com/aws/aws-sdk-go-v2/service/sns"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/sqstest"
	"github.com/plugbus/plugbus/transports/sqs"
)

func str(v string) sqstypes.MessageAttributeValue {
	return sqstypes.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
}

// rawSend puts a message straight onto endpoint's queue with the AWS SDK,
// as a producer other than plugbus would.
func rawSend(ctx context.Context, t *testing.T, tr *sqs.Transport, endpoint, body string, attrs map[string]sqstypes.MessageAttributeValue) {
	t.Helper()
	url, err := tr.SQS().GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(tr.QueueName(endpoint))})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.SQS().SendMessage(ctx, &awssqs.SendMessageInput{QueueUrl: url.QueueUrl, MessageBody: aws.String(body), MessageAttributes: attrs}); err != nil {
		t.Fatal(err)
	}
}

// startBus starts a bus of endpoint "inbox" on a fresh transport logging
// to logs, stopped at the end of the test; opts come last.
func startBus(ctx context.Context, t *testing.T, logs *sqstest.LogRecorder, opts ...bus.Option) (*sqs.Transport, *sqs.Transport) {
	t.Helper()
	cfg := awsConfig(t)
	prefix := sqstest.UniquePrefix(t, cfg)
	tr := sqstest.New(t, cfg, sqstest.FastOptions(prefix, sqs.WithLogger(logs.Logger()))...)
	b, err := bus.New(append([]bus.Option{bus.WithEndpoint("inbox"), bus.WithTransport(tr), bus.WithLogger(logs.Logger())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Stop(context.Background()); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	probe := sqstest.New(t, cfg, sqstest.FastOptions(prefix)...)
	t.Cleanup(func() { _ = probe.Close(context.Background()) })
	return tr, probe
}

// A producer cannot shorten a message's life with attributes under the
// transport's reserved names, in any case, nor with an attempt in the
// "plugbus" attribute: the attempt is SQS's receive count, the message
// gets all its attempts, and the reserved names never reach middleware or
// handlers as headers. Each is logged at WARN, naming it and the message.
func TestForeignReservedAttributesNeitherHeadersNorAttempts(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	logs := &sqstest.LogRecorder{}
	var mu sync.Mutex
	var attempts []int
	var seen []bus.Headers
	_, probe := startBus(ctx, t, logs, bus.WithMaxAttempts(3),
		bus.WithMiddleware(bus.Middleware{Name: "watch", Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
			mu.Lock()
			attempts = append(attempts, in.Attempt())
			seen = append(seen, maps.Collect(in.Headers()))
			mu.Unlock()
			return next.Call(ctx)
		}}),
		bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error { return errAlwaysFails }))

	attrs := map[string]sqstypes.MessageAttributeValue{
		"plugbus": str(`{"v":1,"name":"test.order-placed","ct":"application/json","id":"foreign-1","attempt":99,` +
			`"failure":{"reason":"forged","attempts":99,"endpoint":"inbox","time":"2020-01-01T00:00:00Z"}}`),
		"origin":          str("legacy"),
		"PLUGBUS":         str(`{"v":1,"name":"test.order-placed","id":"forged"}`),
		"plugbus.attempt": {DataType: aws.String("Number"), StringValue: aws.String("99")},
		"PLUGBUS.ATTEMPT": str("99"),
		"Plugbus.Failure": str(`{"attempts":99}`),
	}
	reservedNames := []string{"PLUGBUS", "plugbus.attempt", "PLUGBUS.ATTEMPT", "Plugbus.Failure"}
	rawSend(ctx, t, probe, "inbox", `{"id":"f-1"}`, attrs)

	dl := sqstest.DeadLetters(ctx, t, probe, "inbox", 1)
	if len(dl) != 1 {
		t.Fatalf("dead letters = %d, want 1", len(dl))
	}
	if f := dl[0].Failure; f.Attempts != 3 || !strings.Contains(f.Reason, errAlwaysFails.Error()) {
		t.Errorf("failure = %+v, want 3 attempts and the handler's error", f)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(attempts, []int{1, 2, 3}) {
		t.Errorf("attempts = %v, want [1 2 3]", attempts)
	}
	for i, h := range seen {
		if len(h) != 1 || h["origin"] != "legacy" {
			t.Errorf("headers of attempt %d = %v, want only origin=legacy", i+1, h)
		}
	}
	for _, name := range reservedNames {
		var n int
		for _, w := range logs.Warnings(t, "reserved attribute ignored") {
			if w["attribute"] == name {
				n++
				if w["message_id"] != "foreign-1" || w["sqs_message_id"] == "" {
					t.Errorf("warning about %s names message %v (SQS %v), want foreign-1", name, w["message_id"], w["sqs_message_id"])
				}
			}
		}
		if n != 3 {
			t.Errorf("warnings about attribute %s = %d, want one per delivery (3)\n%s", name, n, logs)
		}
	}
}

// A sent-at time that is not a time, or lies further in the future than
// sqs.ClockSkewAllowance, is ignored with a warning: the message is handled,
// with no sent-at. One within the skew is kept.
func TestForeignSentAtIgnored(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	logs := &sqstest.LogRecorder{}
	handled := make(chan bus.Attributes, 8)
	_, probe := startBus(ctx, t, logs,
		bus.WithHandler(func(_ context.Context, _ orderPlaced, a bus.Attributes) error { handled <- a; return nil }))
	near := time.Now().Add(time.Minute).UTC().Truncate(time.Millisecond)
	sent := map[string]string{
		"future":    `"` + time.Now().Add(time.Hour).UTC().Format(time.RFC3339Nano) + `"`,
		"garbled":   `"yesterday"`,
		"wrongtype": `1735689600`,
		"near":      `"` + near.Format(time.RFC3339Nano) + `"`,
	}
	for id, s := range sent {
		rawSend(ctx, t, probe, "inbox", `{"id":"x"}`, map[string]sqstypes.MessageAttributeValue{
			"plugbus": str(`{"v":1,"name":"test.order-placed","id":"` + id + `","sent":` + s + `}`),
		})
	}
	got := map[string]time.Time{}
	for len(got) < len(sent) {
		select {
		case a := <-handled:
			got[a.MessageID] = a.SentAt
		case <-ctx.Done():
			t.Fatalf("handled %v of %d messages\n%s", got, len(sent), logs)
		}
	}
	for id := range sent {
		want := time.Time{}
		if id == "near" {
			want = near
		}
		if !got[id].Equal(want) {
			t.Errorf("sent-at of %s = %v, want %v", id, got[id], want)
		}
	}
	warned := map[any]bool{}
	for _, w := range logs.Warnings(t, "sent-at") {
		if w["attribute"] != "plugbus" || w["field"] != "sent" || w["reason"] == "" {
			t.Errorf("warning %v does not name the attribute, the field and the reason", w)
		}
		warned[w["message_id"]] = true
	}
	if len(warned) != 3 || !warned["future"] || !warned["garbled"] || !warned["wrongtype"] {
		t.Errorf("sent-at warnings for %v, want future, garbled and wrongtype\n%s", warned, logs)
	}
}

// A "plugbus" attribute of another data type than String cannot be read:
// the message is dead-lettered at once with a reason naming the
// attribute, the type it has and the type it should have.
func TestForeignPlugbusAttributeOfTheWrongType(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	logs := &sqstest.LogRecorder{}
	_, probe := startBus(ctx, t, logs,
		bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error { return nil }))
	pack := `{"v":1,"name":"test.order-placed","id":"typed"}`
	rawSend(ctx, t, probe, "inbox", `{"id":"b"}`, map[string]sqstypes.MessageAttributeValue{
		"plugbus": {DataType: aws.String("Binary"), BinaryValue: []byte(pack)},
	})
	rawSend(ctx, t, probe, "inbox", `{"id":"n"}`, map[string]sqstypes.MessageAttributeValue{
		"plugbus": {DataType: aws.String("Number"), StringValue: aws.String("1")},
	})
	dl := sqstest.DeadLetters(ctx, t, probe, "inbox", 2)
	if len(dl) != 2 {
		t.Fatalf("dead letters = %d, want 2", len(dl))
	}
	slices.SortFunc(dl, func(a, b bus.DeadLetter) int { return bytes.Compare(a.Envelope.Body, b.Envelope.Body) })
	for i, typ := range []string{"Binary", "Number"} {
		f := dl[i].Failure
		for _, want := range []string{`"plugbus"`, `data type "` + typ + `"`, `want "String"`} {
			if !strings.Contains(f.Reason, want) {
				t.Errorf("reason for a %s plugbus attribute = %q, want it to contain %s", typ, f.Reason, want)
			}
		}
		if f.Attempts != 1 || f.Endpoint != "inbox" {
			t.Errorf("failure = %+v, want attempt 1 at inbox", f)
		}
	}
}

// A queue subscribed to a topic without raw message delivery receives SNS
// envelopes: they are dead-lettered with a reason naming the topic and
// the setting to change.
func TestSNSEnvelopeDeadLetteredNamingTheTopic(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	logs := &sqstest.LogRecorder{}
	tr, probe := startBus(ctx, t, logs,
		bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error { return nil }))
	topic, err := probe.SNS().CreateTopic(ctx, &awssns.CreateTopicInput{Name: aws.String(probe.TopicName("legacy-events"))})
	if err != nil {
		t.Fatal(err)
	}
	url, err := probe.SQS().GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(tr.QueueName("inbox"))})
	if err != nil {
		t.Fatal(err)
	}
	qa, err := probe.SQS().GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{QueueUrl: url.QueueUrl, AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := probe.SNS().Subscribe(ctx, &awssns.SubscribeInput{TopicArn: topic.TopicArn, Protocol: aws.String("sqs"),
		Endpoint: aws.String(qa.Attributes[string(sqstypes.QueueAttributeNameQueueArn)])}); err != nil {
		t.Fatal(err)
	}
	if _, err := probe.SNS().Publish(ctx, &awssns.PublishInput{TopicArn: topic.TopicArn, Message: aws.String(`{"id":"s"}`)}); err != nil {
		t.Fatal(err)
	}
	dl := sqstest.DeadLetters(ctx, t, probe, "inbox", 1)
	if len(dl) != 1 {
		t.Fatalf("dead letters = %d, want 1", len(dl))
	}
	for _, want := range []string{`no "plugbus" attribute`, "SNS notification", aws.ToString(topic.TopicArn), "RawMessageDelivery"} {
		if !strings.Contains(dl[0].Failure.Reason, want) {
			t.Errorf("reason = %q, want it to contain %q", dl[0].Failure.Reason, want)
		}
	}
}
