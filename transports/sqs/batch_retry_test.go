package sqs_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/sqstest"
	"github.com/plugbus/plugbus/transports/sqs"
)

// entryFaults is a proxy in front of the emulator that fails entries of
// SendMessageBatch calls chosen by their message body: it forwards a call
// without them, so that they are really not accepted, and adds them to
// the answer's Failed entries with code InternalError (SenderFault false)
// or InvalidParameterValue (SenderFault true). It records the bodies of
// each SendMessageBatch call it received.
type entryFaults struct {
	t           *testing.T
	target      string // the emulator's URL
	senderFault bool

	mu    sync.Mutex
	fail  map[string]int // body → the number of calls in which it fails still
	calls [][]string     // the bodies of each SendMessageBatch call
}

// newEntryFaults starts a proxy to the emulator of cfg that fails the
// entries of body b in the fail[b] first calls they are in, and returns
// it with cfg pointed at it.
func newEntryFaults(t *testing.T, cfg aws.Config, senderFault bool, fail map[string]int) (*entryFaults, aws.Config) {
	p := &entryFaults{t: t, target: *cfg.BaseEndpoint, senderFault: senderFault, fail: fail}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	cfg.BaseEndpoint = aws.String(srv.URL)
	return p, cfg
}

// batchEntry is what the proxy reads and writes of a SendMessageBatch
// entry: the rest is passed on as it is.
type batchEntry = map[string]any

