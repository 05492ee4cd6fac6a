// Package transporttest is the conformance suite every plugbus transport
// passes. A transport's own test calls [Run] with a [Factory] of its
// transports and the [Features] it claims; for the memory transport
// (the example of Run defines deadLettersOf):
//
//	func TestConformance(t *testing.T) {
//		broker := memory.NewBroker()
//		factory := func(testing.TB) bus.Transport { return memory.New(memory.WithBroker(broker)) }
//		transporttest.Run(t, factory, transporttest.Features{Ordered: true, DeadLetters: deadLettersOf(broker)})
//	}
//
// The suite talks to the transport directly, as the bus does: Setup,
// Send, Publish, Receive, then exactly one of Delete, Return or Fail.
package transporttest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
)

// Features tells the suite what the transport under test offers.
type Features struct {
	// Ordered is true when one receiver sees the messages of one sender in
	// the order they were sent.
	Ordered bool
	// ReservedHeader is a header name the transport reserves; the suite
	// checks that sending it fails with bus.ErrHeaderReserved. Empty skips.
	ReservedHeader string
	// DeadLetters returns the messages endpoint dead-lettered, waiting
	// until there are at least n or ctx ends. Required.
	DeadLetters func(ctx context.Context, t testing.TB, endpoint string, n int) []bus.DeadLetter
	// Timeout bounds each wait of the suite. The default is 30s.
	Timeout time.Duration
	// Quiet is how long the suite waits to conclude that no further message
	// arrives (a deleted message is not seen again). The default is 300ms.
	Quiet time.Duration
	// Messages is the number of messages of the concurrency test. The
	// default is 5000.
	Messages int
	// DelayUnit is the shortest delay a [bus.Delayer] carries faithfully
	// (its precision): the delay tests scale their delays, and the outage
	// test its outage and its retry policy, by it. The default is 10ms.
	DelayUnit time.Duration
	// RandomFailures is the number of messages of the test whose handler
	// fails at random one time in five. The default is 10,000.
	RandomFailures int
	// DurableDelays is true when a delayed message lives in the broker,
	// not in the process that delayed it: the suite then kills such a
	// process with SIGKILL during a delay, in a child process of the test
	// binary, and expects the message after the delay.
	DurableDelays bool
	// DeadLetterManager is true when the transport implements
	// bus.DeadLetterManager: the suite then lists, filters, counts,
	// replays (also interrupted midway) and deletes dead letters through
	// it, and checks that each of those operations refuses an endpoint that
	// does not exist (bus.ErrUnknownEndpoint), a replay to one included
	// (and, from a bus.DestinationChecker, a check of one).
	DeadLetterManager bool
	// Batch is true when the transport implements bus.Batcher: the suite
	// checks its SendBatch (and fails when the transport lacks it).
	Batch bool
}

// Factory returns a fresh transport of the kind under test. Transports
// returned by one Factory share a broker: what one sends another
// receives.
type Factory func(t testing.TB) bus.Transport

