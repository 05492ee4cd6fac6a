package sqs_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/sqs"
)

func envelope(name, id string) *bus.Envelope {
	return &bus.Envelope{Name: name, ContentType: "application/json", Body: []byte(`{}`), Attributes: bus.NewAttributes(id, id, time.Now(), nil, nil)}
}

// gatedTransport holds every ChangeMessageVisibilityBatch request (the
// heartbeat) until open is closed, and counts ReceiveMessage requests in
// flight.
type gatedTransport struct {
	open      chan struct{}
	held      chan struct{} // receives once per held request
	receiving atomic.Int32
}

func (g *gatedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	switch target := req.Header.Get("X-Amz-Target"); {
	case strings.HasSuffix(target, ".ChangeMessageVisibilityBatch"):
		select {
		case g.held <- struct{}{}:
		default:
		}
		<-g.open
	case strings.HasSuffix(target, ".ReceiveMessage"):
		g.receiving.Add(1)
		defer g.receiving.Add(-1)
	}
	return httpTransport.RoundTrip(req)
}

// A settlement that begins while Close runs returns an error wrapping
// bus.ErrClosed at once: Close gives the message back to the queue. It used
// to pass settle and then wait forever for the delete flushers Close had
// stopped.
func TestSettleDuringClose(t *testing.T) {
	cfg := awsConfig(t)
	prefix := uniquePrefix(t, cfg)
	gate := &gatedTransport{open: make(chan struct{}), held: make(chan struct{}, 1)}
	opened := false
	release := func() {
		if !opened {
			opened = true
			close(gate.open)
		}
	}
	defer release()
	gated := cfg.Copy()
	gated.HTTPClient = &http.Client{Transport: gate}
	tr := sqs.New(gated, fastOptions(prefix, sqs.WithVisibilityTimeout(2*time.Second))...)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := tr.Setup(ctx, bus.Topology{Endpoint: "ep", Concurrency: 1, MaxAttempts: 3}); err != nil {
		t.Fatal(err)
	}
	if err := tr.Send(ctx, envelope("Order", "o1"), bus.SendOptions{Destination: "ep"}); err != nil {
		t.Fatal(err)
	}
	d, err := tr.Receive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	select { // a heartbeat round extending d is in flight, held
	case <-gate.held:
	case <-ctx.Done():
		t.Fatal("no heartbeat round began")
	}
	closed := make(chan error, 1)
	go func() { closed <- tr.Close(context.Background()) }()
	// Close has begun once Receive says so; it is waiting for the held
	// heartbeat once the long polls ended.
	for {
		rctx, rcancel := context.WithTimeout(ctx, 100*time.Millisecond)
		_, err := tr.Receive(rctx)
		rcancel()
		if errors.Is(err, bus.ErrClosed) {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("Receive never returned bus.ErrClosed during Close")
		}
	}
	for gate.receiving.Load() > 0 && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond) // polling: the long polls give no other signal
	}
	dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
	defer dcancel()
	if err := tr.Delete(dctx, d); !errors.Is(err, bus.ErrClosed) {
		t.Errorf("Delete during Close: %v, want an error wrapping bus.ErrClosed", err)
	}
	if err := tr.Fail(dctx, d, bus.Failure{Reason: "boom", Attempts: 1}); !errors.Is(err, bus.ErrClosed) {
		t.Errorf("Fail during Close: %v, want an error wrapping bus.ErrClosed", err)
	}
	release()
	if err := <-closed; err != nil {
		t.Errorf("Close: %v", err)
	}
}

// Only a missing instance queue is dropped: a queue URL that names any
// other queue that does not exist is a *NoQueueError.
func TestSendToMissingQueueURL(t *testing.T) {
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
	err = tr.Send(ctx, envelope("Order", "o1"), bus.SendOptions{Destination: base + prefix + "billing-typo"})
	var nq *sqs.NoQueueError
	if !errors.As(err, &nq) || !errors.Is(err, bus.ErrNoRoute) || nq.Queue != prefix+"billing-typo" {
		t.Errorf("Send to the URL of a missing queue: %v, want *sqs.NoQueueError", err)
	}
	if err := tr.Send(ctx, envelope("Reply", "r1"), bus.SendOptions{Destination: base + prefix + "instance-0123456789abcdef"}); err != nil {
		t.Errorf("Send to a missing instance queue: %v, want nil (dropped with a warning)", err)
	}
}

// A message of the instance queue that fails for good goes to the
// endpoint's dead-letter queue when there is an endpoint.
func TestInstanceFailureDeadLettered(t *testing.T) {
	tr, _ := openTransport(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := tr.Setup(ctx, bus.Topology{Endpoint: "ep", Concurrency: 1, MaxAttempts: 1, Instance: true}); err != nil {
		t.Fatal(err)
	}
	if err := tr.Send(ctx, envelope("Reply", "r1"), bus.SendOptions{Destination: tr.InstanceAddress()}); err != nil {
		t.Fatal(err)
	}
	d, err := tr.Receive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Fail(ctx, d, bus.Failure{Reason: "boom", Attempts: 1, Endpoint: "ep"}); err != nil {
		t.Fatal(err)
	}
	dl := deadLetters(ctx, t, tr, "ep", 1)
	if len(dl) != 1 || dl[0].Failure.Reason != "boom" || dl[0].Envelope.Attributes.MessageID != "r1" {
		t.Errorf("dead letters of ep = %+v, want the failed reply r1", dl)
	}
}

// Bus attributes travel in the "plugbus" message attribute: characters
// SQS refuses there (U+FFFE, most control characters) are an
// *AttributeError before anything is sent.
func TestAttributeCharacters(t *testing.T) {
	for name, attrs := range map[string]map[string]string{
		"value U+FFFE":   {"k": "a\uFFFEb"},
		"value control":  {"k": "a\u0001b"},
		"key U+FFFF":     {"k\uFFFF": "v"},
		"key control":    {"k\u001b": "v"},
		"value over BMP": nil, // control: allowed
	} {
		t.Run(name, func(t *testing.T) {
			env := envelope("Order", "o1")
			env.Attributes = bus.NewAttributes("o1", "o1", time.Now(), attrs, map[string]string{"ok": "\U0001F600"})
			_, err := sqs.Encode(env)
			var ae *sqs.AttributeError
			if attrs == nil {
				if err != nil {
					t.Errorf("Encode: %v", err)
				}
				return
			}
			if !errors.As(err, &ae) {
				t.Errorf("Encode with attributes %q: %v, want *sqs.AttributeError", attrs, err)
			}
		})
	}
}

type decodeFailure struct{}

func (decodeFailure) MessageName() string { return "test.decode-failure" }

// The Lambda handler retries a handler's error like the poller does, even
// one that wraps a *bus.DecodeError: only the bus's own decode failure is
// poison.
func TestLambdaHandlerErrorWithDecodeErrorIsRetried(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	tr, _ := openTransport(t)
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
	resp, err := sqs.NewLambdaHandler(b, sqs.LambdaMaxAttempts(3))(ctx, ev)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.BatchItemFailures) != 1 {
		t.Errorf("first attempt of a record whose handler failed: %d batch item failures, want 1 (retried, not dead-lettered)", len(resp.BatchItemFailures))
	}
}
