package sqs_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/sqstest"
	"github.com/plugbus/plugbus/transports/sqs"
)

// maybeSentWording is what the error of a call whose message may have
// been accepted says.
const maybeSentWording = "may have been sent"

// holdingProxy is a proxy in front of the emulator that passes every
// request on, and holds the answer to the first request of operation op
// (an SQS X-Amz-Target such as "AmazonSQS.SendMessage", or an SNS query
// action such as "Publish"): it forwards that request to the emulator,
// reads its answer, tells forwarded, and then never returns the answer,
// waiting for the client to give up on the request. With abort, it
// instead closes the connection of every request of op once the
// emulator answered it, without answering.
type holdingProxy struct {
	t         *testing.T
	target    string // the emulator's URL
	op        string
	abort     bool
	forwarded chan struct{} // closed once the held request was answered by the emulator

	mu   sync.Mutex
	held bool
}

// newHoldingProxy starts a holding proxy to the emulator of cfg and
// returns it with cfg pointed at it.
func newHoldingProxy(t *testing.T, cfg aws.Config, op string, abort bool) (*holdingProxy, aws.Config) {
	p := &holdingProxy{t: t, target: *cfg.BaseEndpoint, op: op, abort: abort, forwarded: make(chan struct{})}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	cfg.BaseEndpoint = aws.String(srv.URL)
	return p, cfg
}

func (p *holdingProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	isOp := r.Header.Get("X-Amz-Target") == p.op || bytes.HasPrefix(body, []byte("Action="+p.op+"&"))
	p.mu.Lock()
	hold := isOp && (p.abort || !p.held)
	p.held = p.held || hold
	p.mu.Unlock()
	// The held request goes on even once the client gave up on it: the
	// emulator gets it whole, as a service would.
	fwdCtx := r.Context()
	if hold {
		fwdCtx = context.WithoutCancel(fwdCtx)
	}
	res, out, err := forward(fwdCtx, r, p.target, body)
	if err != nil {
		if hold {
			p.t.Errorf("proxy: forwarding the held %s: %v", p.op, err)
		}
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	if hold {
		if res.StatusCode != http.StatusOK {
			p.t.Errorf("proxy: the emulator answered the held %s with %s: %s", p.op, res.Status, out)
		}
		if p.abort {
			panic(http.ErrAbortHandler) // closes the connection, unanswered
		}
		close(p.forwarded)
		<-r.Context().Done() // the client gave up (or the server closes)
		return
	}
	relay(w, res, out)
}

// holdingTransport sets up endpoint "ep", handling "evt", on a transport
// going through a proxy holding the answer to the first op (or, with
// abort, closing the connection of each), with extra options, and
// returns it with the proxy and the URL of the endpoint's queue.
func holdingTransport(t *testing.T, ctx context.Context, op string, abort bool, extra ...sqs.Option) (*sqs.Transport, *holdingProxy, *string) {
	t.Helper()
	var p *holdingProxy
	tr, url := proxiedEndpoint(t, ctx, func(cfg aws.Config) aws.Config {
		p, cfg = newHoldingProxy(t, cfg, op, abort)
		return cfg
	}, extra...)
	return tr, p, url
}

// cancelWhenForwarded returns a context of ctx that is cancelled once p
// forwarded its held request and got the emulator's answer.
func cancelWhenForwarded(ctx context.Context, p *holdingProxy) context.Context {
	sendCtx, cancel := context.WithCancel(ctx)
	go func() {
		defer cancel()
		select {
		case <-p.forwarded:
		case <-sendCtx.Done():
		}
	}()
	return sendCtx
}

// wantMaybeSent fails t unless err, of a call cancelled while in flight,
// says its message may have been sent and matches context.Canceled.
func wantMaybeSent(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), maybeSentWording) || !errors.Is(err, context.Canceled) {
		t.Errorf("%s = %v, want context.Canceled saying %q", what, err, maybeSentWording)
	}
}

// A Send whose context ends after its request reached SQS, which
// accepted the message, but before the answer came back fails with the
// context's error saying that the message may have been sent, and it was.
func TestSendCancelledInFlightMayHaveBeenSent(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	tr, p, url := holdingTransport(t, ctx, "AmazonSQS.SendMessage", false)
	err := tr.Send(cancelWhenForwarded(ctx, p), envelope("cmd", "m-0"), "ep")
	wantMaybeSent(t, "Send", err)
	if seen := inQueue(t, ctx, tr, url); seen["m-0"] != 1 || len(seen) != 1 {
		t.Errorf("queue holds %v, want m-0 once: the error said it may have been sent, and it was", seen)
	}
}