// Run runs the conformance suite on transports made by newTransport.
func Run(t *testing.T, newTransport Factory, f Features) {
	if f.DeadLetters == nil {
		t.Fatal("transporttest: Features.DeadLetters is required")
	}
	if f.Timeout == 0 {
		f.Timeout = 30 * time.Second
	}
	if f.Quiet == 0 {
		f.Quiet = 300 * time.Millisecond
	}
	if f.Messages == 0 {
		f.Messages = 5000
	}
	if f.RandomFailures == 0 {
		f.RandomFailures = 10_000
	}
	if f.DelayUnit == 0 {
		f.DelayUnit = 10 * time.Millisecond
	}
	s := &suite{newTransport: newTransport, f: f}
	t.Run("SendPreservesEnvelope", s.sendPreservesEnvelope)
	t.Run("PublishFansOut", s.publishFansOut)
	t.Run("PublishOnlyToSubscribers", s.publishOnlyToSubscribers)
	t.Run("ReturnRedelivers", s.returnRedelivers)
	t.Run("FailDeadLetters", s.failDeadLetters)
	t.Run("CompetingConsumers", s.competingConsumers)
	t.Run("Concurrent", s.concurrent)
	t.Run("CloseWhileReceiving", s.closeWhileReceiving)
	t.Run("SenderClosedAfterSending", s.senderClosed)
	t.Run("ConcurrentClose", s.concurrentClose)
	t.Run("CompetingReceiverLeaves", s.competingReceiverLeaves)
	t.Run("ContextCancellation", s.contextCancellation)
	t.Run("SetupIdempotent", s.setupIdempotent)
	t.Run("UnhandledNameDeadLettered", s.unhandledDeadLettered)
	if f.ReservedHeader != "" {
		t.Run("ReservedHeaderRefused", s.reservedHeader)
	}
	if f.DeadLetterManager {
		t.Run("DeadLettersListedFilteredDeleted", s.deadLettersFiltered)
		t.Run("DeadLetterReplayKeepsIDAndHistory", s.deadLetterReplayed)
		t.Run("DeadLetterReplayedToAnotherEndpoint", s.deadLetterReplayedElsewhere)
		t.Run("InterruptedBulkReplayLosesAndDoublesNothing", s.interruptedReplay)
		t.Run("DeadLetterOperationsOnUnknownEndpointRefused", s.unknownEndpointRefused)
		t.Run("DeadLetterReplayToUnknownEndpointKeepsIt", s.replayToUnknownEndpoint)
	}
	probe := newTransport(t)
	_, instances := probe.(bus.InstanceQueuer)
	_, delays := probe.(bus.Delayer)
	_ = probe.Close(context.Background())
	if delays { // a transport that carries delays carries the retry history too
		t.Run("FailKeepsRetryHistory", s.failKeepsHistory)
		t.Run("ReturnAfterDelays", s.returnAfterDelays)
		t.Run("ReturnAfterHasNoHeadOfLineBlocking", s.noHeadOfLine)
		t.Run("OutageLosesNothing", s.outageLosesNothing)
		t.Run("RandomFailuresLoseNothing", s.randomFailuresLoseNothing)
		if f.DurableDelays {
			t.Run("DelayedMessageSurvivesKill9OfItsConsumer", s.delayedSurvivesKill)
		}
		// Scheduling is carried by the same mechanism (docs/scheduling.md).
		t.Run("ScheduledSendNoneEarly", s.scheduledSendNoneEarly)
		t.Run("ScheduledPublishReachesEachSubscriberOnce", s.scheduledPublishOncePerSubscriber)
		t.Run("ScheduledSurvivesTransportRestart", s.scheduledSurvivesTransportRestart)
	}
	if f.Batch {
		t.Run("BatchDeliversEach", s.batchDeliversEach)
		t.Run("BatchFailsAlone", s.batchFailsAlone)
		t.Run("BatchAfterClose", s.batchAfterClose)
		if delays {
			t.Run("BatchHonoursDue", s.batchHonoursDue)
		}
	}
	if instances {
		t.Run("InstanceQueue", s.instanceQueue)
	}
	if _, ok := probe.(bus.InstanceReceiver); ok && instances {
		t.Run("InstanceQueueBesideBusyWorkers", s.instanceBesideBusyWorkers)
	}
	if f.Ordered {
		t.Run("Ordered", s.ordered)
		t.Run("CloseKeepsOrder", s.closeKeepsOrder)
	}
}

type suite struct {
	newTransport Factory
	f            Features
}

// Name is a unique name for an endpoint or message of one test.
func Name(prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return prefix + "-" + hex.EncodeToString(b[:])
}

func (s *suite) ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), s.f.Timeout)
	t.Cleanup(cancel)
	return ctx
}

// open returns a transport set up as endpoint handling names, closed at cleanup.
func (s *suite) open(t *testing.T, endpoint string, names ...string) bus.Transport {
	t.Helper()
	tr := s.newTransport(t)
	ctx := s.ctx(t)
	if err := tr.Setup(ctx, bus.Topology{Endpoint: endpoint, Handles: names, MaxAttempts: 5, Concurrency: 8}); err != nil {
		t.Fatalf("Setup(%s): %v", endpoint, err)
	}
	t.Cleanup(func() { _ = tr.Close(context.Background()) })
	return tr
}

func envelope(name string, body string) *bus.Envelope {
	id := Name("id")
	return &bus.Envelope{
		Name: name, ContentType: "application/json", Body: []byte(body),
		Attributes: bus.NewAttributes(id, "corr-"+id, time.Now().UTC().Truncate(time.Millisecond), nil, nil),
	}
}

func (s *suite) receive(t *testing.T, tr bus.Transport) *bus.Delivery {
	t.Helper()
	d, err := tr.Receive(s.ctx(t))
	if err != nil {
		t.Fatalf("Receive: %v", err)
	}
	return d
}

