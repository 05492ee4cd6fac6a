package sqs_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/sqstest"
	"github.com/plugbus/plugbus/transports/sqs"
)

var errHandler = errors.New("handler failed")

// openEndpoint returns a transport set up for endpoint on prefix, with
// sqstest.FastOptions and extra, closed at the end of the test.
func openEndpoint(ctx context.Context, t *testing.T, prefix, endpoint string, maxAttempts int, extra ...sqs.Option) *sqs.Transport {
	t.Helper()
	tr := sqstest.New(t, awsConfig(t), sqstest.FastOptions(prefix, extra...)...)
	t.Cleanup(func() { _ = tr.Close(context.Background()) })
	if err := tr.Setup(ctx, bus.Topology{Endpoint: endpoint, Handles: []string{"test.job"}, MaxAttempts: maxAttempts, Concurrency: 4}); err != nil {
		t.Fatal(err)
	}
	return tr
}

// receiveWithin waits at most within for the next delivery of tr.
func receiveWithin(t *testing.T, tr *sqs.Transport, within time.Duration) *bus.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), within)
	defer cancel()
	d, err := tr.Receive(ctx)
	if err != nil {
		t.Fatalf("no delivery within %s: %v", within, err)
	}
	if d.Err != nil {
		t.Fatalf("delivery of %s could not be read: %v", d.Attributes.MessageID, d.Err)
	}
	return d
}

// sendJob sends one test.job with id to endpoint.
func sendJob(ctx context.Context, t *testing.T, tr *sqs.Transport, endpoint, id string) {
	t.Helper()
	env := &bus.Envelope{Name: "test.job", ContentType: "application/json", Body: []byte(`{"id":"` + id + `"}`),
		Attributes: bus.NewAttributes(id, "corr-"+id, time.Now(), map[string]string{"k": "v"}, nil), Headers: bus.Headers{"x-h": "h"}}
	if err := tr.Send(ctx, env, endpoint); err != nil {
		t.Fatal(err)
	}
}

// expectArrival checks that d is the message id, on attempt, at least
// least after since, and that its envelope survived the delay.
func expectArrival(t *testing.T, d *bus.Delivery, id string, attempt int, since time.Time, least time.Duration) {
	t.Helper()
	if waited := time.Since(since); waited < least {
		t.Errorf("%s arrived %s after it was delayed by %s", id, waited, least)
	}
	if d.Attributes.MessageID != id || d.Attempt != attempt {
		t.Errorf("got %s on attempt %d, want %s on attempt %d", d.Attributes.MessageID, d.Attempt, id, attempt)
	}
	if k, _ := d.Attributes.Value("k"); string(d.Body) != `{"id":"`+id+`"}` || d.Attributes.CorrelationID != "corr-"+id || k != "v" || d.Headers["x-h"] != "h" {
		t.Errorf("envelope changed by the delay: body %s, correlation %q, attribute k %q, headers %v", d.Body, d.Attributes.CorrelationID, k, d.Headers)
	}
}

// A message returned with a delay arrives no earlier than the delay, on
// the next attempt, with its envelope; the attempt goes on counting
// through delayed and immediate returns alike.
func TestReturnAfterDeliversAfterTheDelayOnTheNextAttempt(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cfg := awsConfig(t)
	tr := openEndpoint(ctx, t, sqstest.UniquePrefix(t, cfg), "delayed", 5)
	sendJob(ctx, t, tr, "delayed", "m1")
	d := receiveWithin(t, tr, 10*time.Second)
	if d.Attempt != 1 {
		t.Fatalf("first delivery on attempt %d", d.Attempt)
	}
	steps := []struct {
		delay time.Duration // 0: Return, at once
	}{{2 * time.Second}, {time.Second}, {0}, {1500 * time.Millisecond}}
	for i, step := range steps {
		since := time.Now()
		var err error
		if step.delay > 0 {
			err = tr.ReturnAfter(ctx, d, errHandler, step.delay)
		} else {
			err = tr.Return(ctx, d, errHandler)
		}
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		d = receiveWithin(t, tr, step.delay+10*time.Second)
		expectArrival(t, d, "m1", i+2, since, step.delay)
	}
	if err := tr.Delete(ctx, d); err != nil {
		t.Fatal(err)
	}
	expectNothing(t, tr, 2*time.Second)
}