func (p *entryFaults) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	var failed []batchEntry
	var in map[string]any
	batch := r.Header.Get("X-Amz-Target") == "AmazonSQS.SendMessageBatch"
	if batch {
		if err := json.Unmarshal(body, &in); err != nil {
			p.t.Errorf("proxy: SendMessageBatch request: %v", err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var kept []any
		p.mu.Lock()
		call := []string{}
		for _, e := range in["Entries"].([]any) {
			b := e.(batchEntry)["MessageBody"].(string)
			call = append(call, b)
			if p.fail[b] > 0 {
				p.fail[b]--
				failed = append(failed, p.failure(e.(batchEntry)["Id"].(string)))
				continue
			}
			kept = append(kept, e)
		}
		p.calls = append(p.calls, call)
		p.mu.Unlock()
		if len(kept) == 0 { // SQS refuses an empty batch: answer for the emulator
			p.answer(w, map[string]any{"Successful": []any{}, "Failed": failed})
			return
		}
		in["Entries"] = kept
		if body, err = json.Marshal(in); err != nil {
			p.t.Errorf("proxy: %v", err)
		}
	}
	res, out, err := forward(r.Context(), r, p.target, body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	if !batch || len(failed) == 0 || res.StatusCode != http.StatusOK {
		relay(w, res, out)
		return
	}
	var answer map[string]any
	if err := json.Unmarshal(out, &answer); err != nil {
		p.t.Errorf("proxy: SendMessageBatch answer %s: %v", out, err)
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	prior, _ := answer["Failed"].([]any)
	for _, f := range failed {
		prior = append(prior, f)
	}
	answer["Failed"] = prior
	p.answer(w, answer)
}

// failure is the Failed entry of the entry with id id.
func (p *entryFaults) failure(id string) batchEntry {
	if p.senderFault {
		return batchEntry{"Id": id, "Code": "InvalidParameterValue", "Message": "refused by the test's proxy", "SenderFault": true}
	}
	return batchEntry{"Id": id, "Code": "InternalError", "Message": "failed by the test's proxy", "SenderFault": false}
}

// answer writes a SendMessageBatch answer.
func (p *entryFaults) answer(w http.ResponseWriter, answer map[string]any) {
	js, err := json.Marshal(answer)
	if err != nil {
		p.t.Errorf("proxy: %v", err)
	}
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	_, _ = w.Write(js)
}

// callsWith returns the number of SendMessageBatch calls the proxy got
// with body b among their entries, and the numbers of entries of all
// calls, in order.
func (p *entryFaults) callsWith(b string) (n int, sizes []int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.calls {
		sizes = append(sizes, len(c))
		if slices.Contains(c, b) {
			n++
		}
	}
	return n, sizes
}

// backOffs is a back-off for the SQS client's retryer that records each
// delay asked for and waits for delay.
type backOffs struct {
	delay time.Duration
	asked chan<- struct{} // nil, or told of each delay asked for

	mu       sync.Mutex
	attempts []int
	codes    []string
}

// option makes the SQS client's retryer the standard one with b's
// back-off (and MaxAttempts, when not 0).
func (b *backOffs) option(maxAttempts int) func(*awssqs.Options) {
	return func(o *awssqs.Options) {
		o.Retryer = retry.NewStandard(func(so *retry.StandardOptions) {
			so.MaxAttempts = maxAttempts
			so.Backoff = retry.BackoffDelayerFunc(func(attempt int, err error) (time.Duration, error) {
				var coded interface{ ErrorCode() string }
				b.mu.Lock()
				b.attempts = append(b.attempts, attempt)
				if errors.As(err, &coded) {
					b.codes = append(b.codes, coded.ErrorCode())
				}
				b.mu.Unlock()
				if b.asked != nil {
					b.asked <- struct{}{}
				}
				return b.delay, nil
			})
		})
	}
}

// recorded returns the attempts and codes the back-off was asked for.
func (b *backOffs) recorded() ([]int, []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Sorted(slices.Values(b.attempts)), slices.Clone(b.codes)
}

// batchRetryTransport sets up endpoint "ep" on a transport going through
// a proxy failing entries as newEntryFaults does, its SQS client's
// retryer with back-off b and maxAttempts, and returns it with the proxy
// and the URL of the endpoint's queue.
func batchRetryTransport(t *testing.T, ctx context.Context, b *backOffs, maxAttempts int, senderFault bool, fail map[string]int) (*sqs.Transport, *entryFaults, *string) {
	t.Helper()
	var p *entryFaults
	tr, url := proxiedEndpoint(t, ctx, func(cfg aws.Config) aws.Config {
		p, cfg = newEntryFaults(t, cfg, senderFault, fail)
		return cfg
	}, sqs.WithSQSOptions(b.option(maxAttempts)))
	return tr, p, url
}

// failedIndexes returns the indexes the *bus.BatchError err names, each
// of whose errors must satisfy ok (want says how).
func failedIndexes(t *testing.T, err error, want string, ok func(error) bool) []int {
	t.Helper()
	var be *bus.BatchError
	if !errors.As(err, &be) {
		t.Fatalf("SendBatch = %v, want a *bus.BatchError", err)
	}
	var got []int
	for _, f := range be.Failures {
		got = append(got, f.Index)
		if !ok(f.Err) {
			t.Errorf("message %d failed with %v, want %s", f.Index, f.Err, want)
		}
	}
	return got
}

// forward sends r, with body, to target (the emulator), as the proxies
// before it do, and returns the answer and its body, read.
func forward(ctx context.Context, r *http.Request, target string, body []byte) (*http.Response, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, r.Method, target+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	req.Header = r.Header.Clone()
	req.Header.Del("Accept-Encoding") // let the client decompress
	res, err := (&http.Client{Transport: httpTransport}).Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer res.Body.Close()
	out, err := io.ReadAll(res.Body)
	return res, out, err
}

// relay writes the emulator's answer res, whose body is out, to w.
func relay(w http.ResponseWriter, res *http.Response, out []byte) {
	for k, v := range res.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(res.StatusCode)
	_, _ = w.Write(out)
}

// proxiedEndpoint sets up endpoint "ep", handling "evt", on a transport
// with extra options whose configuration proxy returns (a proxy before
// the emulator), and returns it with the URL of the endpoint's queue.
func proxiedEndpoint(t *testing.T, ctx context.Context, proxy func(aws.Config) aws.Config, extra ...sqs.Option) (*sqs.Transport, *string) {
	t.Helper()
	cfg := awsConfig(t)
	prefix := sqstest.UniquePrefix(t, cfg)
	tr := sqstest.New(t, proxy(cfg), sqstest.FastOptions(prefix, extra...)...)
	t.Cleanup(func() { _ = tr.Close(context.Background()) })
	if err := tr.Setup(ctx, bus.Topology{Endpoint: "ep", Handles: []string{"evt"}, Concurrency: 1, MaxAttempts: 3}); err != nil {
		t.Fatal(err)
	}
	url, err := tr.SQS().GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(tr.QueueName("ep"))})
	if err != nil {
		t.Fatal(err)
	}
	return tr, url.QueueUrl
}

// sends returns n sends to "ep", message i with id and body "m-i".
func sends(n int) []bus.Outbound {
	batch := make([]bus.Outbound, n)
	for i := range batch {
		id := "m-" + strconv.Itoa(i)
		env := envelope("cmd", id)
		env.Body = []byte(strconv.Quote(id))
		batch[i] = bus.Outbound{Kind: bus.KindSend, Envelope: env, Destination: "ep"}
	}
	return batch
}

// body is the SQS message body of message "m-i" of sends.
func body(i int) string { return strconv.Quote("m-" + strconv.Itoa(i)) }

// inQueue receives every message of the queue at url, none deleted
// (each stays hidden for a minute), and counts them by message id.
func inQueue(t *testing.T, ctx context.Context, tr *sqs.Transport, url *string) map[string]int {
	t.Helper()
	seen := map[string]int{}
	for {
		out, err := tr.SQS().ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{QueueUrl: url, MaxNumberOfMessages: 10,
			VisibilityTimeout: 60, MessageAttributeNames: []string{"All"}})
		if err != nil {
			t.Fatal(err)
		}
		if len(out.Messages) == 0 {
			return seen
		}
		for _, m := range out.Messages {
			d := sqs.Decode(m, nil)
			if d.Err != nil {
				t.Errorf("received %s: %v", aws.ToString(m.Body), d.Err)
			}
			seen[d.Attributes.MessageID]++
		}
	}
}

