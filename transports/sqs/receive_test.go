package sqs_test

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/sqstest"
	"github.com/plugbus/plugbus/transports/sqs"
)

func send(ctx context.Context, t *testing.T, tr *sqs.Transport, endpoint string, n int) {
	t.Helper()
	for i := range n {
		env := &bus.Envelope{Name: "test.job", Body: []byte(strconv.Itoa(i)), Attributes: bus.NewAttributes("m-"+strconv.Itoa(i), "c", time.Now(), nil, nil)}
		if err := tr.Send(ctx, env, endpoint); err != nil {
			t.Fatal(err)
		}
	}
}

func expectNothing(t *testing.T, tr *sqs.Transport, quiet time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), quiet)
	defer cancel()
	if d, err := tr.Receive(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("expected no delivery, got %v (%v)", d, err)
	}
}

// While a handler holds a message longer than the visibility timeout, the
// heartbeat keeps it from other consumers.
func TestVisibilityExtendedWhileHandling(t *testing.T) {
	cfg := awsConfig(t)
	prefix := sqstest.UniquePrefix(t, cfg)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	open := func() *sqs.Transport {
		tr := sqstest.New(t, cfg, sqstest.FastOptions(prefix, sqs.WithVisibilityTimeout(time.Second))...)
		if err := tr.Setup(ctx, bus.Topology{Endpoint: "slow", MaxAttempts: 5, Concurrency: 1}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tr.Close(context.Background()) })
		return tr
	}
	a, b := open(), open()
	send(ctx, t, a, "slow", 1)
	d, err := a.Receive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Three visibility timeouts pass while a "handles" d: b sees nothing.
	expectNothing(t, b, 3*time.Second)
	if err := a.Delete(ctx, d); err != nil {
		t.Fatalf("Delete after a long handler: %v", err)
	}
	expectNothing(t, b, 1500*time.Millisecond)
}

// A transport holds no more messages than its concurrency: the rest stay
// on the queue for other consumers.
func TestPrefetchBoundedByConcurrency(t *testing.T) {
	cfg := awsConfig(t)
	prefix := sqstest.UniquePrefix(t, cfg)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	open := func(concurrency int) *sqs.Transport {
		tr := sqstest.New(t, cfg, sqstest.FastOptions(prefix)...)
		if err := tr.Setup(ctx, bus.Topology{Endpoint: "bounded", MaxAttempts: 5, Concurrency: concurrency}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tr.Close(context.Background()) })
		return tr
	}
	a := open(2)
	send(ctx, t, a, "bounded", 10)
	var held []*bus.Delivery
	for range 2 {
		d, err := a.Receive(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, d)
	}
	b := open(10)
	for i := range 8 {
		d, err := b.Receive(ctx)
		if err != nil {
			t.Fatalf("second consumer got %d of the 8 messages a may not hold: %v", i, err)
		}
		if err := b.Delete(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	expectNothing(t, b, 500*time.Millisecond)
	for _, d := range held {
		if err := a.Delete(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	// Settling twice is refused.
	if err := a.Delete(ctx, held[0]); err == nil {
		t.Fatal("second Delete of one delivery succeeded")
	}
}

func TestReceiveBeforeSetup(t *testing.T) {
	tr := sqstest.New(t, awsConfig(t))
	defer tr.Close(context.Background())
	if _, err := tr.Receive(t.Context()); !errors.Is(err, sqs.ErrNotSetUp) {
		t.Fatalf("Receive before Setup: %v", err)
	}
}

// Bodies SQS cannot carry as text (binary, empty) survive Send and Publish.
func TestBinaryBodiesThroughSQSAndSNS(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	tr, _ := openTransport(t)
	if err := tr.Setup(ctx, bus.Topology{Endpoint: "bin", Handles: []string{"test.blob"}, MaxAttempts: 5, Concurrency: 4}); err != nil {
		t.Fatal(err)
	}
	for _, body := range [][]byte{{0x00, 0xff, 0x10, 0x80}, {}} {
		env := &bus.Envelope{Name: "test.blob", ContentType: "application/x-protobuf", Body: body, Headers: bus.Headers{"x-h": "1"},
			Attributes: bus.NewAttributes("blob", "c", time.Now(), nil, nil)}
		if err := tr.Send(ctx, env, "bin"); err != nil {
			t.Fatalf("Send %x: %v", body, err)
		}
		if err := tr.Publish(ctx, env); err != nil {
			t.Fatalf("Publish %x: %v", body, err)
		}
		for range 2 {
			d, err := tr.Receive(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if d.Err != nil || string(d.Body) != string(body) || d.Headers["x-h"] != "1" || d.ContentType != "application/x-protobuf" {
				t.Fatalf("sent %x, received %x (err %v, headers %v)", body, d.Body, d.Err, d.Headers)
			}
			if err := tr.Delete(ctx, d); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// refusingTransport fails every ChangeMessageVisibilityBatch request (the
// heartbeat) and passes the others on.
type refusingTransport struct{}

func (refusingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if strings.HasSuffix(req.Header.Get("X-Amz-Target"), ".ChangeMessageVisibilityBatch") {
		return nil, errors.New("heartbeat refused by the test")
	}
	return httpTransport.RoundTrip(req)
}

// A handler that outlives the visibility timeout while the heartbeat
// cannot extend it: another consumer receives the message, and the first
// consumer's late Delete, made with the receipt handle of an earlier
// receive, does not remove it. The Delete says so instead of reporting
// the message deleted.
func TestLateDeleteAfterTheVisibilityLapsedIsReported(t *testing.T) {
	cfg := awsConfig(t)
	prefix := sqstest.UniquePrefix(t, cfg)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	open := func(cfg aws.Config) *sqs.Transport {
		tr := sqstest.New(t, cfg, sqstest.FastOptions(prefix, sqs.WithVisibilityTimeout(time.Second),
			sqs.WithSQSOptions(func(o *awssqs.Options) { o.RetryMaxAttempts = 1 }))...)
		if err := tr.Setup(ctx, bus.Topology{Endpoint: "lapsed", MaxAttempts: 5, Concurrency: 1}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tr.Close(context.Background()) })
		return tr
	}
	refused := cfg.Copy()
	refused.HTTPClient = &http.Client{Transport: refusingTransport{}}
	a, b := open(refused), open(cfg)
	send(ctx, t, a, "lapsed", 1)
	d, err := a.Receive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// a's heartbeat fails: once the visibility timeout ends, b gets it.
	again, err := b.Receive(ctx)
	if err != nil {
		t.Fatalf("the message did not come back to another consumer: %v", err)
	}
	if again.Attributes.MessageID != d.Attributes.MessageID {
		t.Fatalf("b received %s, want %s", again.Attributes.MessageID, d.Attributes.MessageID)
	}
	if err := a.Delete(ctx, d); err == nil || !strings.Contains(err.Error(), "visibility timeout") {
		t.Errorf("late Delete of a message another consumer received: %v, want an error saying its visibility timeout ended", err)
	}
	if err := b.Delete(ctx, again); err != nil {
		t.Fatalf("Delete by the consumer holding it: %v", err)
	}
	expectNothing(t, b, 1500*time.Millisecond)
}