// expectNothing asserts that no message arrives within the quiet period.
func (s *suite) expectNothing(t *testing.T, tr bus.Transport) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), s.f.Quiet)
	defer cancel()
	d, err := tr.Receive(ctx)
	if err == nil {
		t.Fatalf("unexpected delivery of %s (id %s, attempt %d)", d.Name, d.Attributes.MessageID, d.Attempt)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Receive with an expiring context: %v, want context.DeadlineExceeded", err)
	}
}

func (s *suite) sendPreservesEnvelope(t *testing.T) {
	ep, name := Name("tt-env"), Name("tt.msg")
	tr := s.open(t, ep, name)
	ctx := s.ctx(t)
	sent := time.Now().UTC().Truncate(time.Millisecond)
	env := &bus.Envelope{
		Name: name, ContentType: "application/json", Body: []byte(`{"n":1,"s":"é\u0000x"}`),
		Attributes: bus.NewAttributes("id-1", "corr-1", sent,
			map[string]string{"one": "1", "empty": ""}, map[string]string{"tenant": "acme"}),
		Headers: bus.Headers{"x-custom": "v1", "x-other": "with space"},
	}
	if err := tr.Send(ctx, env, ep); err != nil {
		t.Fatalf("Send: %v", err)
	}
	d := s.receive(t, tr)
	if d.Err != nil {
		t.Fatalf("delivery error: %v", d.Err)
	}
	if d.Name != name || string(d.Body) != string(env.Body) || d.ContentType != "application/json" {
		t.Errorf("got name %q body %q content type %q", d.Name, d.Body, d.ContentType)
	}
	a := d.Attributes
	if a.MessageID != "id-1" || a.CorrelationID != "corr-1" || !a.SentAt.Equal(sent) {
		t.Errorf("attributes: id %q corr %q sentAt %v, want id-1 corr-1 %v", a.MessageID, a.CorrelationID, a.SentAt, sent)
	}
	if v, _ := a.Value("one"); v != "1" {
		t.Errorf("one-hop attribute one = %q", v)
	}
	if v, ok := a.Value("empty"); !ok || v != "" {
		t.Errorf("one-hop attribute empty = %q, %v", v, ok)
	}
	if v, _ := a.StickyValue("tenant"); v != "acme" {
		t.Errorf("sticky attribute tenant = %q", v)
	}
	for k, want := range env.Headers {
		if got := d.Headers[k]; got != want {
			t.Errorf("header %s = %q, want %q", k, got, want)
		}
	}
	if d.Attempt != 1 {
		t.Errorf("attempt = %d, want 1", d.Attempt)
	}
	if err := tr.Delete(ctx, d); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	s.expectNothing(t, tr)
}

func (s *suite) publishFansOut(t *testing.T) {
	name := Name("tt.evt")
	a := s.open(t, Name("tt-fan-a"), name)
	b := s.open(t, Name("tt-fan-b"), name)
	ctx := s.ctx(t)
	env := envelope(name, `{}`)
	env.Headers = bus.Headers{"x-h": "1"}
	if err := a.Publish(ctx, env); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	for _, tr := range []bus.Transport{a, b} {
		d := s.receive(t, tr)
		if d.Attributes.MessageID != env.Attributes.MessageID || d.Headers["x-h"] != "1" {
			t.Errorf("got id %s headers %v", d.Attributes.MessageID, d.Headers)
		}
		if err := tr.Delete(ctx, d); err != nil {
			t.Fatal(err)
		}
		s.expectNothing(t, tr)
	}
}

func (s *suite) publishOnlyToSubscribers(t *testing.T) {
	wanted, other := Name("tt.wanted"), Name("tt.other")
	tr := s.open(t, Name("tt-sub"), wanted)
	_ = s.open(t, Name("tt-sub-other"), other)
	ctx := s.ctx(t)
	if err := tr.Publish(ctx, envelope(other, `{}`)); err != nil {
		t.Fatal(err)
	}
	env := envelope(wanted, `{}`)
	if err := tr.Publish(ctx, env); err != nil {
		t.Fatal(err)
	}
	d := s.receive(t, tr)
	if d.Name != wanted {
		t.Fatalf("received %s, subscribed only to %s", d.Name, wanted)
	}
	if err := tr.Delete(ctx, d); err != nil {
		t.Fatal(err)
	}
	s.expectNothing(t, tr)
}

