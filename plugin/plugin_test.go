package plugin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugin"
	"github.com/plugbus/plugbus/plugin/internal/scenarios"
	"go.uber.org/goleak"
)

// Plugin binaries, built once per test binary.
var bins struct {
	around, before, aroundSum, beforeSum string
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "plugbus-plugin-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ctx := context.Background()
	bins.around = filepath.Join(dir, "around")
	bins.before = filepath.Join(dir, "before")
	if bins.aroundSum, err = plugin.Build(ctx, "github.com/plugbus/plugbus/plugin/internal/testplugin/around", bins.around); err == nil {
		bins.beforeSum, err = plugin.Build(ctx, "github.com/plugbus/plugbus/plugin/internal/testplugin/before", bins.before)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := 0
	func() {
		defer os.RemoveAll(dir)
		if code = m.Run(); code == 0 {
			if err := goleak.Find(); err != nil {
				fmt.Fprintln(os.Stderr, "goleak:", err)
				code = 1
			}
		}
	}()
	os.Exit(code)
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(b []byte) (int, error) { w.t.Helper(); w.t.Log(string(b)); return len(b), nil }

func load(t testing.TB, scenario string, opts ...plugin.Option) *plugin.Plugin {
	t.Helper()
	cfg, _ := json.Marshal(map[string]string{"scenario": scenario})
	opts = append([]plugin.Option{plugin.WithSHA256(bins.aroundSum), plugin.WithConfig(cfg), plugin.WithLogger(testLogger(t))}, opts...)
	p, err := plugin.Load(bins.around, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// eachPath runs f once with every invocation on a Call stream of its own,
// and once with every invocation over the process's batching session
// (which, by default, carries those made while others are in flight).
func eachPath(t *testing.T, f func(t *testing.T, path plugin.Option)) {
	t.Run("streams", func(t *testing.T) { f(t, plugin.WithSessionFrom(1<<30)) })
	t.Run("session", func(t *testing.T) { f(t, plugin.WithSessionFrom(1)) })
}

// errHandler is a handler's transient failure.
var errHandler = errors.New("handler failed")

type Ping struct{ N int }

func (Ping) MessageName() string { return "test.ping" }

func delivery(t testing.TB, msg bus.Message, headers bus.Headers) *bus.Delivery {
	body, err := json.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	return &bus.Delivery{Envelope: bus.Envelope{Name: msg.MessageName(), ContentType: "application/json", Body: body,
		Attributes: bus.NewAttributes("id-1", "corr-1", time.Now(), nil, nil), Headers: headers}, Attempt: 1}
}

// outcome is what a scenario did, comparable between in process and out
// of process.
type outcome struct {
	Err          bool
	Is           []string // sentinels matched
	Permanent    bool     // bus.IsPermanent
	Twice        string   // stage/middleware of a NextMisuseError
	Handled      int      // handler runs
	HandlerDL    bool     // the handler saw a deadline within 11s
	Sent         *sentEnvelope
	ErrorMessage string
}

type sentEnvelope struct {
	Values, Sticky, Headers map[string]string
	CorrelationID           string
}

func describe(err error) outcome {
	o := outcome{Err: err != nil, Permanent: bus.IsPermanent(err)}
	for name, s := range map[string]error{"next-twice": bus.ErrNextMisused, "dispatch": bus.ErrHandlerDispatchRejected,
		"panic": bus.ErrPanic, "deadline": context.DeadlineExceeded, "timeout": plugin.ErrTimeout, "unavailable": plugin.ErrUnavailable,
		"permanent": bus.ErrPermanent} {
		if errors.Is(err, s) {
			o.Is = append(o.Is, name)
		}
	}
	slices.Sort(o.Is)
	var twice *bus.NextMisuseError
	if errors.As(err, &twice) {
		o.Twice = fmt.Sprintf("%s/%s/%v", twice.Stage, twice.Middleware, twice.AfterReturn)
	}
	return o
}

// runIncoming delivers one message through a bus using p and reports the
// outcome; the first handler fails with handlerErr unless it is nil.
func runIncoming(t *testing.T, p bus.Plugin, handlerErr error) outcome {
	t.Helper()
	var mu sync.Mutex
	var o outcome
	b, err := bus.New(bus.WithEndpoint("svc"), bus.WithMiddleware(p), bus.WithLogger(testLogger(t)),
		bus.WithHandler(func(ctx context.Context, _ Ping, _ bus.Attributes) error {
			mu.Lock()
			defer mu.Unlock()
			o.Handled++
			if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= 11*time.Second {
				o.HandlerDL = true
			}
			return handlerErr
		}),
		bus.WithHandler(func(context.Context, Ping, bus.Attributes) error {
			mu.Lock()
			defer mu.Unlock()
			o.Handled += 100
			return nil
		}, bus.HandlerName("skipped")))
	if err != nil {
		t.Fatal(err)
	}
	derr := deliverOnce(t, b)
	d := describe(derr)
	mu.Lock()
	d.Handled, d.HandlerDL = o.Handled, o.HandlerDL
	mu.Unlock()
	return d
}

// capture is a transport that records what is sent, to read the finished
// envelope an outgoing middleware produced.
type capture struct {
	bus.Transport
	mu   sync.Mutex
	envs []*bus.Envelope
}

func (c *capture) Send(_ context.Context, env *bus.Envelope, _ string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.envs = append(c.envs, env)
	return nil
}

func (c *capture) Publish(ctx context.Context, env *bus.Envelope) error {
	return c.Send(ctx, env, "")
}

func (c *capture) Close(context.Context) error { return nil }

func runOutgoing(t *testing.T, p bus.Plugin) outcome {
	t.Helper()
	tr := &capture{}
	b, err := bus.New(bus.WithTransport(tr), bus.WithMiddleware(p), bus.WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	perr := b.Publish(ctx, Ping{N: 2}, bus.WithAttribute("drop", "x"), bus.WithAttribute("keep", "y"), bus.WithStickyAttribute("s0", "z"))
	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	o := describe(perr)
	if len(tr.envs) == 1 {
		e := tr.envs[0]
		o.Sent = &sentEnvelope{Values: map[string]string{}, Sticky: map[string]string{}, Headers: e.Headers, CorrelationID: e.Attributes.CorrelationID}
		for k, v := range e.Attributes.Values() {
			o.Sent.Values[k] = v
		}
		for k, v := range e.Attributes.StickyValues() {
			o.Sent.Sticky[k] = v
		}
	}
	return o
}

// TestSemantics runs the same middleware in process and out of process and
// expects identical outcomes.
func TestSemantics(t *testing.T) {
	cases := []struct {
		scenario   string
		handlerErr error
		outgoing   bool
		want       func(t *testing.T, o outcome)
	}{
		{scenario: "pass", want: func(t *testing.T, o outcome) { expect(t, !o.Err && o.Handled == 101, o) }},
		{scenario: "short", want: func(t *testing.T, o outcome) { expect(t, !o.Err && o.Handled == 0, o) }},
		{scenario: "error", want: func(t *testing.T, o outcome) { expect(t, o.Err && o.Handled == 0, o) }},
		{scenario: "catch", handlerErr: errHandler, want: func(t *testing.T, o outcome) { expect(t, !o.Err && o.Handled == 101, o) }},
		{scenario: "after", handlerErr: errHandler, want: func(t *testing.T, o outcome) {
			expect(t, o.Err && o.Handled == 101 && !o.Permanent && slices.Equal(o.Is, []string{"dispatch"}), o)
		}},
		{scenario: "after", handlerErr: bus.Permanent(errHandler), want: func(t *testing.T, o outcome) {
			expect(t, o.Err && o.Handled == 101 && o.Permanent && slices.Equal(o.Is, []string{"dispatch", "permanent"}), o)
		}},
		{scenario: "permanent", want: func(t *testing.T, o outcome) {
			expect(t, o.Err && o.Handled == 0 && o.Permanent && slices.Equal(o.Is, []string{"permanent"}), o)
		}},
		{scenario: "handler-permanent", want: func(t *testing.T, o outcome) {
			expect(t, o.Err && o.Handled == 0 && o.Permanent && slices.Equal(o.Is, []string{"dispatch", "permanent"}), o)
		}},
		{scenario: "drop-permanent", handlerErr: errHandler, want: func(t *testing.T, o outcome) {
			expect(t, o.Err && o.Handled == 101 && !o.Permanent, o)
		}},
		{scenario: "drop-permanent", handlerErr: bus.Permanent(errHandler), want: func(t *testing.T, o outcome) {
			expect(t, !o.Err && o.Handled == 101, o)
		}},
		{scenario: "mark-after", handlerErr: errHandler, want: func(t *testing.T, o outcome) {
			expect(t, o.Err && o.Handled == 101 && o.Permanent && slices.Equal(o.Is, []string{"dispatch", "permanent"}), o)
		}},
		{scenario: "twice", want: func(t *testing.T, o outcome) {
			expect(t, o.Err && o.Handled == 101 && o.Twice == "incoming/scenario/false", o)
		}},
		{scenario: "deadline", want: func(t *testing.T, o outcome) { expect(t, !o.Err && o.Handled == 101 && o.HandlerDL, o) }},
		{scenario: "handler-skip", want: func(t *testing.T, o outcome) { expect(t, !o.Err && o.Handled == 1, o) }},
		{scenario: "panic", want: func(t *testing.T, o outcome) {
			expect(t, o.Err && o.Handled == 0 && len(o.Is) == 1 && o.Is[0] == "panic", o)
		}},
		{scenario: "mutate", outgoing: true, want: func(t *testing.T, o outcome) {
			s := o.Sent
			expect(t, !o.Err && s != nil && s.CorrelationID == "corr-mw" && s.Headers["x-mw"] == "3" &&
				s.Values["mw"] == "1" && s.Values["keep"] == "y" && s.Values["drop"] == "" && len(s.Values) == 2 &&
				s.Sticky["st"] == "2" && s.Sticky["s0"] == "z", o)
		}},
	}
	for _, c := range cases {
		name := c.scenario
		if c.handlerErr != nil {
			name += "/handler-fails"
			if bus.IsPermanent(c.handlerErr) {
				name += "-permanent"
			}
		}
		t.Run(name, func(t *testing.T) {
			run := func(p bus.Plugin) outcome {
				if c.outgoing {
					return runOutgoing(t, p)
				}
				return runIncoming(t, p, c.handlerErr)
			}
			in := run(scenarios.New(c.scenario))
			c.want(t, in)
			eachPath(t, func(t *testing.T, path plugin.Option) {
				out := run(load(t, c.scenario, path))
				c.want(t, out)
				if !reflect.DeepEqual(in, out) {
					t.Errorf("in process %+v\nout of process %+v", in, out)
				}
			})
		})
	}
}

func expect(t *testing.T, ok bool, o outcome) {
	t.Helper()
	if !ok {
		t.Errorf("unexpected outcome %+v", o)
	}
}

// TestErrorCarriesPluginName checks the plugin's own errors come back
// typed with the plugin's name.
func TestErrorCarriesPluginName(t *testing.T) {
	p := load(t, "error")
	b, err := bus.New(bus.WithMiddleware(p), bus.WithEndpoint("svc"), bus.WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	err = b.Deliver(context.Background(), delivery(t, Ping{}, nil))
	var pe *plugin.Error
	if !errors.As(err, &pe) || pe.Plugin != scenarios.Name || pe.Stage != bus.StageIncoming || pe.Message != "scenario: rejected" {
		t.Fatalf("got %v (%T), want a *plugin.Error naming %q", err, err, scenarios.Name)
	}
	if err := b.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestNextShorterDeadline: a middleware that gives next a ctx with a
// shorter deadline gets back what the rest of the chain returned, even when
// that ctx expired while the host was still running the chain.
func TestNextShorterDeadline(t *testing.T) {
	for _, handlerFails := range []bool{false, true} {
		t.Run(fmt.Sprintf("handler-fails=%v", handlerFails), func(t *testing.T) {
			run := func(p bus.Plugin) (outcome, int) {
				var mu sync.Mutex
				handled := 0
				b, err := bus.New(bus.WithEndpoint("svc"), bus.WithMiddleware(p), bus.WithLogger(testLogger(t)),
					bus.WithHandler(func(ctx context.Context, _ Ping, _ bus.Attributes) error {
						mu.Lock()
						handled++
						mu.Unlock()
						dl, ok := ctx.Deadline()
						if !ok || time.Until(dl) > 10*scenarios.ShorterDeadline {
							return errors.New("the handler did not get the shorter deadline")
						}
						<-ctx.Done() // outlive next's ctx, then succeed (or not)
						if handlerFails {
							return ctx.Err()
						}
						return nil
					}))
				if err != nil {
					t.Fatal(err)
				}
				derr := deliverOnce(t, b)
				o := describe(derr)
				if derr != nil {
					o.ErrorMessage = derr.Error()
				}
				mu.Lock()
				defer mu.Unlock()
				return o, handled
			}
			in, inHandled := run(scenarios.New("shorter"))
			out, outHandled := run(load(t, "shorter"))
			if in.Err != handlerFails || inHandled != 1 {
				t.Fatalf("in process: %+v, handled %d", in, inHandled)
			}
			if !reflect.DeepEqual(in, out) || inHandled != outHandled {
				t.Errorf("in process %+v (handled %d)\nout of process %+v (handled %d)", in, inHandled, out, outHandled)
			}
		})
	}
}

// deliverOnce starts b, delivers Ping{N: 1} to it, stops it and returns
// what Deliver returned.
func deliverOnce(t *testing.T, b *bus.Bus) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	err := b.Deliver(ctx, delivery(t, Ping{N: 1}, nil))
	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	return err
}

// TestConcurrentInvocationsEachAnswered: many invocations in flight at
// once (batched over the session by default) each get their own answer:
// every message is handled once with its own body, and each failing one
// gets its own error.
func TestConcurrentInvocationsEachAnswered(t *testing.T) {
	for _, scenario := range []string{"pass", "error"} {
		t.Run(scenario, func(t *testing.T) {
			p := load(t, scenario)
			var (
				mu      sync.Mutex
				handled = map[int]int{}
			)
			b, err := bus.New(bus.WithEndpoint("svc"), bus.WithMiddleware(p), bus.WithLogger(testLogger(t)),
				bus.WithHandler(func(_ context.Context, m Ping, _ bus.Attributes) error {
					mu.Lock()
					handled[m.N]++
					mu.Unlock()
					return nil
				}))
			if err != nil {
				t.Fatal(err)
			}
			defer b.Stop(context.Background())
			const workers, each = 32, 25
			errs := make(chan error, workers*each)
			var wg sync.WaitGroup
			for w := range workers {
				wg.Go(func() {
					for i := range each {
						errs <- b.Deliver(context.Background(), delivery(t, Ping{N: w*each + i}, nil))
					}
				})
			}
			wg.Wait()
			close(errs)
			failed := 0
			for err := range errs {
				if err != nil {
					var pe *plugin.Error
					if !errors.As(err, &pe) || pe.Plugin != "scenario" {
						t.Fatalf("got %v, want the plugin's own *plugin.Error", err)
					}
					failed++
				}
			}
			switch scenario {
			case "pass":
				if failed != 0 || len(handled) != workers*each {
					t.Fatalf("%d failed, %d distinct handled, want 0 and %d", failed, len(handled), workers*each)
				}
				for n, c := range handled {
					if c != 1 {
						t.Fatalf("message %d handled %d times", n, c)
					}
				}
			case "error":
				if failed != workers*each || len(handled) != 0 {
					t.Fatalf("%d failed, %d handled, want %d and 0", failed, len(handled), workers*each)
				}
			}
			if s := p.Stats(); s.Invocations != workers*each || s.Crashes != 0 {
				t.Fatalf("stats %+v, want %d invocations and no crash", s, workers*each)
			}
		})
	}
}

// TestStringsNotUTF8FailTheInvocationAlone: protobuf strings must be
// valid UTF-8. A message the host cannot encode for the plugin (a header
// that is not), or changes the plugin cannot encode for the host, fail
// that invocation alone and permanently, so that the bus dead-letters the
// message with the reason; an error text that is not valid UTF-8 crosses
// with U+FFFD in place. The process is not taken for failed, and the next
// message passes.
func TestStringsNotUTF8FailTheInvocationAlone(t *testing.T) {
	ctx := context.Background()
	eachPath(t, func(t *testing.T, path plugin.Option) {
		t.Run("incoming header", func(t *testing.T) {
			p := load(t, "pass", path)
			handled := 0
			b, err := bus.New(bus.WithEndpoint("svc"), bus.WithMiddleware(p), bus.WithLogger(testLogger(t)),
				bus.WithHandler(func(context.Context, Ping, bus.Attributes) error { handled++; return nil }))
			if err != nil {
				t.Fatal(err)
			}
			defer b.Stop(ctx)
			err = b.Deliver(ctx, delivery(t, Ping{}, bus.Headers{"x-h": "a\xffb"}))
			if !errors.Is(err, plugin.ErrNotEncodable) || !bus.IsPermanent(err) {
				t.Fatalf("got %v, want a permanent plugin.ErrNotEncodable", err)
			}
			if err := b.Deliver(ctx, delivery(t, Ping{}, nil)); err != nil || handled != 1 {
				t.Fatalf("the next message: %v, handled %d, want nil and 1", err, handled)
			}
			if s := p.Stats(); s.Crashes != 0 || s.Restarts != 0 {
				t.Fatalf("stats %+v: the process was taken for failed", s)
			}
		})
		t.Run("plugin's error text", func(t *testing.T) {
			p := load(t, "bad-utf8", path)
			b, err := bus.New(bus.WithEndpoint("svc"), bus.WithMiddleware(p), bus.WithLogger(testLogger(t)),
				bus.WithHandler(func(context.Context, Ping, bus.Attributes) error { return nil }))
			if err != nil {
				t.Fatal(err)
			}
			defer b.Stop(ctx)
			for range 2 {
				var pe *plugin.Error
				err := b.Deliver(ctx, delivery(t, Ping{}, nil))
				if !errors.As(err, &pe) || pe.Message != "refused \uFFFD here" {
					t.Fatalf("got %v, want the plugin's error with U+FFFD in place", err)
				}
			}
			if s := p.Stats(); s.Crashes != 0 {
				t.Fatalf("stats %+v: the process was taken for failed", s)
			}
		})
		for _, bin := range []string{"around", "before"} {
			t.Run("plugin's header/"+bin, func(t *testing.T) {
				cfg, _ := json.Marshal(map[string]string{"scenario": "bad-utf8"})
				file, sum := bins.around, bins.aroundSum
				if bin == "before" {
					file, sum = bins.before, bins.beforeSum
				}
				p, err := plugin.Load(file, plugin.WithSHA256(sum), plugin.WithConfig(cfg), plugin.WithLogger(testLogger(t)), path)
				if err != nil {
					t.Fatal(err)
				}
				defer p.Close()
				tr := &capture{}
				b, err := bus.New(bus.WithTransport(tr), bus.WithMiddleware(p), bus.WithLogger(testLogger(t)))
				if err != nil {
					t.Fatal(err)
				}
				if err := b.Start(ctx); err != nil {
					t.Fatal(err)
				}
				defer b.Stop(ctx)
				for range 2 {
					err := b.Publish(ctx, Ping{N: 1})
					if err == nil || !bus.IsPermanent(err) || !strings.Contains(err.Error(), "cannot be sent to the host") {
						t.Fatalf("got %v, want a permanent failure saying the changes cannot be sent", err)
					}
				}
				if len(tr.envs) != 0 {
					t.Fatalf("%d messages sent, want none", len(tr.envs))
				}
				if s := p.Stats(); s.Crashes != 0 {
					t.Fatalf("stats %+v: the process was taken for failed", s)
				}
			})
		}
	})
}

// TestLargeMessagesCross: messages of a few MiB cross to the plugin and
// back, one at a time and several at once (a batch of them past gRPC's
// default 4 MiB limit on a received message).
func TestLargeMessagesCross(t *testing.T) {
	eachPath(t, func(t *testing.T, path plugin.Option) {
		p := load(t, "pass", path)
		handled := make(chan int, 16)
		b, err := bus.New(bus.WithEndpoint("svc"), bus.WithMiddleware(p), bus.WithLogger(testLogger(t)),
			bus.WithHandler(func(_ context.Context, m Ping, _ bus.Attributes) error { handled <- m.N; return nil }))
		if err != nil {
			t.Fatal(err)
		}
		defer b.Stop(context.Background())
		large := func(n, size int) *bus.Delivery {
			d := delivery(t, Ping{N: n}, nil)
			d.Body = []byte(fmt.Sprintf(`{"N":%d,"pad":"%s"}`, n, strings.Repeat("x", size)))
			return d
		}
		if err := b.Deliver(context.Background(), large(1, 5<<20)); err != nil {
			t.Fatalf("one message of 5 MiB: %v", err)
		}
		errs := make(chan error, 8)
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() { errs <- b.Deliver(context.Background(), large(10+i, 3<<19)) })
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("8 messages of 1.5 MiB at once: %v", err)
			}
		}
		if len(handled) != 9 {
			t.Fatalf("%d handled, want 9", len(handled))
		}
		if s := p.Stats(); s.Crashes != 0 {
			t.Fatalf("stats %+v: the process was taken for failed", s)
		}
	})
}
