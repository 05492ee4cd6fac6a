package plugin_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
	"github.com/plugbus/plugbus/plugin"
	"github.com/plugbus/plugbus/sdk/sdktest"
)

// waitFor polls cond until it holds or the deadline passes: the plugin
// process's death and restart give no signal the test can wait on.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func processGone(pid int) bool {
	return syscall.Kill(pid, 0) == syscall.ESRCH
}

func TestChecksumMismatchRefusedBeforeExec(t *testing.T) {
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	bin := filepath.Join(dir, "evil")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\ntouch "+marker+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := plugin.Load(bin, plugin.WithSHA256(bins.aroundSum))
	var ce *plugin.ChecksumError
	if !errors.As(err, &ce) || !errors.Is(err, plugin.ErrChecksum) || ce.Want != bins.aroundSum {
		t.Fatalf("got %v, want a *plugin.ChecksumError", err)
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Fatal("the binary ran despite the checksum mismatch")
	}
	if _, err := plugin.Load(bin); !errors.Is(err, plugin.ErrNotPinned) {
		t.Fatalf("unpinned load: got %v, want ErrNotPinned", err)
	}
}

func TestDescribeAndStop(t *testing.T) {
	p, err := plugin.Load(bins.before, plugin.WithSHA256(bins.beforeSum), plugin.WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	d := p.Describe()
	if d.Name != "scenario" || d.Version != "v1.2.3" || d.ProtocolVersion != 1 || d.SHA256 != bins.beforeSum ||
		len(d.Stages) != 1 || d.Stages[0] != (plugin.ImplementedStage{Stage: bus.StageIncoming, BeforeOnly: true}) {
		t.Fatalf("description %+v", d)
	}
	pid := p.PID()
	b, err := bus.New(bus.WithEndpoint("svc"), bus.WithMiddleware(p), bus.WithLogger(testLogger(t)),
		bus.WithHandler(func(context.Context, Ping, bus.Attributes) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Deliver(ctx, delivery(t, Ping{}, nil)); err != nil {
		t.Fatal(err)
	}
	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if !processGone(pid) || p.PID() != 0 {
		t.Fatalf("plugin process %d still runs after the bus stopped", pid)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestManifest(t *testing.T) {
	dir := t.TempDir()
	link := filepath.Join(dir, "scen")
	if err := os.Symlink(bins.around, link); err != nil {
		t.Fatal(err)
	}
	mpath := filepath.Join(dir, "plugins.json")
	write := func(s string) {
		if err := os.WriteFile(mpath, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"plugins": [{"path": "scen", "config": {"scenario": "error"}, "failure_policy": "fail-open", "invocation_timeout": "3s"}]}`)
	if _, err := plugin.LoadManifest(mpath); err == nil || !strings.Contains(err.Error(), "plugbus plugin lock") {
		t.Fatalf("unlocked manifest: got %v, want a refusal naming plugbus plugin lock", err)
	}
	m, err := plugin.LockManifest(mpath)
	if err != nil {
		t.Fatal(err)
	}
	if m.Plugins[0].SHA256 != bins.aroundSum {
		t.Fatalf("locked %s, want %s", m.Plugins[0].SHA256, bins.aroundSum)
	}
	ps, err := plugin.LoadManifest(mpath, plugin.WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer ps.Close()
	b, err := bus.New(bus.WithEndpoint("svc"), bus.WithMiddleware(ps.Bus()...), bus.WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Deliver(context.Background(), delivery(t, Ping{}, nil)); err == nil || !strings.Contains(err.Error(), "scenario: rejected") {
		t.Fatalf("got %v, want the configured scenario's error", err)
	}

	for _, bad := range []string{
		`{"plugins": [{"path": ""}]}`,
		`{"plugins": [{"path": "scen", "failure_policy": "sometimes"}]}`,
		`{"plugins": [{"path": "scen", "invocation_timeout": "soon"}]}`,
		`{"plugins": [{"path": "scen", "sha256": "abc"}]}`,
		`{"plugin": []}`,
	} {
		write(bad)
		var me *plugin.ManifestError
		if _, err := plugin.LoadManifest(mpath); !errors.As(err, &me) {
			t.Errorf("%s: got %v, want a *plugin.ManifestError", bad, err)
		}
	}
}

// killMidStream runs messages through a bus on the memory transport while
// the plugin process is killed, and returns the ids the handler saw.
func killMidStream(t *testing.T, p *plugin.Plugin) (handled map[string]int) {
	t.Helper()
	var mu sync.Mutex
	handled = map[string]int{}
	b, err := bus.New(bus.WithEndpoint("svc"), bus.WithMiddleware(p), bus.WithLogger(testLogger(t)), bus.WithMaxAttempts(1000),
		bus.WithConcurrency(4),
		bus.WithHandler(func(_ context.Context, m Ping, a bus.Attributes) error {
			mu.Lock()
			defer mu.Unlock()
			handled[a.MessageID]++
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	const n = 200
	pid := p.PID()
	for i := range n {
		if err := b.Send(ctx, Ping{N: i}); err != nil {
			t.Fatal(err)
		}
		if i == n/4 {
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitFor(t, "every message handled", func() bool { mu.Lock(); defer mu.Unlock(); return len(handled) == n })
	waitFor(t, "the plugin restarted", func() bool { return p.PID() != 0 && p.PID() != pid })
	if err := b.Send(ctx, Ping{N: n}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a message after the restart", func() bool { mu.Lock(); defer mu.Unlock(); return len(handled) == n+1 })
	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if !processGone(pid) {
		t.Errorf("killed process %d not reaped", pid)
	}
	return handled
}

func TestKilledFailClosed(t *testing.T) {
	eachPath(t, func(t *testing.T, path plugin.Option) {
		p := load(t, "pass", path, plugin.WithBackoff(bus.Backoff{Initial: 50 * time.Millisecond, Max: time.Second}))
		killMidStream(t, p)
		s := p.Stats()
		if s.Crashes != 1 || s.Restarts != 1 || s.Skipped != 0 {
			t.Fatalf("stats %+v, want one crash, one restart, no skip", s)
		}
		t.Logf("stats %+v", s)
	})
}

func TestKilledFailOpen(t *testing.T) {
	// The restart is held until the deliveries below were made while the
	// process is down: however late the test runs, the process is not back
	// (after its 300ms) to handle one of them.
	rec, logger := newRecorder(t)
	hold := holdFailure{logger.Handler(), make(chan struct{})}
	release := sync.OnceFunc(func() { close(hold.release) })
	p := load(t, "pass", plugin.WithLogger(slog.New(hold)), plugin.WithFailurePolicy(plugin.FailOpen), plugin.WithRestartDelay(300*time.Millisecond))
	t.Cleanup(release) // before the plugin closes: its watcher may be held
	b, err := bus.New(bus.WithEndpoint("svc"), bus.WithMiddleware(p), bus.WithLogger(testLogger(t)),
		bus.WithHandler(func(context.Context, Ping, bus.Attributes) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	pid := p.PID()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	rec.await(t, msgFailed) // the crash is noticed; its restart is held
	if pid := p.PID(); pid != 0 {
		t.Fatalf("PID %d while the process is down", pid)
	}
	for range 3 {
		if err := b.Deliver(ctx, delivery(t, Ping{}, nil)); err != nil {
			t.Fatalf("fail-open delivery: %v", err)
		}
	}
	if s := p.Stats(); s.Skipped != 3 {
		t.Fatalf("stats %+v, want 3 skipped", s)
	}
	release()
	waitFor(t, "the plugin restarted", func() bool { return p.PID() != 0 })
	if err := b.Deliver(ctx, delivery(t, Ping{}, nil)); err != nil {
		t.Fatal(err)
	}
	if s := p.Stats(); s.Skipped != 3 || s.Restarts != 1 {
		t.Fatalf("stats %+v, want 3 skipped and 1 restart", s)
	}
	// And a whole stream under fail open loses nothing either.
	killMidStream(t, p)
}

func TestInvocationTimeout(t *testing.T) {
	eachPath(t, testInvocationTimeout)
}

func testInvocationTimeout(t *testing.T, path plugin.Option) {
	p := load(t, "hang", path, plugin.WithInvocationTimeout(200*time.Millisecond))
	b, err := bus.New(bus.WithEndpoint("svc"), bus.WithMiddleware(p), bus.WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = b.Deliver(context.Background(), delivery(t, Ping{}, nil))
	var te *plugin.TimeoutError
	if !errors.As(err, &te) || te.Plugin != "scenario" || te.Timeout != 200*time.Millisecond {
		t.Fatalf("got %v, want a *plugin.TimeoutError", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("timeout took %s", d)
	}
	// The host's ctx cancellation reaches the plugin too.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := b.Deliver(ctx, delivery(t, Ping{}, nil)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want context.DeadlineExceeded", err)
	}
	if s := p.Stats(); s.Timeouts != 1 {
		t.Fatalf("stats %+v, want 1 timeout", s)
	}
}

func TestCloseLeavesNoProcess(t *testing.T) {
	p := load(t, "pass")
	pid := p.PID()
	if pid == 0 || processGone(pid) {
		t.Fatal("no plugin process")
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if !processGone(pid) {
		t.Fatalf("process %d survives Close", pid)
	}
	if _, err := p.Instantiate(bus.PluginInfo{}); !errors.Is(err, plugin.ErrClosed) {
		t.Fatalf("Instantiate after Close: %v", err)
	}
}

// A manifest error says "plugin:" once, however deep its cause.
func TestManifestErrorSaysPluginOnce(t *testing.T) {
	mpath := filepath.Join(t.TempDir(), "plugins.json")
	if err := os.WriteFile(mpath, []byte(`{"plugins": [{"path": "x", "failure_policy": "sometimes"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := plugin.ReadManifest(mpath)
	var me *plugin.ManifestError
	if !errors.As(err, &me) || me.Index != 0 || strings.Count(err.Error(), "plugin:") != 1 || !strings.Contains(err.Error(), `unknown failure policy "sometimes"`) {
		t.Fatalf("got %v, want one manifest error for plugins[0] saying plugin: once", err)
	}
}

// Under fail-closed the error says what became of the message: a send
// that was not made (the caller must retry), a received message returned
// for a retry delayed per the retry policy.
func TestFailClosedSaysWhatBecameOfTheMessage(t *testing.T) {
	for _, c := range []struct {
		scenario, want string
		run            func(context.Context, *bus.Bus) error
	}{
		{"mutate", "the message was not sent; the caller must retry the send", func(ctx context.Context, b *bus.Bus) error {
			return b.Send(ctx, Ping{}, bus.To("elsewhere"))
		}},
		{"pass", "the message is returned for retry, delayed per the retry policy", func(ctx context.Context, b *bus.Bus) error {
			return b.Deliver(ctx, delivery(t, Ping{}, nil))
		}},
	} {
		t.Run(c.scenario, func(t *testing.T) {
			p := load(t, c.scenario, plugin.WithRestartDelay(time.Hour))
			b, err := bus.New(bus.WithEndpoint("svc"), bus.WithMiddleware(p), bus.WithLogger(testLogger(t)),
				bus.WithHandler(func(context.Context, Ping, bus.Attributes) error { return nil }))
			if err != nil {
				t.Fatal(err)
			}
			if err := syscall.Kill(p.PID(), syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the crash to be noticed", func() bool { return p.PID() == 0 })
			err = c.run(context.Background(), b)
			if !errors.Is(err, plugin.ErrUnavailable) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an unavailable plugin saying %q", err, c.want)
			}
		})
	}
}

type Out struct{}

func (Out) MessageName() string { return "test.out" }

// A call id names one invocation of the plugin whatever its process: a
// message whose incoming invocation held a context in a process that then
// died names that call as the parent of its later invocations, and the
// restarted process must not take it for one of its own calls (another
// message's, with another message's values).
func TestParentCallOfADeadProcessNamesNoCallOfItsSuccessor(t *testing.T) {
	p := load(t, "who", plugin.WithFailurePolicy(plugin.FailOpen))
	tr := bustest.NewTransport()
	started := map[string]chan struct{}{"A": make(chan struct{}), "B": make(chan struct{})}
	release := map[string]chan struct{}{"A": make(chan struct{}), "B": make(chan struct{})}
	var b *bus.Bus
	b, err := bus.New(bus.WithEndpoint("svc"), bus.WithTransport(tr), bus.WithMiddleware(p), bus.WithLogger(testLogger(t)),
		bus.WithHandler(func(ctx context.Context, _ Ping, a bus.Attributes) error {
			who, _ := a.Value("who")
			close(started[who])
			<-release[who]
			if who == "A" {
				return b.Send(ctx, Out{}, bus.To("elsewhere"))
			}
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	deliver := func(who string) <-chan error {
		d := delivery(t, Ping{}, nil)
		d.Attributes = bus.NewAttributes("id-"+who, "corr-"+who, time.Now(), map[string]string{"who": who}, nil)
		done := make(chan error, 1)
		go func() { done <- b.Deliver(ctx, d) }()
		return done
	}
	doneA := deliver("A") // the first invocation of the first process
	<-started["A"]
	if err := syscall.Kill(p.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the restart", func() bool { return p.Stats().Restarts > 0 })
	doneB := deliver("B") // the first invocation of the new process
	<-started["B"]
	close(release["A"]) // A sends, naming its incoming call as the parent
	<-doneA
	close(release["B"])
	<-doneB
	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	sent := tr.Sent()
	if len(sent) != 1 {
		t.Fatalf("sent %d messages, want A's one", len(sent))
	}
	if who, ok := sent[0].Envelope.Attributes.Value("seen-who"); ok {
		t.Fatalf("message A's send ran in the plugin with a context holding who=%q; want none (its parent call died with its process)", who)
	}
}

// Under fail-closed, an outgoing stage that fails after its next had sent
// the message says so (HandedOn), rather than have the caller send it
// again; one that fails before says it was not sent.
func TestFailClosedOutgoingSaysWhetherTheMessageWasSent(t *testing.T) {
	for _, c := range []struct {
		name      string
		afterNext bool
	}{{"after next", true}, {"before next", false}} {
		t.Run(c.name, func(t *testing.T) {
			mw := bus.Middleware{Name: "slow", Outgoing: func(ctx context.Context, _ *bus.Outgoing, next *bus.OutgoingNext) error {
				var err error
				if c.afterNext {
					err = next.Call(ctx)
				}
				<-ctx.Done() // the host times the invocation out
				return err
			}}
			p := sdktest.Load(t, mw, sdktest.Wire, sdktest.WithHostOptions(plugin.WithInvocationTimeout(100*time.Millisecond)))
			tr := &capture{}
			b, err := bus.New(bus.WithTransport(tr), bus.WithMiddleware(p), bus.WithLogger(testLogger(t)))
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if err := b.Start(ctx); err != nil {
				t.Fatal(err)
			}
			perr := b.Publish(ctx, Ping{N: 1})
			if err := b.Stop(ctx); err != nil {
				t.Fatal(err)
			}
			tr.mu.Lock()
			sent := len(tr.envs)
			tr.mu.Unlock()
			var te *plugin.TimeoutError
			if !errors.As(perr, &te) {
				t.Fatalf("Publish: %v; want a *plugin.TimeoutError", perr)
			}
			wantSent := 0
			if c.afterNext {
				wantSent = 1
			}
			if te.HandedOn != c.afterNext || sent != wantSent || strings.Contains(perr.Error(), "was not sent") == c.afterNext {
				t.Fatalf("HandedOn %v, %d sent, error %q", te.HandedOn, sent, perr)
			}
		})
	}
}
