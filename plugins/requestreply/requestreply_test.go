package requestreply_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
	"github.com/plugbus/plugbus/plugins/requestreply"
	"github.com/plugbus/plugbus/transports/memory"
)

// httpTransport is shared by the SQS tests' AWS clients, so that TestMain
// can close its idle connections before looking for leaked goroutines.
var httpTransport = &http.Transport{MaxIdleConns: 128, MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second}

func TestMain(m *testing.M) {
	code := m.Run()
	httpTransport.CloseIdleConnections()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			slog.Error("goroutines leaked", slog.Any("error", err))
			code = 1
		}
	}
	os.Exit(code)
}

func memoryTransports() func(testing.TB) bus.Transport {
	broker := memory.NewBroker()
	return func(testing.TB) bus.Transport { return memory.New(memory.WithBroker(broker)) }
}

func TestMemory(t *testing.T) { runScenarios(t, memoryTransports()) }

// pair is one responder and one requester on a memory broker.
func pair(t *testing.T, opts ...requestreply.Option) (responder, requester *bus.Bus, p *requestreply.Plugin, release chan struct{}) {
	t.Helper()
	newT := memoryTransports()
	release = make(chan struct{})
	quiet := slog.New(slog.DiscardHandler)
	responder = start(t, requestreply.New(), bus.WithEndpoint("calc"), bus.WithTransport(newT(t)), bus.WithLogger(quiet),
		bus.WithHandler(func(ctx context.Context, m add, _ bus.Attributes) error {
			return requestreply.Reply(ctx, sum{Seq: m.Seq, Value: m.A + m.B})
		}),
		bus.WithHandler(func(ctx context.Context, m slow, _ bus.Attributes) error {
			<-release
			return requestreply.Reply(ctx, sum{Seq: m.Seq})
		}),
		bus.WithHandler(func(ctx context.Context, m lookup, _ bus.Attributes) error {
			return requestreply.Reply(ctx, lookup{Key: "wrong type"})
		}),
	)
	p = requestreply.New(opts...)
	requester = start(t, p, bus.WithTransport(newT(t)), bus.WithLogger(quiet), bus.WithRoute("calc", add{}, slow{}, lookup{}))
	t.Cleanup(func() { // before the buses stop: a handler still waiting would hold up Stop
		select {
		case <-release:
		default:
			close(release)
		}
	})
	return responder, requester, p, release
}

func TestPointerResponseAndRoute(t *testing.T) {
	_, rb, p, _ := pair(t)
	got, err := requestreply.Request[*sum](t.Context(), rb, add{A: 2, B: 3}) // routed by bus.WithRoute
	if err != nil || got == nil || got.Value != 5 {
		t.Fatalf("Request[*sum] = %+v, %v", got, err)
	}
	if st := p.Stats(rb); st.Pending != 0 || st.Address == "" {
		t.Fatalf("Stats = %+v", st)
	}
}