// A SendBatch whose context ends while its SendMessageBatch call is in
// flight fails each entry of the call with the context's error saying
// that the message may have been sent, and they all were.
func TestSendBatchCancelledInFlightMayHaveBeenSent(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	tr, p, url := holdingTransport(t, ctx, "AmazonSQS.SendMessageBatch", false)
	err := tr.SendBatch(cancelWhenForwarded(ctx, p), sends(3))
	var be *bus.BatchError
	if !errors.As(err, &be) || len(be.Failures) != 3 {
		t.Fatalf("SendBatch = %v, want a *bus.BatchError failing the 3 messages", err)
	}
	for _, f := range be.Failures {
		wantMaybeSent(t, "message "+strconv.Itoa(f.Index), f.Err)
	}
	wantReceived(t, inQueue(t, ctx, tr, url), 3)
}

// A Publish whose context ends while its call is in flight fails with
// the context's error saying that the message may have been sent, and
// SNS delivered it to the subscribed queue.
func TestPublishCancelledInFlightMayHaveBeenSent(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	tr, p, url := holdingTransport(t, ctx, "Publish", false)
	err := tr.Publish(cancelWhenForwarded(ctx, p), envelope("evt", "e-0"))
	wantMaybeSent(t, "Publish", err)
	// SNS delivers after its answer: wait for the copy (long polls).
	for ctx.Err() == nil {
		out, err := tr.SQS().ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{QueueUrl: url, MaxNumberOfMessages: 10, WaitTimeSeconds: 2,
			VisibilityTimeout: 60, MessageAttributeNames: []string{"All"}})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range out.Messages {
			if d := sqs.Decode(m, nil); d.Attributes.MessageID == "e-0" {
				return
			}
			t.Errorf("received %s, which was not published", aws.ToString(m.Body))
		}
	}
	t.Errorf("e-0 never reached the subscribed queue: %v", ctx.Err())
}

// A Send whose connection is lost after SQS got its request, in each of
// the client's attempts (3 here), fails saying that the message may have
// been sent: a plain failure, not the context's, and SQS has it from
// each attempt.
func TestSendConnectionLostAfterTheRequestMayHaveBeenSent(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	b := backOffs{delay: time.Millisecond}
	tr, _, url := holdingTransport(t, ctx, "AmazonSQS.SendMessage", true,
		sqs.WithSQSOptions(b.option(3)), sqs.WithLogger(slog.New(slog.DiscardHandler)))
	err := tr.Send(ctx, envelope("cmd", "m-0"), "ep")
	if err == nil || !strings.Contains(err.Error(), maybeSentWording) || errors.Is(err, context.Canceled) {
		t.Errorf("Send = %v, want a failure saying %q", err, maybeSentWording)
	}
	if seen := inQueue(t, ctx, tr, url); seen["m-0"] != 3 || len(seen) != 1 {
		t.Errorf("queue holds %v, want m-0 three times, once per attempt", seen)
	}
}

// A Send whose every attempt could not open a connection (refused) sent
// nothing: its error is a plain failure, not one that may have been sent.
func TestSendRefusedConnectionWasNotSent(t *testing.T) {
	addr := closedAddress(t)
	cfg := aws.Config{
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
		BaseEndpoint: aws.String("http://" + addr),
		HTTPClient:   &http.Client{Transport: httpTransport},
	}
	b := backOffs{delay: time.Millisecond}
	tr := sqstest.New(t, cfg, sqs.WithSQSOptions(b.option(3)), sqs.WithLogger(slog.New(slog.DiscardHandler)))
	t.Cleanup(func() { _ = tr.Close(context.Background()) })
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	// A queue URL as destination: no lookup, the SendMessage call is the first.
	err := tr.Send(ctx, envelope("cmd", "m-0"), "http://"+addr+"/000000000000/ep")
	if err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("Send = %v, want the refused connection", err)
	}
	if strings.Contains(err.Error(), maybeSentWording) {
		t.Errorf("Send = %v, want a plain failure: no connection was opened, nothing was sent", err)
	}
	if attempts, _ := b.recorded(); len(attempts) != 2 {
		t.Errorf("back-off asked after attempts %v, want 1 and 2: each attempt was refused", attempts)
	}
}