func (s *suite) returnRedelivers(t *testing.T) {
	ep, name := Name("tt-ret"), Name("tt.msg")
	tr := s.open(t, ep, name)
	ctx := s.ctx(t)
	env := envelope(name, `{"retry":true}`)
	env.Headers = bus.Headers{"x-kept": "yes"}
	if err := tr.Send(ctx, env, ep); err != nil {
		t.Fatal(err)
	}
	for attempt := 1; attempt <= 3; attempt++ {
		d := s.receive(t, tr)
		if d.Attempt != attempt {
			t.Fatalf("attempt = %d, want %d", d.Attempt, attempt)
		}
		if d.Attributes.MessageID != env.Attributes.MessageID || string(d.Body) != `{"retry":true}` || d.Headers["x-kept"] != "yes" {
			t.Fatalf("redelivery %d changed the message: id %s body %s headers %v", attempt, d.Attributes.MessageID, d.Body, d.Headers)
		}
		if attempt == 3 {
			if err := tr.Delete(ctx, d); err != nil {
				t.Fatal(err)
			}
			break
		}
		if err := tr.Return(ctx, d, errors.New("try again")); err != nil {
			t.Fatalf("Return: %v", err)
		}
	}
	s.expectNothing(t, tr)
}

func (s *suite) failDeadLetters(t *testing.T) {
	ep, name := Name("tt-dlq"), Name("tt.msg")
	tr := s.open(t, ep, name)
	ctx := s.ctx(t)
	env := envelope(name, `{"poison":1}`)
	env.Headers = bus.Headers{"x-kept": "yes"}
	if err := tr.Send(ctx, env, ep); err != nil {
		t.Fatal(err)
	}
	d := s.receive(t, tr)
	at := time.Now().UTC().Truncate(time.Second)
	if err := tr.Fail(ctx, d, bus.Failure{Reason: "boom: cannot process", Attempts: 1, Endpoint: ep, Time: at}); err != nil {
		t.Fatalf("Fail: %v", err)
	}
	s.expectNothing(t, tr)
	dl := s.f.DeadLetters(ctx, t, ep, 1)
	if len(dl) != 1 {
		t.Fatalf("dead letters = %d, want 1", len(dl))
	}
	got := dl[0]
	if got.Envelope.Attributes.MessageID != env.Attributes.MessageID || string(got.Envelope.Body) != `{"poison":1}` || got.Envelope.Name != name {
		t.Errorf("dead letter envelope: %+v", got.Envelope)
	}
	if got.Failure.Reason != "boom: cannot process" || got.Failure.Attempts != 1 || got.Failure.Endpoint != ep || !got.Failure.Time.Equal(at) {
		t.Errorf("dead letter failure: %+v", got.Failure)
	}
	if got.Envelope.Headers["x-kept"] != "yes" || got.Envelope.Attributes.CorrelationID != env.Attributes.CorrelationID {
		t.Errorf("dead letter lost headers or attributes: headers %v correlation %q", got.Envelope.Headers, got.Envelope.Attributes.CorrelationID)
	}
}

func (s *suite) competingConsumers(t *testing.T) {
	ep, name := Name("tt-compete"), Name("tt.msg")
	a := s.open(t, ep, name)
	b := s.open(t, ep, name)
	ctx := s.ctx(t)
	const n = 20
	for i := range n {
		if err := a.Send(ctx, envelope(name, strconv.Itoa(i)), ep); err != nil {
			t.Fatal(err)
		}
	}
	seen := s.drain(t, []bus.Transport{a, b}, n)
	if len(seen) != n {
		t.Fatalf("received %d distinct messages, want %d", len(seen), n)
	}
}

// drain receives want messages on the transports concurrently, deleting
// each, and fails on a message seen twice.
func (s *suite) drain(t *testing.T, trs []bus.Transport, want int) map[string]int {
	t.Helper()
	ctx, cancel := context.WithCancel(s.ctx(t))
	defer cancel()
	var mu sync.Mutex
	seen := map[string]int{}
	var dup []string
	var wg sync.WaitGroup
	for _, tr := range trs {
		for range 4 {
			wg.Go(func() {
				for {
					d, err := tr.Receive(ctx)
					if err != nil {
						return
					}
					id := d.Attributes.MessageID
					mu.Lock()
					seen[id]++
					if seen[id] > 1 {
						dup = append(dup, id)
					}
					done := len(seen) >= want
					mu.Unlock()
					if err := tr.Delete(context.Background(), d); err != nil {
						t.Errorf("Delete: %v", err)
					}
					if done {
						cancel()
					}
				}
			})
		}
	}
	wg.Wait()
	if len(dup) > 0 {
		t.Fatalf("%d messages delivered twice although deleted, e.g. %s", len(dup), dup[0])
	}
	if len(seen) < want {
		t.Fatalf("received %d of %d messages before the timeout", len(seen), want)
	}
	for _, tr := range trs {
		s.expectNothing(t, tr)
	}
	return seen
}