func TestNotStarted(t *testing.T) {
	b, err := bus.New(bus.WithMiddleware(requestreply.New()), bus.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := requestreply.Request[sum](t.Context(), b, add{}, requestreply.To("calc")); !errors.Is(err, bus.ErrNotStarted) {
		t.Fatalf("Request on a bus not started: %v", err)
	}
}

func TestPendingLimit(t *testing.T) {
	_, rb, p, release := pair(t, requestreply.WithMaxPending(1))
	first := make(chan error, 1)
	go func() {
		_, err := requestreply.Request[sum](t.Context(), rb, slow{Seq: 1})
		first <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for p.Stats(rb).Pending != 1 { // no signal to wait for: poll briefly
		if time.Now().After(deadline) {
			t.Fatal("first request never became pending")
		}
		time.Sleep(time.Millisecond)
	}
	_, err := requestreply.Request[sum](t.Context(), rb, add{})
	var pe *requestreply.PendingLimitError
	if !errors.As(err, &pe) || pe.Limit != 1 || !errors.Is(err, requestreply.ErrTooManyPending) {
		t.Fatalf("request beyond the limit: %v", err)
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if _, err := requestreply.Request[sum](t.Context(), rb, add{A: 1}); err != nil {
		t.Fatalf("request after the table emptied: %v", err)
	}
}

func TestDefaultTimeout(t *testing.T) {
	_, rb, p, _ := pair(t, requestreply.WithDefaultTimeout(100*time.Millisecond))
	if _, err := requestreply.Request[sum](context.Background(), rb, slow{}); !errors.Is(err, requestreply.ErrTimeout) {
		t.Fatalf("Request without a deadline: %v, want the default timeout", err)
	}
	if n := p.Stats(rb).Pending; n != 0 {
		t.Fatalf("%d pending", n)
	}
}

// The default timeout is the caller's when its context has no deadline,
// whatever deadline an outgoing middleware outside the plugin gives the
// send alone: the wait for the reply still ends.
func TestDefaultTimeoutDespiteASendDeadline(t *testing.T) {
	newT := memoryTransports()
	quiet := slog.New(slog.DiscardHandler)
	start(t, nil, bus.WithEndpoint("calc"), bus.WithTransport(newT(t)), bus.WithLogger(quiet),
		bus.WithHandler(func(context.Context, add, bus.Attributes) error { return nil })) // never replies
	sendDeadline := bus.Middleware{Name: "send-deadline", Outgoing: func(ctx context.Context, _ *bus.Outgoing, next *bus.OutgoingNext) error {
		ctx, cancel := context.WithTimeout(ctx, time.Hour)
		defer cancel()
		return next.Call(ctx)
	}}
	rb := start(t, requestreply.New(requestreply.WithDefaultTimeout(50*time.Millisecond)), bus.WithTransport(newT(t)), bus.WithLogger(quiet),
		bus.WithMiddleware(sendDeadline), bus.WithRoute("calc", add{}))
	done := make(chan error, 1)
	go func() {
		_, err := requestreply.Request[sum](context.Background(), rb, add{})
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, requestreply.ErrTimeout) {
			t.Fatalf("Request without a deadline: %v, want the default timeout", err)
		}
	case <-time.After(10 * time.Second): // the test's bound; the request's is 50ms
		t.Fatal("Request without a deadline still waits 10s later: the default timeout of 50ms did not end the wait")
	}
}

func TestStopEndsPendingRequests(t *testing.T) {
	_, rb, p, _ := pair(t)
	done := make(chan error, 1)
	go func() {
		_, err := requestreply.Request[sum](t.Context(), rb, slow{})
		done <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); p.Stats(rb).Pending != 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("request never became pending")
		}
	}
	if err := rb.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, bus.ErrClosed) {
		t.Fatalf("Request when its bus stopped: %v, want bus.ErrClosed", err)
	}
	if _, err := requestreply.Request[sum](t.Context(), rb, add{}); !errors.Is(err, bus.ErrNotStarted) {
		t.Fatalf("Request on a stopped bus: %v", err)
	}
}

func TestReplyOfAnotherType(t *testing.T) {
	_, rb, _, _ := pair(t)
	_, err := requestreply.Request[sum](t.Context(), rb, lookup{})
	var rte *requestreply.ReplyTypeError
	if !errors.As(err, &rte) || rte.Got != "rrtest.lookup" || rte.Want != "rrtest.sum" {
		t.Fatalf("reply of another type: %v", err)
	}
}

func TestMisuse(t *testing.T) {
	if err := requestreply.Reply(t.Context(), sum{}); !errors.Is(err, requestreply.ErrNoHandlerContext) {
		t.Errorf("Reply outside a handler: %v", err)
	}
	newT := memoryTransports()
	quiet := slog.New(slog.DiscardHandler)
	replyErr := make(chan error, 1)
	self := start(t, requestreply.New(), bus.WithEndpoint("self"), bus.WithTransport(newT(t)), bus.WithLogger(quiet),
		bus.WithHandler(func(ctx context.Context, m add, _ bus.Attributes) error {
			replyErr <- requestreply.Reply(ctx, sum{}) // m was sent with bus.Send
			return nil
		}))
	if err := self.Send(t.Context(), add{}); err != nil {
		t.Fatal(err)
	}
	if err := <-replyErr; !errors.Is(err, requestreply.ErrNotRequest) {
		t.Errorf("Reply to a message that is not a request: %v", err)
	}
	plain := start(t, nil, bus.WithTransport(newT(t)), bus.WithLogger(quiet))
	if _, err := requestreply.Request[sum](t.Context(), plain, never{}, requestreply.To("self")); !errors.Is(err, requestreply.ErrNoPlugin) {
		t.Errorf("Request on a bus without the plugin: %v", err)
	}
	if _, err := bus.New(bus.WithMiddleware(requestreply.New(requestreply.WithMaxPending(0)))); err == nil {
		t.Error("WithMaxPending(0) accepted")
	}
}

