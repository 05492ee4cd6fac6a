package sqs_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssns "github.com/aws/aws-sdk-go-v2/service/sns"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/sqstest"
	"github.com/plugbus/plugbus/transports/sqs"
)

// New refuses every option SQS would not accept, or the transport could
// not work with, with an *sqs.OptionError naming the option and the
// value; it used to clamp or round them (WithWaitTime(30s) polled 20 s,
// WithVisibilityTimeout(0) hid messages 1 s) or ignore them
// (WithRequestTimeout(-1s), WithMaxMessageSize(0)), and a prefix with a
// '.' made every name hashed.
func TestNewRefusesOptionsOutOfRange(t *testing.T) {
	cfg := aws.Config{Region: "us-east-1"}
	for _, c := range []struct {
		opt          sqs.Option
		option, give string
	}{
		{sqs.WithWaitTime(30 * time.Second), "WithWaitTime", "30s"},
		{sqs.WithWaitTime(0), "WithWaitTime", "0s"},
		{sqs.WithWaitTime(-time.Second), "WithWaitTime", "-1s"},
		{sqs.WithWaitTime(1500 * time.Millisecond), "WithWaitTime", "1.5s"},
		{sqs.WithVisibilityTimeout(0), "WithVisibilityTimeout", "0s"},
		{sqs.WithVisibilityTimeout(12*time.Hour + time.Second), "WithVisibilityTimeout", "12h0m1s"},
		{sqs.WithVisibilityTimeout(2500 * time.Millisecond), "WithVisibilityTimeout", "2.5s"},
		{sqs.WithMaxMessageSize(0), "WithMaxMessageSize", "0"},
		{sqs.WithMaxMessageSize(1023), "WithMaxMessageSize", "1023"},
		{sqs.WithMaxMessageSize(1024*1024 + 1), "WithMaxMessageSize", "1048577"},
		{sqs.WithDeadLetterRetention(59 * time.Second), "WithDeadLetterRetention", "59s"},
		{sqs.WithDeadLetterRetention(15 * 24 * time.Hour), "WithDeadLetterRetention", "360h0m0s"},
		{sqs.WithDeadLetterRetention(90*time.Second + time.Millisecond), "WithDeadLetterRetention", "1m30.001s"},
		{sqs.WithRequestTimeout(0), "WithRequestTimeout", "0s"},
		{sqs.WithRequestTimeout(-time.Second), "WithRequestTimeout", "-1s"},
		{sqs.WithPrefix("prod."), "WithPrefix", `"prod."`},
		{sqs.WithPrefix("prod env-"), "WithPrefix", `"prod env-"`},
		{sqs.WithPrefix("orders.fifo"), "WithPrefix", `"orders.fifo"`},
		{sqs.WithPrefix(strings.Repeat("p", sqs.MaxPrefixLength+1)), "WithPrefix", `"` + strings.Repeat("p", sqs.MaxPrefixLength+1) + `"`},
		{sqs.WithSQSOptions(func(*awssqs.Options) {}, nil), "WithSQSOptions", "nil"},
		{sqs.WithSNSOptions(nil), "WithSNSOptions", "nil"},
	} {
		tr, err := sqs.New(cfg, c.opt)
		var oe *sqs.OptionError
		if tr != nil || !errors.As(err, &oe) || !errors.Is(err, sqs.ErrInvalidOption) || oe.Option != c.option || oe.Value != c.give || oe.Reason == "" {
			t.Errorf("%s(%s): transport %v, error %v; want an *sqs.OptionError naming the option and the value", c.option, c.give, tr, err)
			continue
		}
		if want := "sqs: " + c.option + "(" + c.give + "): "; !strings.HasPrefix(err.Error(), want) {
			t.Errorf("%s(%s): %q, want it to begin with %q", c.option, c.give, err, want)
		}
	}
}

// The bounds themselves are SQS's, and accepted; so are the zero values
// that mean a default.
func TestNewAcceptsOptionsAtTheirBounds(t *testing.T) {
	cfg := aws.Config{Region: "us-east-1"}
	for _, opts := range [][]sqs.Option{
		{sqs.WithWaitTime(time.Second), sqs.WithVisibilityTimeout(time.Second), sqs.WithMaxMessageSize(1024),
			sqs.WithDeadLetterRetention(time.Minute), sqs.WithRequestTimeout(time.Nanosecond)},
		{sqs.WithWaitTime(20 * time.Second), sqs.WithVisibilityTimeout(12 * time.Hour), sqs.WithMaxMessageSize(1024 * 1024),
			sqs.WithDeadLetterRetention(14 * 24 * time.Hour)},
		{sqs.WithPrefix(""), sqs.WithLogger(nil), nil, sqs.WithSQSOptions(), sqs.WithSNSOptions(func(*awssns.Options) {})},
		{sqs.WithPrefix("Env_1-" + strings.Repeat("p", sqs.MaxPrefixLength-6))},
	} {
		if _, err := sqs.New(cfg, opts...); err != nil {
			t.Errorf("New: %v", err)
		}
	}
}

// A prefix of MaxPrefixLength begins every queue name whole, the longest
// an endpoint makes and its instance queue's included, so that a
// ListQueues, an IAM policy or a clean-up by prefix finds every queue.
func TestMaxPrefixBeginsEveryQueueName(t *testing.T) {
	cfg := awsConfig(t)
	unique := sqstest.UniquePrefix(t, cfg) // deletes what begins with it, so what begins with prefix
	prefix := unique + strings.Repeat("p", sqs.MaxPrefixLength-len(unique))
	tr := sqstest.New(t, cfg, sqstest.FastOptions(prefix)...)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	defer func() { _ = tr.Close(context.WithoutCancel(ctx)) }()
	endpoint := strings.Repeat("e", 200)
	if err := tr.Setup(ctx, bus.Topology{Endpoint: endpoint, Concurrency: 1, MaxAttempts: 1, Instance: true}); err != nil {
		t.Fatal(err)
	}
	addr := tr.InstanceAddress()
	instance := addr[strings.LastIndexByte(addr, '/')+1:]
	for _, name := range []string{tr.QueueName(endpoint), tr.DeadLetterQueueName(endpoint), tr.TopicName(endpoint), instance} {
		if !strings.HasPrefix(name, prefix) {
			t.Errorf("%q does not begin with the prefix %q", name, prefix)
		}
	}
}