// wantReceived fails t unless seen counts once each message of sends(n)
// but those of failed, which it must not count.
func wantReceived(t *testing.T, seen map[string]int, n int, failed ...int) {
	t.Helper()
	for i := range n {
		id, want := "m-"+strconv.Itoa(i), 1
		if slices.Contains(failed, i) {
			want = 0
		}
		if seen[id] != want {
			t.Errorf("received %s %d times, want %d", id, seen[id], want)
		}
		delete(seen, id)
	}
	for id, k := range seen {
		t.Errorf("received %s (%d times), which was not sent", id, k)
	}
}

// An entry that fails on the service's side (SenderFault false) is sent
// again, alone with the others that failed, after the client retryer's
// back-off, until it is accepted: SendBatch succeeds, and every message
// of the batch is in the queue once. Of 25 sends in three calls (10, 10,
// 5), m-3 and m-12 fail once and m-21 twice: four more calls of one
// entry each, the back-off asked after attempts 1, 1, 1 and 2 with the
// entries' code.
func TestBatchRetriesEntriesFailedOnTheServiceSide(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	b := backOffs{delay: time.Millisecond}
	tr, p, url := batchRetryTransport(t, ctx, &b, 0, false, map[string]int{body(3): 1, body(12): 1, body(21): 2})
	if err := tr.SendBatch(ctx, sends(25)); err != nil {
		t.Fatalf("SendBatch = %v, want nil: the entries that failed on the service's side were retried", err)
	}
	for i, want := range map[int]int{3: 2, 12: 2, 21: 3, 0: 1, 24: 1} {
		if n, sizes := p.callsWith(body(i)); n != want {
			t.Errorf("m-%d was in %d calls, want %d (calls of %v entries)", i, n, want, sizes)
		}
	}
	_, sizes := p.callsWith("")
	slices.Sort(sizes) // of the calls of 10, 10 and 5 entries, made at once, and their retries
	if !slices.Equal(sizes, []int{1, 1, 1, 1, 5, 10, 10}) {
		t.Errorf("calls of %v entries, want 10, 10, 5 and four retries of one entry", sizes)
	}
	attempts, codes := b.recorded()
	if !slices.Equal(attempts, []int{1, 1, 1, 2}) || !slices.Equal(codes, []string{"InternalError", "InternalError", "InternalError", "InternalError"}) {
		t.Errorf("back-off asked after attempts %v with codes %v, want 1, 1, 1, 2 with InternalError", attempts, codes)
	}
	wantReceived(t, inQueue(t, ctx, tr, url), 25)
}

