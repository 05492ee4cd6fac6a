package sqs_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/sqstest"
	"github.com/plugbus/plugbus/transports/sqs"
	"github.com/plugbus/plugbus/transports/transporttest"
)

// httpTransport is shared by the tests' AWS clients, so that TestMain can
// close its idle connections before looking for leaked goroutines.
var httpTransport = &http.Transport{MaxIdleConns: 128, MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second}

func TestMain(m *testing.M) { sqstest.Main(m, httpTransport) }

// awsConfig points the SDK at the local emulator with static credentials.
func awsConfig(t testing.TB) aws.Config {
	t.Helper()
	return sqstest.Config(t, &http.Client{Transport: httpTransport})
}

// openTransport returns a transport with sqstest.FastOptions on a fresh prefix,
// closed at the end of the test (before its queues are deleted), and the
// prefix.
func openTransport(t testing.TB) (*sqs.Transport, string) {
	t.Helper()
	cfg := awsConfig(t)
	prefix := sqstest.UniquePrefix(t, cfg)
	tr := sqstest.New(t, cfg, sqstest.FastOptions(prefix)...)
	t.Cleanup(func() { _ = tr.Close(context.Background()) })
	return tr, prefix
}

// job is the message the bus tests handle.
type job struct {
	N int `json:"n"`
}

func (job) MessageName() string { return "test.job" }

// envelope returns an envelope of name with message and correlation id id.
func envelope(name, id string) *bus.Envelope {
	return &bus.Envelope{Name: name, ContentType: "application/json", Body: []byte(`{}`), Attributes: bus.NewAttributes(id, id, time.Now(), nil, nil)}
}

// conformancePrefixEnv hands the conformance suite's prefix to the child
// process its kill -9 test starts, which consumes from the same queues
// (and is killed before any cleanup).
const conformancePrefixEnv = "PLUGBUS_SQS_CONFORMANCE_PREFIX"

func TestConformance(t *testing.T) {
	cfg := awsConfig(t)
	prefix := os.Getenv(conformancePrefixEnv)
	if prefix == "" {
		prefix = sqstest.UniquePrefix(t, cfg)
		t.Setenv(conformancePrefixEnv, prefix)
	}
	newT := func(tb testing.TB) bus.Transport { return sqstest.New(tb, cfg, sqstest.FastOptions(prefix)...) }
	probe := sqstest.New(t, cfg, sqstest.FastOptions(prefix)...)
	transporttest.Run(t, newT, transporttest.Features{
		ReservedHeader:    sqs.AttributeName,
		DelayUnit:         500 * time.Millisecond, // DelaySeconds counts whole seconds: a delay is rounded up, never carried early
		Timeout:           2 * time.Minute,        // the outage test sends for 40 delay units
		DurableDelays:     true,                   // a delayed copy waits in SQS
		DeadLetterManager: true,
		Batch:             true,
		DeadLetters: func(ctx context.Context, t testing.TB, endpoint string, n int) []bus.DeadLetter {
			return sqstest.DeadLetters(ctx, t, probe, endpoint, n)
		},
	})
}