// A handler can send a request and wait for its reply: the request goes
// out at once, not when the handler returns.
func TestRequestFromAHandler(t *testing.T) {
	newT := memoryTransports()
	quiet := slog.New(slog.DiscardHandler)
	start(t, requestreply.New(), bus.WithEndpoint("calc"), bus.WithTransport(newT(t)), bus.WithLogger(quiet),
		bus.WithHandler(func(ctx context.Context, m add, _ bus.Attributes) error {
			return requestreply.Reply(ctx, sum{Seq: m.Seq, Value: m.A + m.B})
		}))
	got := make(chan sum, 1)
	var front *bus.Bus
	front = start(t, requestreply.New(), bus.WithEndpoint("front"), bus.WithTransport(newT(t)), bus.WithLogger(quiet),
		bus.WithHandler(func(ctx context.Context, m lookup, _ bus.Attributes) error {
			s, err := requestreply.Request[sum](ctx, front, add{A: 20, B: 22}, requestreply.To("calc"))
			if err != nil {
				return err
			}
			got <- s
			return nil
		}))
	if err := front.Send(t.Context(), lookup{Key: "k"}); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-got:
		if s.Value != 42 {
			t.Fatalf("reply %+v", s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no reply reached the handler that asked")
	}
}

// A handler waiting for a reply when its bus starts stopping gets
// bus.ErrClosed at once, so Stop does not wait for the request's timeout.
func TestStopReleasesAHandlerWaitingForAReply(t *testing.T) {
	newT := memoryTransports()
	quiet := slog.New(slog.DiscardHandler)
	release := make(chan struct{})
	start(t, requestreply.New(), bus.WithEndpoint("calc"), bus.WithTransport(newT(t)), bus.WithLogger(quiet),
		bus.WithHandler(func(ctx context.Context, m slow, _ bus.Attributes) error {
			<-release // never answers while the test runs
			return requestreply.Reply(ctx, sum{})
		}))
	t.Cleanup(func() { close(release) }) // runs before calc stops
	p := requestreply.New()
	waiting := make(chan error, 1)
	var front *bus.Bus
	front = start(t, p, bus.WithEndpoint("front"), bus.WithTransport(newT(t)), bus.WithLogger(quiet),
		bus.WithHandler(func(ctx context.Context, m lookup, _ bus.Attributes) error {
			_, err := requestreply.Request[sum](ctx, front, slow{}, requestreply.To("calc"), requestreply.WithTimeout(time.Hour))
			waiting <- err
			return nil
		}))
	if err := front.Send(t.Context(), lookup{}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); p.Stats(front).Pending != 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) { // the plugin gives no signal for "pending": poll its stats
			t.Fatal("request never became pending")
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := front.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v (a handler waiting for a reply held it up)", err)
	}
	if err := <-waiting; !errors.Is(err, bus.ErrClosed) {
		t.Fatalf("Request when its bus stopped: %v, want bus.ErrClosed", err)
	}
}

// misnamed's MessageName reads a field its zero value lacks.
type misnamed struct{ names []string }

func (m misnamed) MessageName() string { return m.names[0] }