// Head of line: a message delayed for an hour, then one delayed for a
// second, on one queue: the second arrives within 2 seconds.
func TestReturnAfterLongDelayNeverHoldsBackAShortOne(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cfg := awsConfig(t)
	tr := openEndpoint(ctx, t, sqstest.UniquePrefix(t, cfg), "hol", 5)
	sendJob(ctx, t, tr, "hol", "long")
	sendJob(ctx, t, tr, "hol", "short")
	got := map[string]*bus.Delivery{}
	for range 2 {
		d := receiveWithin(t, tr, 10*time.Second)
		got[d.Attributes.MessageID] = d
	}
	if err := tr.ReturnAfter(ctx, got["long"], errHandler, time.Hour); err != nil {
		t.Fatal(err)
	}
	since := time.Now()
	if err := tr.ReturnAfter(ctx, got["short"], errHandler, time.Second); err != nil {
		t.Fatal(err)
	}
	d := receiveWithin(t, tr, time.Until(since.Add(2*time.Second)))
	expectArrival(t, d, "short", 2, since, time.Second)
	if err := tr.Delete(ctx, d); err != nil {
		t.Fatal(err)
	}
	expectNothing(t, tr, 2*time.Second)
}

// A delay longer than one SQS message can carry (15 minutes; here a hop
// scaled down to a second) travels in hops: each receiver that gets the
// message before it is due sends it on without handing it out, and the
// hops count no attempt.
func TestReturnAfterBeyondOneHopIsCarriedInHops(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cfg := awsConfig(t)
	logs := &sqstest.LogRecorder{}
	tr := openEndpoint(ctx, t, sqstest.UniquePrefix(t, cfg), "hops", 5, sqs.WithHop(time.Second),
		sqs.WithLogger(logs.DebugLogger()))
	sendJob(ctx, t, tr, "hops", "m1")
	d := receiveWithin(t, tr, 10*time.Second)
	since := time.Now()
	const delay = 3500 * time.Millisecond
	history := bus.RetryHistory{Delayed: 1, FirstFailure: since.Add(-time.Minute).UTC(), LastFailure: since.UTC(), Errors: []string{"e1", "e2"}}
	d.Retries = history
	if err := tr.ReturnAfter(ctx, d, errHandler, delay); err != nil {
		t.Fatal(err)
	}
	d = receiveWithin(t, tr, delay+10*time.Second)
	expectArrival(t, d, "m1", 2, since, delay)
	if got := d.Retries; got.Delayed != 1 || !got.FirstFailure.Equal(history.FirstFailure) || !got.LastFailure.Equal(history.LastFailure) || !slices.Equal(got.Errors, history.Errors) {
		t.Errorf("retry history %+v after the hops, want %+v", got, history)
	}
	if hops := logs.Records(t, "DEBUG", "message not due yet sent on"); len(hops) < 2 {
		t.Errorf("%d hops for a delay of %s in hops of 1s, want at least 2:\n%s", len(hops), delay, logs)
	}
	if err := tr.Delete(ctx, d); err != nil {
		t.Fatal(err)
	}
}

// A delayed message waits in SQS, not in the consumer: the consumer that
// delayed it closes, another starts, and the message arrives there after
// its delay, on the next attempt, hops included.
func TestDelayedMessageSurvivesItsConsumer(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cfg := awsConfig(t)
	prefix := sqstest.UniquePrefix(t, cfg)
	first := openEndpoint(ctx, t, prefix, "durable", 5, sqs.WithHop(time.Second))
	sendJob(ctx, t, first, "durable", "m1")
	d := receiveWithin(t, first, 10*time.Second)
	since := time.Now()
	const delay = 2500 * time.Millisecond
	if err := first.ReturnAfter(ctx, d, errHandler, delay); err != nil {
		t.Fatal(err)
	}
	if err := first.Close(ctx); err != nil {
		t.Fatal(err)
	}
	second := openEndpoint(ctx, t, prefix, "durable", 5, sqs.WithHop(time.Second))
	d = receiveWithin(t, second, delay+10*time.Second)
	expectArrival(t, d, "m1", 2, since, delay)
	if err := second.Delete(ctx, d); err != nil {
		t.Fatal(err)
	}
}