// With the default wait time, the receive requests in progress end within
// the time bus.Stop gives Close: an idle bus stops cleanly, nothing
// cancelled.
func TestStopWithTheDefaultWaitTime(t *testing.T) {
	cfg := awsConfig(t)
	tr := sqstest.New(t, cfg, sqs.WithPrefix(sqstest.UniquePrefix(t, cfg)))
	handled := make(chan struct{}, 1)
	b, err := bus.New(bus.WithEndpoint("idle"), bus.WithTransport(tr), bus.WithLogger(slog.New(slog.DiscardHandler)),
		bus.WithHandler(func(ctx context.Context, _ job, _ bus.Attributes) error {
			handled <- struct{}{}
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(ctx, job{N: 1}); err != nil {
		t.Fatal(err)
	}
	<-handled // the pollers are running: the next requests wait in long polls
	if err := b.Stop(ctx); err != nil {
		t.Fatalf("Stop of an idle bus: %v", err)
	}
}

// Setup adds its topics to those the queue policy already lets in and
// keeps statements of others: an older instance in a rolling deploy does
// not lock out the topics of a newer one.
func TestSetupKeepsTheTopicsAndStatementsOfTheQueuePolicy(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cfg := awsConfig(t)
	prefix := sqstest.UniquePrefix(t, cfg)
	newer := sqstest.New(t, cfg, sqstest.FastOptions(prefix)...)
	defer newer.Close(context.Background())
	if err := newer.Setup(ctx, bus.Topology{Endpoint: "billing", Handles: []string{"shop.order_placed", "shop.order_cancelled"}, MaxAttempts: 3, Concurrency: 1}); err != nil {
		t.Fatal(err)
	}
	client := newer.SQS()
	url, err := client.GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(newer.QueueName("billing"))})
	if err != nil {
		t.Fatal(err)
	}
	policy := func() string {
		out, err := client.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{QueueUrl: url.QueueUrl, AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNamePolicy}})
		if err != nil {
			t.Fatal(err)
		}
		return out.Attributes[string(sqstypes.QueueAttributeNamePolicy)]
	}
	var p map[string]any
	if err := json.Unmarshal([]byte(policy()), &p); err != nil {
		t.Fatal(err)
	}
	p["Statement"] = append(p["Statement"].([]any), map[string]any{
		"Sid": "ops-audit", "Effect": "Allow", "Principal": map[string]any{"AWS": "arn:aws:iam::000000000000:root"},
		"Action": "sqs:GetQueueAttributes", "Resource": "*",
	})
	js, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.SetQueueAttributes(ctx, &awssqs.SetQueueAttributesInput{QueueUrl: url.QueueUrl, Attributes: map[string]string{"Policy": string(js)}}); err != nil {
		t.Fatal(err)
	}
	older := sqstest.New(t, cfg, sqstest.FastOptions(prefix)...)
	defer older.Close(context.Background())
	if err := older.Setup(ctx, bus.Topology{Endpoint: "billing", Handles: []string{"shop.order_placed"}, MaxAttempts: 3, Concurrency: 1}); err != nil {
		t.Fatal(err)
	}
	got := policy()
	for _, want := range []string{":" + newer.TopicName("shop.order_placed") + `"`, ":" + newer.TopicName("shop.order_cancelled") + `"`, "ops-audit"} {
		if !strings.Contains(got, want) {
			t.Errorf("the policy after the older instance's Setup lacks %q:\n%s", want, got)
		}
	}
	if n := strings.Count(got, "plugbus-sns-delivery"); n != 1 {
		t.Errorf("%d plugbus statements, want 1:\n%s", n, got)
	}
}

// SQS counts receives and redrives past the maximum attempts itself: a
// last attempt that Stop interrupted is dead-lettered by the bus, with
// its reason, not returned for the redrive policy to move without one.
func TestStopOnTheLastAttemptDeadLettersWithTheReason(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	tr, _ := openTransport(t)
	in := make(chan struct{}, 1)
	b, err := bus.New(bus.WithEndpoint("worker"), bus.WithTransport(tr), bus.WithLogger(slog.New(slog.DiscardHandler)), bus.WithMaxAttempts(1),
		bus.WithHandler(func(ctx context.Context, _ job, _ bus.Attributes) error {
			in <- struct{}{}
			<-ctx.Done()
			return ctx.Err()
		}))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(ctx, job{N: 1}); err != nil {
		t.Fatal(err)
	}
	<-in
	sctx, scancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer scancel()
	if err := b.Stop(sctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop: %v", err)
	}
	got := sqstest.DeadLetters(ctx, t, tr, "worker", 1)
	if len(got) != 1 || !strings.Contains(got[0].Failure.Reason, "context canceled") {
		t.Fatalf("dead letters %+v, want the job with the handler's failure", got)
	}
}