func (s *suite) concurrent(t *testing.T) {
	ep, name := Name("tt-conc"), Name("tt.msg")
	tr := s.open(t, ep, name)
	sender := s.newTransport(t)
	t.Cleanup(func() { _ = sender.Close(context.Background()) })
	ctx := s.ctx(t)
	n := s.f.Messages
	const senders = 8
	ids := make(chan string, n)
	var wg sync.WaitGroup
	for w := range senders {
		wg.Go(func() {
			for i := w; i < n; i += senders {
				env := envelope(name, strconv.Itoa(i))
				if err := sender.Send(ctx, env, ep); err != nil {
					t.Errorf("Send %d: %v", i, err)
					return
				}
				ids <- env.Attributes.MessageID
			}
		})
	}
	seen := s.drain(t, []bus.Transport{tr}, n)
	wg.Wait()
	close(ids)
	for id := range ids {
		if seen[id] != 1 {
			t.Fatalf("message %s received %d times", id, seen[id])
		}
	}
}

func (s *suite) closeWhileReceiving(t *testing.T) {
	ep, name := Name("tt-close"), Name("tt.msg")
	tr := s.newTransport(t)
	ctx := s.ctx(t)
	if err := tr.Setup(ctx, bus.Topology{Endpoint: ep, Handles: []string{name}, MaxAttempts: 5, Concurrency: 2}); err != nil {
		t.Fatal(err)
	}
	env := envelope(name, `{}`)
	if err := tr.Send(ctx, env, ep); err != nil {
		t.Fatal(err)
	}
	inflight := s.receive(t, tr) // received, not settled before Close
	errs := make(chan error, 1)
	go func() {
		_, err := tr.Receive(ctx) // blocks: nothing else queued
		errs <- err
	}()
	if err := tr.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case err := <-errs:
		if err == nil {
			t.Fatal("Receive returned a message after Close")
		}
	case <-ctx.Done():
		t.Fatal("Receive still blocked after Close")
	}
	if _, err := tr.Receive(ctx); err == nil {
		t.Fatal("Receive on a closed transport returned a message")
	}
	if err := tr.Delete(ctx, inflight); !errors.Is(err, bus.ErrClosed) {
		t.Fatalf("Delete after Close: %v, want an error wrapping bus.ErrClosed (the message was given back)", err)
	}
	// The unsettled delivery is not lost: another transport gets it.
	next := s.open(t, ep, name)
	d := s.receive(t, next)
	if d.Attributes.MessageID != env.Attributes.MessageID {
		t.Fatalf("after close got %s, want the in-flight %s", d.Attributes.MessageID, env.Attributes.MessageID)
	}
	if err := next.Delete(ctx, d); err != nil {
		t.Fatal(err)
	}
}

func (s *suite) contextCancellation(t *testing.T) {
	ep, name := Name("tt-ctx"), Name("tt.msg")
	tr := s.open(t, ep, name)
	ctx, cancel := context.WithCancel(t.Context())
	errs := make(chan error, 1)
	go func() {
		_, err := tr.Receive(ctx)
		errs <- err
	}()
	cancel()
	select {
	case err := <-errs:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Receive after cancel: %v, want context.Canceled", err)
		}
	case <-time.After(s.f.Timeout):
		t.Fatal("Receive ignored its context")
	}
	if err := tr.Send(ctx, envelope(name, `{}`), ep); err == nil {
		t.Fatal("Send with a cancelled context succeeded")
	}
	s.expectNothing(t, tr)
}

func (s *suite) setupIdempotent(t *testing.T) {
	ep, name := Name("tt-idem"), Name("tt.msg")
	tr := s.open(t, ep, name)
	ctx := s.ctx(t)
	if err := tr.Setup(ctx, bus.Topology{Endpoint: ep, Handles: []string{name}, MaxAttempts: 5, Concurrency: 8}); err != nil {
		t.Fatalf("second Setup: %v", err)
	}
	if err := tr.Publish(ctx, envelope(name, `{}`)); err != nil {
		t.Fatal(err)
	}
	d := s.receive(t, tr)
	if err := tr.Delete(ctx, d); err != nil {
		t.Fatal(err)
	}
	s.expectNothing(t, tr) // subscribed once, not twice
}