// A consumer killed while it holds a copy that is not due yet (between
// its receive and its hop) costs the message no attempt: the copy comes
// back after its visibility timeout, the next consumer sends it on, and
// it arrives after its delay on the next attempt.
func TestConsumerKilledHoldingACopyNotDueCostsNoAttempt(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cfg := awsConfig(t)
	prefix := sqstest.UniquePrefix(t, cfg)
	first := openEndpoint(ctx, t, prefix, "killed", 5, sqs.WithHop(time.Second))
	sendJob(ctx, t, first, "killed", "m1")
	d := receiveWithin(t, first, 10*time.Second)
	since := time.Now()
	const delay = 4 * time.Second
	if err := first.ReturnAfter(ctx, d, errHandler, delay); err != nil {
		t.Fatal(err)
	}
	if err := first.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// The killed consumer: it received the copy (after its first hop of a
	// second) and will never settle it.
	url, err := first.SQS().GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(first.QueueName("killed"))})
	if err != nil {
		t.Fatal(err)
	}
	for held := false; !held; {
		out, err := first.SQS().ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{QueueUrl: url.QueueUrl, WaitTimeSeconds: 1, VisibilityTimeout: 1})
		if err != nil {
			t.Fatal(err)
		}
		held = len(out.Messages) == 1
	}
	second := openEndpoint(ctx, t, prefix, "killed", 5, sqs.WithHop(time.Second))
	d = receiveWithin(t, second, delay+10*time.Second)
	expectArrival(t, d, "m1", 2, since, delay)
	if err := second.Delete(ctx, d); err != nil {
		t.Fatal(err)
	}
}

// The redrive policy stays a backstop across delays: a delayed copy's
// receive count starts again, but never exceeds its attempt, so SQS never
// dead-letters it before the bus's count would; and a copy whose
// consumers keep stopping without settling it reaches the dead-letter
// queue after maxReceiveCount receives of it.
func TestRedrivePolicyBoundsDelayedCopies(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	cfg := awsConfig(t)
	prefix := sqstest.UniquePrefix(t, cfg)
	const maxAttempts = 3
	tr := openEndpoint(ctx, t, prefix, "redrive", maxAttempts)
	sendJob(ctx, t, tr, "redrive", "m1")
	d := receiveWithin(t, tr, 10*time.Second)
	since := time.Now()
	if err := tr.ReturnAfter(ctx, d, errHandler, time.Second); err != nil {
		t.Fatal(err)
	}
	d = receiveWithin(t, tr, 10*time.Second)
	expectArrival(t, d, "m1", 2, since, time.Second) // the copy's first receive
	if err := tr.Return(ctx, d, errHandler); err != nil {
		t.Fatal(err)
	}
	d = receiveWithin(t, tr, 10*time.Second)
	expectArrival(t, d, "m1", 3, since, 0) // the last attempt: SQS has counted 2 receives of the copy
	// The consumer stops without settling, twice: Close gives the message back.
	for attempt := maxAttempts; attempt <= maxAttempts+1; attempt++ {
		if err := tr.Close(ctx); err != nil {
			t.Fatal(err)
		}
		tr = openEndpoint(ctx, t, prefix, "redrive", maxAttempts)
		if attempt == maxAttempts+1 {
			break
		}
		d = receiveWithin(t, tr, 10*time.Second)
		expectArrival(t, d, "m1", attempt+1, since, 0) // SQS has counted 3 receives of the copy: its maxReceiveCount
	}
	// The next receive is the copy's 4th: SQS moves it to the dead-letter queue.
	expectNothing(t, tr, 3*time.Second)
	dl := rawReceive(ctx, t, tr, tr.DeadLetterQueueName("redrive"))
	if pack := aws.ToString(dl.MessageAttributes[sqs.AttributeName].StringValue); strings.Contains(pack, `"failure"`) {
		t.Errorf("the copy reached the dead-letter queue with a failure (%s), want moved by the redrive policy", pack)
	}
	if letter := sqs.Decode(dl, nil); letter.Attributes.MessageID != "m1" || string(letter.Body) != `{"id":"m1"}` {
		t.Errorf("dead letter %s %s, want m1", letter.Attributes.MessageID, letter.Body)
	}
}