// An entry refused for its sender's fault (SenderFault true) would be
// refused again: it fails at once, with its *sqs.EntryError, in no
// other call, and the back-off is never asked for.
func TestBatchDoesNotRetryEntriesTheSenderCaused(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var b backOffs
	tr, p, url := batchRetryTransport(t, ctx, &b, 0, true, map[string]int{body(4): 100})
	err := tr.SendBatch(ctx, sends(12))
	var be *bus.BatchError
	var ee *sqs.EntryError
	if !errors.As(err, &be) || len(be.Failures) != 1 || be.Failures[0].Index != 4 || !errors.As(be.Failures[0].Err, &ee) || !ee.SenderFault {
		t.Fatalf("SendBatch = %v, want m-4 (index 4) alone failed with a *sqs.EntryError with SenderFault", err)
	}
	if n, sizes := p.callsWith(body(4)); n != 1 || len(sizes) != 2 {
		t.Errorf("m-4 was in %d calls of %d, want 1 of 2: it was retried", n, len(sizes))
	}
	if attempts, _ := b.recorded(); len(attempts) != 0 {
		t.Errorf("back-off asked after attempts %v, want never", attempts)
	}
	wantReceived(t, inQueue(t, ctx, tr, url), 12, 4)
}

// An entry that fails on the service's side in each of the client's
// MaxAttempts calls (RetryMaxAttempts 4 here) fails with its last
// *sqs.EntryError, SenderFault false, named by its index in the batch;
// the entries around it, in the same calls, are sent once.
func TestBatchEntryRetriesEndAtMaxAttempts(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	b := backOffs{delay: time.Millisecond}
	tr, p, url := batchRetryTransport(t, ctx, &b, 4, false, map[string]int{body(2): 100, body(5): 100, body(13): 100})
	got := failedIndexes(t, tr.SendBatch(ctx, sends(15)), "its *sqs.EntryError InternalError after 4 tries", func(err error) bool {
		var ee *sqs.EntryError
		return errors.As(err, &ee) && !ee.SenderFault && ee.Code == "InternalError" && strings.Contains(err.Error(), "tried 4 times")
	})
	if !slices.Equal(got, []int{2, 5, 13}) {
		t.Errorf("failed indexes %v, want 2, 5, 13", got)
	}
	for _, i := range []int{2, 5, 13} {
		if n, sizes := p.callsWith(body(i)); n != 4 {
			t.Errorf("m-%d was in %d calls, want 4 (calls of %v entries)", i, n, sizes)
		}
	}
	wantReceived(t, inQueue(t, ctx, tr, url), 15, 2, 5, 13)
}

// When ctx ends during the back-off before an entry is tried again,
// SendBatch returns at once (the back-off is an hour): the entries that
// were waiting fail with ctx's error and their last failure, the others
// were sent.
func TestBatchEntryRetryStopsWhenContextEnds(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	asked := make(chan struct{}, 1)
	b := backOffs{delay: time.Hour, asked: asked}
	tr, p, url := batchRetryTransport(t, ctx, &b, 0, false, map[string]int{body(1): 100, body(4): 100})
	sendCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		select {
		case <-asked:
			stop()
		case <-sendCtx.Done():
		}
	}()
	start := time.Now()
	err := tr.SendBatch(sendCtx, sends(6))
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("SendBatch returned after %v, want at once when its context ended", d)
	}
	got := failedIndexes(t, err, "context.Canceled with its *sqs.EntryError, not accepted", func(err error) bool {
		var ee *sqs.EntryError
		return errors.Is(err, context.Canceled) && errors.As(err, &ee) && !ee.SenderFault && strings.Contains(err.Error(), "not accepted")
	})
	if !slices.Equal(got, []int{1, 4}) {
		t.Errorf("failed indexes %v, want 1, 4", got)
	}
	if n, sizes := p.callsWith(body(1)); n != 1 || len(sizes) != 1 {
		t.Errorf("m-1 was in %d calls of %d, want the first alone", n, len(sizes))
	}
	wantReceived(t, inQueue(t, ctx, tr, url), 6, 1, 4)
}