// A request bus.Send would refuse — nil, a nil pointer whose type's
// MessageName has a value receiver, a MessageName that panics — fails
// with bus.ErrInvalidMessage, as bus.Send fails, before anything is sent
// or waited for, on a running bus or not, rather than panic in the caller.
func TestRequestRefusesAnInvalidMessageBeforeSending(t *testing.T) {
	rec := bustest.NewTransport()
	p := requestreply.New()
	rb := start(t, p, bus.WithTransport(rec), bus.WithLogger(slog.New(slog.DiscardHandler)), bus.WithRoute("calc", add{}, misnamed{names: []string{"rrtest.misnamed"}}))
	stopped, err := bus.New(bus.WithMiddleware(requestreply.New()), bus.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	for name, req := range map[string]bus.Message{"nil": nil, "a nil *add": (*add)(nil), "a MessageName that panics": misnamed{}} {
		for bname, b := range map[string]*bus.Bus{"running": rb, "not started": stopped} {
			err := func() (err error) {
				defer func() {
					if p := recover(); p != nil {
						err = fmt.Errorf("panicked: %v", p)
					}
				}()
				_, err = requestreply.Request[sum](t.Context(), b, req, requestreply.WithTimeout(time.Minute))
				return err
			}()
			if !errors.Is(err, bus.ErrInvalidMessage) {
				t.Errorf("Request of %s on a bus %s: %v, want bus.ErrInvalidMessage", name, bname, err)
			}
		}
	}
	if sent := rec.Sent(); len(sent) != 0 {
		t.Errorf("sent %d messages, want none", len(sent))
	}
	if st := p.Stats(rb); st.Pending != 0 {
		t.Errorf("%d requests pending, want none", st.Pending)
	}
}

// A handler that replies to a message sent without a reply address (a
// bus.Send, or a Request from a bus without the plugin) and returns the
// error: no retry can give the message a reply address, so it is
// dead-lettered on its first attempt with ErrNotRequest's reason, rather
// than retried through the whole policy (33 deliveries over 7 minutes by
// default; 3 here).
func TestReplyToANonRequestIsDeadLetteredAtOnce(t *testing.T) {
	tr := bustest.NewTransport()
	b := bustest.Start(t, bus.WithEndpoint("calc"), bus.WithTransport(tr), bus.WithLogger(slog.New(slog.DiscardHandler)), bus.WithMaxAttempts(3),
		bus.WithHandler(func(ctx context.Context, m add, _ bus.Attributes) error {
			return requestreply.Reply(ctx, sum{Value: m.A + m.B})
		}))
	if err := b.Send(t.Context(), add{A: 1, B: 2}); err != nil {
		t.Fatal(err)
	}
	if err := tr.WaitIdle(t.Context()); err != nil {
		t.Fatal(err)
	}
	settled := tr.Settled()
	if len(settled) != 1 || settled[0].Outcome != bustest.DeadLettered || settled[0].Attempt != 1 ||
		!strings.Contains(settled[0].Failure.Reason, "not a request (no reply address)") {
		var got []string
		for _, s := range settled {
			got = append(got, fmt.Sprintf("attempt %d %s %q", s.Attempt, s.Outcome, s.Failure.Reason))
		}
		t.Fatalf("settled %q; want the message dead-lettered on its first attempt, naming the missing reply address", got)
	}
}

// A negative WithTimeout (a time.Until of a deadline already past) is
// refused before anything is sent; it was ignored, and the request waited
// the plugin's default timeout instead.
func TestNegativeTimeoutIsRefused(t *testing.T) {
	tr := bustest.NewTransport()
	b := bustest.Start(t, bus.WithTransport(tr), bus.WithLogger(slog.New(slog.DiscardHandler)),
		bus.WithMiddleware(requestreply.New(requestreply.WithDefaultTimeout(200*time.Millisecond))))
	_, err := requestreply.Request[sum](t.Context(), b, add{A: 1}, requestreply.To("calc"), requestreply.WithTimeout(-time.Second))
	if err == nil || !strings.Contains(err.Error(), "WithTimeout(-1s): the timeout must be positive") {
		t.Fatalf("Request with WithTimeout(-1s): %v; want it refused", err)
	}
	if sent := tr.Sent(); len(sent) != 0 {
		t.Fatalf("%d messages sent; want none", len(sent))
	}
}