// rawReceive receives one message of the queue name with the AWS SDK,
// with its attributes, and deletes it.
func rawReceive(ctx context.Context, t *testing.T, tr *sqs.Transport, name string) sqstypes.Message {
	t.Helper()
	url, err := tr.SQS().GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(name)})
	if err != nil {
		t.Fatal(err)
	}
	for ctx.Err() == nil {
		out, err := tr.SQS().ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{QueueUrl: url.QueueUrl, MaxNumberOfMessages: 1, WaitTimeSeconds: 1,
			MessageAttributeNames: []string{"All"}, MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll}})
		if err != nil {
			t.Fatal(err)
		}
		if len(out.Messages) == 1 {
			if _, err := tr.SQS().DeleteMessage(ctx, &awssqs.DeleteMessageInput{QueueUrl: url.QueueUrl, ReceiptHandle: out.Messages[0].ReceiptHandle}); err != nil {
				t.Fatal(err)
			}
			return out.Messages[0]
		}
	}
	t.Fatalf("nothing received from %s: %v", name, ctx.Err())
	return sqstypes.Message{}
}

// What a delayed copy carries in its "plugbus" attribute is checked like
// any foreign input: a prior attempt count out of range (below 1, or not
// below the maximum attempts), or not an integer, and a due time that is
// not a time or lies further ahead than the transport carries, are
// ignored with a warning naming the field, so they never shorten a
// message's life nor hold it for ever. In range, they are what the
// transport itself writes.
func TestCarriedFieldsOutOfRangeIgnored(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cfg := awsConfig(t)
	logs := &sqstest.LogRecorder{}
	tr := openEndpoint(ctx, t, sqstest.UniquePrefix(t, cfg), "carried", 5, sqs.WithLogger(logs.Logger()))
	cases := []struct {
		id, extra string
		attempt   int
		ignored   string // the field warned about
	}{
		{"prior-99", `"prior":99`, 1, "prior"},
		{"prior-5", `"prior":5`, 1, "prior"},
		{"prior-0", `"prior":0`, 1, "prior"},
		{"prior-neg", `"prior":-2`, 1, "prior"},
		{"prior-text", `"prior":"3"`, 1, "prior"},
		{"prior-4", `"prior":4`, 5, ""},
		{"prior-null", `"prior":null`, 1, ""},
		{"due-year", `"due":"` + time.Now().AddDate(1, 0, 0).UTC().Format(time.RFC3339) + `"`, 1, "due"},
		{"due-text", `"due":"soon"`, 1, "due"},
		{"due-number", `"due":12`, 1, "due"},
		{"due-past", `"due":"` + time.Now().Add(-time.Hour).UTC().Format(time.RFC3339) + `"`, 1, ""},
		{"hist-text", `"hist":"not a history"`, 1, "hist"},
		{"hist-number", `"hist":12`, 1, "hist"},
		{"hist-errors", `"hist":"{\"e\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\"]}"`, 1, "hist"},
	}
	for _, c := range cases {
		rawSend(ctx, t, tr, "carried", `{}`, map[string]sqstypes.MessageAttributeValue{
			sqs.AttributeName: str(`{"v":1,"name":"test.job","id":"` + c.id + `",` + c.extra + `}`)})
	}
	for range cases {
		d := receiveWithin(t, tr, 10*time.Second)
		for _, c := range cases {
			if c.id != d.Attributes.MessageID {
				continue
			}
			if d.Attempt != c.attempt {
				t.Errorf("%s: attempt %d, want %d", c.id, d.Attempt, c.attempt)
			}
			var fields []string
			for _, w := range logs.Warnings(t, "carried field ignored") {
				if w["message_id"] == c.id {
					fields = append(fields, w["field"].(string))
				}
			}
			if want := []string{c.ignored}; c.ignored == "" && len(fields) > 0 || c.ignored != "" && !slices.Equal(fields, want) {
				t.Errorf("%s: warnings about fields %q, want %q", c.id, fields, c.ignored)
			}
		}
		if err := tr.Delete(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
}

// A message sent with a due time (the primitive of scheduled sends) is
// delivered no earlier than due, on its first attempt: within one hop by
// DelaySeconds alone, beyond it in hops.
func TestSendAtDeliversWhenDue(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cfg := awsConfig(t)
	tr := openEndpoint(ctx, t, sqstest.UniquePrefix(t, cfg), "scheduled", 5, sqs.WithHop(time.Second))
	for _, delay := range []time.Duration{time.Second, 2500 * time.Millisecond} {
		since := time.Now()
		env := &bus.Envelope{Name: "test.job", ContentType: "application/json", Body: []byte(`{"id":"m1"}`),
			Attributes: bus.NewAttributes("m1", "corr-m1", time.Now(), map[string]string{"k": "v"}, nil), Headers: bus.Headers{"x-h": "h"}}
		if err := tr.SendAt(ctx, env, "scheduled", since.Add(delay)); err != nil {
			t.Fatal(err)
		}
		d := receiveWithin(t, tr, delay+10*time.Second)
		expectArrival(t, d, "m1", 1, since, delay)
		if err := tr.Delete(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	env := &bus.Envelope{Name: "test.job", Body: []byte(`{}`), Attributes: bus.NewAttributes("far", "c", time.Now(), nil, nil)}
	if err := tr.SendAt(ctx, env, "scheduled", time.Now().Add(tr.MaxDelay()+time.Minute)); err == nil || !strings.Contains(err.Error(), "MaxDelay") {
		t.Errorf("a due time beyond MaxDelay: %v, want refused", err)
	}
	expectNothing(t, tr, time.Second)
}

// A message published with a due time reaches every subscribed endpoint
// once, no earlier than due: SNS delivers at once, and each endpoint's
// transport holds its copy until it is due.
func TestPublishAtReachesEachSubscriberOnceWhenDue(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cfg := awsConfig(t)
	prefix := sqstest.UniquePrefix(t, cfg)
	subscribers := []*sqs.Transport{
		openEndpoint(ctx, t, prefix, "sub-a", 5), openEndpoint(ctx, t, prefix, "sub-b", 5), openEndpoint(ctx, t, prefix, "sub-c", 5),
	}
	since := time.Now()
	const delay = 2 * time.Second
	env := &bus.Envelope{Name: "test.job", ContentType: "application/json", Body: []byte(`{"id":"m1"}`),
		Attributes: bus.NewAttributes("m1", "corr-m1", time.Now(), map[string]string{"k": "v"}, nil), Headers: bus.Headers{"x-h": "h"}}
	if err := subscribers[0].PublishAt(ctx, env, since.Add(delay)); err != nil {
		t.Fatal(err)
	}
	for _, tr := range subscribers {
		d := receiveWithin(t, tr, delay+10*time.Second)
		expectArrival(t, d, "m1", 1, since, delay)
		if err := tr.Delete(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	for _, tr := range subscribers {
		expectNothing(t, tr, time.Second)
	}
}

// When SQS refuses the delayed copy (the message, with what the copy
// adds, outgrows the queue's size limit), the message is delayed by its
// visibility timeout instead: it arrives no earlier than the delay, on
// the next attempt, as SQS counts its receives.
func TestReturnAfterFallsBackToVisibilityWhenTheCopyIsRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cfg := awsConfig(t)
	logs := &sqstest.LogRecorder{}
	tr := openEndpoint(ctx, t, sqstest.UniquePrefix(t, cfg), "full", 5, sqs.WithLogger(logs.Logger()))
	const limit = 1024 // the smallest MaximumMessageSize SQS allows
	url, err := tr.SQS().GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(tr.QueueName("full"))})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.SQS().SetQueueAttributes(ctx, &awssqs.SetQueueAttributesInput{QueueUrl: url.QueueUrl,
		Attributes: map[string]string{"MaximumMessageSize": strconv.Itoa(limit)}}); err != nil {
		t.Fatal(err)
	}
	pack := `{"v":1,"name":"test.job","id":"m1"}`
	body := strings.Repeat("x", limit-len(sqs.AttributeName)-len("String")-len(pack)) // exactly the limit
	rawSend(ctx, t, tr, "full", body, map[string]sqstypes.MessageAttributeValue{sqs.AttributeName: str(pack)})
	d := receiveWithin(t, tr, 10*time.Second)
	since := time.Now()
	if err := tr.ReturnAfter(ctx, d, errHandler, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	d = receiveWithin(t, tr, 12*time.Second)
	if waited := time.Since(since); waited < 2*time.Second || d.Attempt != 2 || d.Attributes.MessageID != "m1" {
		t.Errorf("got %s on attempt %d after %s, want m1 on attempt 2 after 2s", d.Attributes.MessageID, d.Attempt, waited)
	}
	if len(logs.Warnings(t, "delayed by its visibility timeout instead")) != 1 {
		t.Errorf("the fallback was not logged:\n%s", logs)
	}
	if err := tr.Delete(ctx, d); err != nil {
		t.Fatal(err)
	}
}

// The dead letter of a delayed copy keeps the retry history in its
// failure, and not what the copy carried: moved back to its queue, it
// gets its attempts anew.
func TestDeadLetterOfADelayedCopyKeepsTheHistoryNotThePriorAttempts(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cfg := awsConfig(t)
	tr := openEndpoint(ctx, t, sqstest.UniquePrefix(t, cfg), "failed", 5, sqs.WithHop(time.Second))
	sendJob(ctx, t, tr, "failed", "m1")
	d := receiveWithin(t, tr, 10*time.Second)
	d.Retries = bus.RetryHistory{Delayed: 1, Errors: []string{"e1"}}
	if err := tr.ReturnAfter(ctx, d, errHandler, 1500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	d = receiveWithin(t, tr, 10*time.Second)
	history := bus.RetryHistory{Delayed: 1, FirstFailure: time.Now().Add(-time.Second).UTC(), LastFailure: time.Now().UTC(), Errors: []string{"e1", "e2"}}
	if err := tr.Fail(ctx, d, bus.Failure{Reason: "e2", Attempts: d.Attempt, Endpoint: "failed", Time: time.Now(), History: history}); err != nil {
		t.Fatal(err)
	}
	dl := rawReceive(ctx, t, tr, tr.DeadLetterQueueName("failed"))
	pack := aws.ToString(dl.MessageAttributes[sqs.AttributeName].StringValue)
	var fields map[string]json.RawMessage
	if err := json.Unmarshal([]byte(pack), &fields); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"prior", "due", "hist"} {
		if v, ok := fields[k]; ok {
			t.Errorf("the dead letter carries %q: %s", k, v)
		}
	}
	letter, err := sqs.DecodeDeadLetter(dl)
	if err != nil {
		t.Fatal(err)
	}
	got := letter.Failure.History
	if letter.Failure.Attempts != 2 || got.Delayed != 1 || !slices.Equal(got.Errors, history.Errors) || !got.FirstFailure.Equal(history.FirstFailure) || !got.LastFailure.Equal(history.LastFailure) {
		t.Errorf("failure %+v, want 2 attempts and history %+v", letter.Failure, history)
	}
}

// BenchmarkRedeliver measures giving a received message back and
// receiving it again through the local emulator: Return (a visibility
// change) against ReturnAfter with no delay (a copy sent, the message
// deleted).
func BenchmarkRedeliver(b *testing.B) {
	for _, settle := range []struct {
		name string
		give func(context.Context, *sqs.Transport, *bus.Delivery) error
	}{
		{"Return", func(ctx context.Context, tr *sqs.Transport, d *bus.Delivery) error {
			return tr.Return(ctx, d, errHandler)
		}},
		{"ReturnAfter", func(ctx context.Context, tr *sqs.Transport, d *bus.Delivery) error {
			return tr.ReturnAfter(ctx, d, errHandler, 0)
		}},
	} {
		b.Run(settle.name, func(b *testing.B) {
			cfg := awsConfig(b)
			prefix := sqstest.UniquePrefix(b, cfg)
			ctx := context.Background()
			tr := sqstest.New(b, cfg, sqstest.FastOptions(prefix)...)
			defer tr.Close(ctx)
			const maxAttempts = 1000 // SQS's largest maxReceiveCount
			if err := tr.Setup(ctx, bus.Topology{Endpoint: "bench", MaxAttempts: maxAttempts, Concurrency: 1}); err != nil {
				b.Fatal(err)
			}
			env := benchEnvelope()
			if err := tr.Send(ctx, env, "bench"); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				d, err := tr.Receive(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if d.Attempt < maxAttempts-1 {
					err = settle.give(ctx, tr, d)
				} else if err = tr.Delete(ctx, d); err == nil {
					err = tr.Send(ctx, env, "bench")
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// FuzzCarried feeds the reading of what a delayed copy carries any
// "plugbus" attribute: nothing panics, the attempt stays from 1 to the
// maximum (a forged prior attempt count never goes beyond it), a due time
// is never further ahead than the transport carries, and a copy that
// ReturnAfter would make of a readable message reads back as the same
// envelope on the next attempt, with its history.
func FuzzCarried(f *testing.F) {
	f.Add(`{"v":1,"name":"test.job","id":"m1","prior":2}`, uint8(5))
	f.Add(`{"v":1,"name":"test.job","id":"m1","prior":99,"due":"2999-01-01T00:00:00Z"}`, uint8(5))
	f.Add(`{"v":1,"name":"test.job","id":"m1","PRIOR":"x","due":12,"hist":"{\"d\":1}"}`, uint8(33))
	f.Add(`{"v":1,"name":"test.job","id":"m1","hist":"{\"e\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\"]}","attrs":{"due":"x"}}`, uint8(1))
	f.Add(`{"v":1,"name":"test.job","prior":-1,"prior":3}`, uint8(4))
	f.Add(`[]`, uint8(5))
	f.Add(`{"v":1,"name":"a","NAME":"b","id":"m1","Prior":1,"prior":2}`, uint8(5))
	f.Add(`{"v":1, "name" : "test.job" ,"id":"m1","attrs":{"k":"<&>"}} `, uint8(5))
	f.Fuzz(func(t *testing.T, pack string, most uint8) {
		maxAttempts := int(most)%40 + 1
		msg := sqstypes.Message{
			Body:              aws.String(`{}`),
			Attributes:        map[string]string{"ApproximateReceiveCount": "1"},
			MessageAttributes: map[string]sqstypes.MessageAttributeValue{sqs.AttributeName: str(pack)},
		}
		now := time.Now()
		d, due := sqs.Carry(msg, maxAttempts, fuzzLog)
		if d.Attempt < 1 || d.Attempt > maxAttempts {
			t.Errorf("attempt %d with at most %d", d.Attempt, maxAttempts)
		}
		if !due.IsZero() && (d.Err != nil || !due.After(now) || due.After(time.Now().Add(sqs.MaxDelay+sqs.ClockSkewAllowance))) {
			t.Errorf("due %v trusted (now %v, error %v)", due, now, d.Err)
		}
		if d.Err != nil {
			return
		}
		h := bus.RetryHistory{Delayed: 1, FirstFailure: time.Unix(1, 0).UTC(), LastFailure: time.Unix(2, 0).UTC(), Errors: []string{"e"}}
		prior := min(d.Attempt, maxAttempts-1)
		attrs, err := sqs.CopyAttributes(msg.MessageAttributes, prior, time.Time{}, h)
		if err != nil {
			t.Fatalf("copying a readable message: %v", err)
		}
		copied, copyDue := sqs.Carry(sqstypes.Message{Body: msg.Body, Attributes: msg.Attributes, MessageAttributes: attrs}, maxAttempts, fuzzLog)
		wantAttempt := 1
		if prior >= 1 {
			wantAttempt = prior + 1
		}
		if copied.Err != nil || copied.Attempt != wantAttempt || !copyDue.IsZero() || copied.Name != d.Name || copied.Attributes.MessageID != d.Attributes.MessageID ||
			copied.Retries.Delayed != 1 || !slices.Equal(copied.Retries.Errors, h.Errors) {
			t.Errorf("copy read back as %q %q attempt %d (want %d), due %v, history %+v, error %v", copied.Name, copied.Attributes.MessageID, copied.Attempt, wantAttempt, copyDue, copied.Retries, copied.Err)
		}
	})
}