func (s *suite) reservedHeader(t *testing.T) {
	ep, name := Name("tt-res"), Name("tt.msg")
	tr := s.open(t, ep, name)
	ctx := s.ctx(t)
	env := envelope(name, `{}`)
	env.Headers = bus.Headers{s.f.ReservedHeader: "x"}
	err := tr.Send(ctx, env, ep)
	var hr *bus.HeaderReservedError
	if !errors.Is(err, bus.ErrHeaderReserved) || !errors.As(err, &hr) || hr.Header != s.f.ReservedHeader {
		t.Fatalf("Send with reserved header %q: %v, want a *bus.HeaderReservedError", s.f.ReservedHeader, err)
	}
	if hv, ok := tr.(bus.HeaderValidator); ok {
		if err := hv.ValidateHeaders(env.Headers); !errors.Is(err, bus.ErrHeaderReserved) {
			t.Fatalf("ValidateHeaders: %v, want bus.ErrHeaderReserved", err)
		}
	}
	s.expectNothing(t, tr)
}

func (s *suite) ordered(t *testing.T) {
	ep, name := Name("tt-order"), Name("tt.msg")
	tr := s.open(t, ep, name)
	ctx := s.ctx(t)
	const n = 200
	for i := range n {
		if err := tr.Send(ctx, envelope(name, strconv.Itoa(i)), ep); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		d := s.receive(t, tr)
		if string(d.Body) != strconv.Itoa(i) {
			t.Fatalf("message %d arrived as %s", i, d.Body)
		}
		if err := tr.Delete(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
}

// senderClosed checks that messages sent before the sender closed are all
// delivered, and that a closed sender refuses to send.
func (s *suite) senderClosed(t *testing.T) {
	ep, name := Name("tt-sclose"), Name("tt.msg")
	tr := s.open(t, ep, name)
	sender := s.newTransport(t)
	ctx := s.ctx(t)
	const n = 50
	for i := range n {
		if err := sender.Send(ctx, envelope(name, strconv.Itoa(i)), ep); err != nil {
			t.Fatal(err)
		}
	}
	if err := sender.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := sender.Send(ctx, envelope(name, "late"), ep); err == nil {
		t.Fatal("Send on a closed transport succeeded")
	}
	s.drain(t, []bus.Transport{tr}, n)
}

// concurrentClose closes several receiving transports at once.
func (s *suite) concurrentClose(t *testing.T) {
	ep, name := Name("tt-cclose"), Name("tt.msg")
	ctx := s.ctx(t)
	var trs []bus.Transport
	for range 4 {
		tr := s.newTransport(t)
		if err := tr.Setup(ctx, bus.Topology{Endpoint: ep, Handles: []string{name}, MaxAttempts: 5, Concurrency: 2}); err != nil {
			t.Fatal(err)
		}
		trs = append(trs, tr)
	}
	var receivers, closers sync.WaitGroup
	for _, tr := range trs {
		receivers.Go(func() {
			for {
				if _, err := tr.Receive(ctx); err != nil {
					return
				}
			}
		})
	}
	for _, tr := range trs {
		closers.Go(func() {
			if err := tr.Close(context.Background()); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
	}
	closers.Wait()
	done := make(chan struct{})
	go func() { receivers.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("receivers still blocked after their transports closed")
	}
}

// instanceQueue checks that a message sent to one instance's address
// reaches that instance only, although several share the endpoint, and that
// an instance without an endpoint receives too.
func (s *suite) instanceQueue(t *testing.T) {
	ep, name := Name("tt-inst"), Name("tt.msg")
	ctx := s.ctx(t)
	open := func(endpoint string) bus.Transport {
		tr := s.newTransport(t)
		topo := bus.Topology{Endpoint: endpoint, Handles: []string{name}, MaxAttempts: 5, Concurrency: 2, Instance: true}
		if endpoint == "" {
			topo.Handles = nil
		}
		if err := tr.Setup(ctx, topo); err != nil {
			t.Fatalf("Setup with an instance queue: %v", err)
		}
		t.Cleanup(func() { _ = tr.Close(context.Background()) })
		return tr
	}
	a, b, lone := open(ep), open(ep), open("")
	addrs := map[string]bool{}
	for _, tr := range []bus.Transport{a, b, lone} {
		addr := tr.(bus.InstanceQueuer).InstanceAddress()
		if addr == "" || addrs[addr] {
			t.Fatalf("instance address %q empty or shared", addr)
		}
		addrs[addr] = true
	}
	for _, tr := range []bus.Transport{a, b, lone} {
		env := envelope(name, `{"to":"`+tr.(bus.InstanceQueuer).InstanceAddress()+`"}`)
		if err := a.Send(ctx, env, tr.(bus.InstanceQueuer).InstanceAddress()); err != nil {
			t.Fatalf("Send to an instance: %v", err)
		}
		d := s.receive(t, tr)
		if d.Attributes.MessageID != env.Attributes.MessageID {
			t.Fatalf("instance received %s, want %s", d.Attributes.MessageID, env.Attributes.MessageID)
		}
		if err := tr.Delete(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	for _, tr := range []bus.Transport{a, b, lone} {
		s.expectNothing(t, tr)
	}
	// Return of an instance-queue message redelivers it to the same
	// instance with its attempt raised; Fail settles it for good.
	for _, tr := range []bus.Transport{a, lone} {
		addr := tr.(bus.InstanceQueuer).InstanceAddress()
		env := envelope(name, `{"to":"`+addr+`","settle":"return"}`)
		if err := a.Send(ctx, env, addr); err != nil {
			t.Fatalf("Send to an instance: %v", err)
		}
		d := s.receive(t, tr)
		if err := tr.Return(ctx, d, errors.New("transporttest: returned")); err != nil {
			t.Fatalf("Return of an instance-queue message: %v", err)
		}
		d = s.receive(t, tr)
		if d.Attributes.MessageID != env.Attributes.MessageID || d.Attempt != 2 {
			t.Fatalf("after Return the instance received %s at attempt %d, want %s at attempt 2", d.Attributes.MessageID, d.Attempt, env.Attributes.MessageID)
		}
		if err := tr.Fail(ctx, d, bus.Failure{Reason: "transporttest: failed", Attempts: 2, Endpoint: ep}); err != nil {
			t.Fatalf("Fail of an instance-queue message: %v", err)
		}
		s.expectNothing(t, tr)
		if tr == a { // with an endpoint: in the endpoint's dead-letter queue
			found := false
			for _, dl := range s.f.DeadLetters(ctx, t, ep, 1) {
				found = found || dl.Envelope.Attributes.MessageID == env.Attributes.MessageID
			}
			if !found {
				t.Fatalf("an instance-queue message failed on an instance of %s is not in its dead-letter queue", ep)
			}
		}
	}
	s.expectNothing(t, b)
}

// competingReceiverLeaves checks that a message arriving while one of two
// instances of an endpoint stops (its receivers give up, then it closes, as
// a bus does at Stop) reaches the other instance.
func (s *suite) competingReceiverLeaves(t *testing.T) {
	ep, name := Name("tt-leave"), Name("tt.msg")
	b := s.open(t, ep, name)
	ctx := s.ctx(t)
	for trial := range 5 {
		a := s.open(t, ep, name)
		actx, cancel := context.WithCancel(ctx)
		aDone := make(chan *bus.Delivery, 1)
		go func() {
			d, _ := a.Receive(actx)
			aDone <- d
		}()
		bGot := make(chan *bus.Delivery, 1)
		go func() {
			d, _ := b.Receive(ctx)
			bGot <- d
		}()
		env := envelope(name, strconv.Itoa(trial))
		if err := a.Send(ctx, env, ep); err != nil {
			t.Fatal(err)
		}
		cancel()
		if d := <-aDone; d != nil { // a was faster: it handles that one; send b another
			if err := a.Delete(ctx, d); err != nil {
				t.Fatal(err)
			}
			if err := a.Send(ctx, envelope(name, "again"), ep); err != nil {
				t.Fatal(err)
			}
		}
		if err := a.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		select {
		case d := <-bGot:
			if d == nil {
				t.Fatal("Receive failed")
			}
			if err := b.Delete(ctx, d); err != nil {
				t.Fatal(err)
			}
		case <-ctx.Done():
			t.Fatalf("trial %d: the message did not reach the remaining instance", trial)
		}
	}
	s.expectNothing(t, b)
}

// closeKeepsOrder checks that messages in flight when a transport closes
// come back ahead of the rest, in their order.
func (s *suite) closeKeepsOrder(t *testing.T) {
	ep, name := Name("tt-corder"), Name("tt.msg")
	ctx := s.ctx(t)
	tr := s.newTransport(t)
	if err := tr.Setup(ctx, bus.Topology{Endpoint: ep, Handles: []string{name}, MaxAttempts: 5, Concurrency: 1}); err != nil {
		t.Fatal(err)
	}
	const n = 6
	for i := range n {
		if err := tr.Send(ctx, envelope(name, strconv.Itoa(i)), ep); err != nil {
			t.Fatal(err)
		}
	}
	_ = s.receive(t, tr) // in flight, never settled
	if err := tr.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	next := s.open(t, ep, name)
	for i := range n {
		d := s.receive(t, next)
		if string(d.Body) != strconv.Itoa(i) {
			t.Fatalf("after close message %d arrived as %s", i, d.Body)
		}
		if err := next.Delete(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
}

// unhandledDeadLettered runs a bus on the transport and puts on its
// endpoint's queue, as a foreign publisher would, a message of a name none
// of its handlers handles: the bus dead-letters it on its first delivery,
// with a reason naming the message, the endpoint and the missing handler,
// and the transport keeps that reason.
func (s *suite) unhandledDeadLettered(t *testing.T) {
	ep, unknown := Name("tt-unhandled"), Name("tt.unknown")
	tr := s.newTransport(t)
	b, err := bus.New(bus.WithEndpoint(ep), bus.WithTransport(tr), bus.WithLogger(slog.New(slog.DiscardHandler)),
		bus.WithHandler(func(context.Context, busyWork, bus.Attributes) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	ctx := s.ctx(t)
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := b.Stop(context.Background()); err != nil {
			t.Errorf("Stop: %v", err)
		}
	}()
	sender := s.newTransport(t)
	t.Cleanup(func() { _ = sender.Close(context.Background()) })
	env := envelope(unknown, `{"for":"nobody"}`)
	if err := sender.Send(ctx, env, ep); err != nil {
		t.Fatal(err)
	}
	var got *bus.DeadLetter
	for _, dl := range s.f.DeadLetters(ctx, t, ep, 1) {
		if dl.Envelope.Attributes.MessageID == env.Attributes.MessageID {
			got = &dl
		}
	}
	if got == nil {
		t.Fatalf("the message of unhandled name %s is not in %s's dead-letter queue", unknown, ep)
	}
	if got.Failure.Attempts != 1 || got.Envelope.Name != unknown || string(got.Envelope.Body) != `{"for":"nobody"}` {
		t.Errorf("dead letter %s after %d attempt(s) with body %s, want %s after 1 (no retries) with its body", got.Envelope.Name, got.Failure.Attempts, got.Envelope.Body, unknown)
	}
	for _, want := range []string{strconv.Quote(unknown), strconv.Quote(ep), "no handler"} {
		if !strings.Contains(got.Failure.Reason, want) {
			t.Errorf("dead letter reason %q does not say %s", got.Failure.Reason, want)
		}
	}
}

type busyWork struct{}

// MessageName implements bus.Message.
func (busyWork) MessageName() string { return "transporttest.busy_work" }

type busyReply struct{}

// MessageName implements bus.Message.
func (busyReply) MessageName() string { return "transporttest.busy_reply" }

// instanceBesideBusyWorkers runs a bus whose only worker is a handler
// waiting for a message sent to its own instance queue (a reply): the bus
// reads the instance queue with a loop of its own (bus.InstanceReceiver),
// so the message arrives.
func (s *suite) instanceBesideBusyWorkers(t *testing.T) {
	tr := s.newTransport(t)
	addr := func() string { return tr.(bus.InstanceQueuer).InstanceAddress() }
	replies := make(chan string, 1)
	resolver := bus.Middleware{Name: "replies", InstanceQueue: true,
		Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
			if in.Name() == (busyReply{}).MessageName() {
				replies <- in.Attributes().MessageID
				return nil // resolved without handlers
			}
			return next.Call(ctx)
		}}
	got := make(chan string, 1)
	b, err := bus.New(bus.WithEndpoint(Name("tt-busy")), bus.WithTransport(tr), bus.WithConcurrency(1),
		bus.WithLogger(slog.New(slog.DiscardHandler)), bus.WithMiddleware(resolver),
		bus.WithHandler(func(ctx context.Context, _ busyWork, _ bus.Attributes) error {
			b, _, _ := bus.MessageContext(ctx)
			if err := b.Send(ctx, busyReply{}, bus.To(addr()), bus.Immediately(), bus.WithMessageID("reply-1")); err != nil {
				return err
			}
			select { // the bus's only worker waits here
			case id := <-replies:
				got <- id
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := s.ctx(t)
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := b.Stop(context.Background()); err != nil {
			t.Errorf("Stop: %v", err)
		}
	}()
	if err := b.Send(ctx, busyWork{}); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-got:
		if id != "reply-1" {
			t.Fatalf("the handler got %s, want reply-1", id)
		}
	case <-ctx.Done():
		t.Fatal("the message to the instance never reached the handler waiting for it")
	}
}
