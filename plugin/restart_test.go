package plugin_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugin"
	"github.com/plugbus/plugbus/plugin/internal/scenarios"
)

// recorder is a log handler that hands every record to a channel (and to
// the test log), for tests to wait on the plugin's lifecycle events.
type recorder struct {
	ch   chan slog.Record
	next slog.Handler
}

func newRecorder(t *testing.T) (*recorder, *slog.Logger) {
	r := &recorder{ch: make(chan slog.Record, 1024), next: testLogger(t).Handler()}
	return r, slog.New(r)
}

func (r *recorder) Enabled(ctx context.Context, l slog.Level) bool { return r.next.Enabled(ctx, l) }

func (r *recorder) Handle(ctx context.Context, rec slog.Record) error {
	select {
	case r.ch <- rec.Clone():
	default:
	}
	return r.next.Handle(ctx, rec)
}

func (r *recorder) WithAttrs(as []slog.Attr) slog.Handler {
	return &recorder{ch: r.ch, next: r.next.WithAttrs(as)}
}

func (r *recorder) WithGroup(name string) slog.Handler {
	return &recorder{ch: r.ch, next: r.next.WithGroup(name)}
}

// await returns the next record with one of the given messages.
func (r *recorder) await(t *testing.T, msgs ...string) slog.Record {
	t.Helper()
	return r.awaitRecord(t, fmt.Sprintf("a log record %q", msgs), func(rec slog.Record) bool { return slices.Contains(msgs, rec.Message) })
}

// awaitText returns the next record whose message contains text.
func (r *recorder) awaitText(t *testing.T, text string) slog.Record {
	t.Helper()
	return r.awaitRecord(t, fmt.Sprintf("a log record containing %q", text), func(rec slog.Record) bool { return strings.Contains(rec.Message, text) })
}

// awaitRecord returns the next record for which match holds.
func (r *recorder) awaitRecord(t *testing.T, what string, match func(slog.Record) bool) slog.Record {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case rec := <-r.ch:
			if match(rec) {
				return rec
			}
		case <-timeout:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func attr(rec slog.Record, key string) (v slog.Value) {
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value
			return false
		}
		return true
	})
	return v
}

const (
	msgFailed    = "plugin process failed; restarting it"
	msgRestarted = "plugin restarted"
	msgIdle      = "plugin process stopped: no bus uses it"
)

// restartBackoff is the back-off of the crash loop tests.
var restartBackoff = bus.Backoff{Initial: 40 * time.Millisecond, Max: 10 * time.Second}

// crashLoop kills the plugin's process as soon as it runs, n times, and
// returns the restart number (the back-off's retry number), the back-off
// before each restart and the time each restart took.
func crashLoop(t *testing.T, stableUptime time.Duration, n int) (restarts []int, backoffs, took []time.Duration) {
	rec, logger := newRecorder(t)
	p := load(t, "pass", plugin.WithLogger(logger), plugin.WithBackoff(restartBackoff), plugin.WithStableUptime(stableUptime))
	for range n {
		if err := syscall.Kill(p.PID(), syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		failed := rec.await(t, msgFailed)
		restarted := rec.await(t, msgRestarted)
		if pid := attr(restarted, "pid").Int64(); pid == 0 || int(pid) != p.PID() {
			t.Fatalf("restarted pid %d, PID() %d", pid, p.PID())
		}
		backoff := time.Duration(-1) // when not logged
		if v := attr(failed, "backoff"); v.Kind() == slog.KindDuration {
			backoff = v.Duration()
		}
		backoffs = append(backoffs, backoff)
		restarts = append(restarts, int(attr(failed, "restart").Int64()))
		took = append(took, restarted.Time.Sub(failed.Time))
	}
	if s := p.Stats(); s.Crashes != uint64(n) || s.Restarts != uint64(n) {
		t.Errorf("stats %+v, want %d crashes and restarts", s, n)
	}
	return restarts, backoffs, took
}

// TestRestartBackoff: a process that dies soon after starting is restarted
// after a delay of the back-off whose retry number grows each time (its
// ceiling doubles); one that stayed up long enough is restarted as the
// first retry again. Each restart waits the delay it logged.
func TestRestartBackoff(t *testing.T) {
	for _, c := range []struct {
		name   string
		stable time.Duration // the uptime after which the delay resets
		want   []int         // restart numbers
	}{
		{"crash loop backs off further", time.Hour, []int{1, 2, 3, 4}},
		{"resets after stable uptime", time.Nanosecond, []int{1, 1, 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			restarts, backoffs, took := crashLoop(t, c.stable, len(c.want))
			if !slices.Equal(restarts, c.want) {
				t.Errorf("logged restart numbers %v, want %v", restarts, c.want)
			}
			for i, n := range restarts {
				if ceiling := restartBackoff.Ceiling(n); backoffs[i] < 0 || backoffs[i] > ceiling {
					t.Errorf("restart %d logged back-off %s, want within [0, %s]", i+1, backoffs[i], ceiling)
				}
				if took[i] < backoffs[i] {
					t.Errorf("restart %d took %s, want at least its back-off %s", i+1, took[i], backoffs[i])
				}
			}
		})
	}
}

// holdFailure is a log handler that holds the plugin's watcher in its
// log of a failed process, once the record is handled, until release is
// closed: what the test does meanwhile happens before the restart's
// back-off begins, however late the test runs (a back-off running
// meanwhile could end, and the restart complete, first).
type holdFailure struct {
	slog.Handler
	release chan struct{}
}

func (h holdFailure) Handle(ctx context.Context, rec slog.Record) error {
	err := h.Handler.Handle(ctx, rec)
	if rec.Message == msgFailed {
		<-h.release
	}
	return err
}

func (h holdFailure) WithAttrs(as []slog.Attr) slog.Handler {
	return holdFailure{h.Handler.WithAttrs(as), h.release}
}

func (h holdFailure) WithGroup(name string) slog.Handler {
	return holdFailure{h.Handler.WithGroup(name), h.release}
}

// TestStopLastBusDuringRestart: stopping the last bus while the process is
// being restarted leaves no process running.
func TestStopLastBusDuringRestart(t *testing.T) {
	rec, logger := newRecorder(t)
	hold := holdFailure{logger.Handler(), make(chan struct{})}
	release := sync.OnceFunc(func() { close(hold.release) })
	p := load(t, "pass", plugin.WithLogger(slog.New(hold)), plugin.WithRestartDelay(300*time.Millisecond))
	t.Cleanup(release) // before the plugin closes: its watcher may be held
	newBus := func() *bus.Bus {
		b, err := bus.New(bus.WithEndpoint("svc"), bus.WithMiddleware(p), bus.WithLogger(testLogger(t)),
			bus.WithHandler(func(context.Context, Ping, bus.Attributes) error { return nil }))
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		return b
	}
	b := newBus()
	if err := syscall.Kill(p.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	rec.await(t, msgFailed) // the restart is under way, held before its back-off
	if err := b.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	release()
	r := rec.await(t, msgRestarted, msgIdle)
	if r.Message != msgIdle {
		t.Errorf("got %q, want %q", r.Message, msgIdle)
	}
	if pid := p.PID(); pid != 0 {
		t.Errorf("plugin process %d runs although no bus uses the plugin", pid)
	}
	// Stopped before the back-off, no process was started; one started
	// would be named by the record, and must be stopped again.
	if v := attr(r, "pid"); v.Kind() == slog.KindInt64 && !processGone(int(v.Int64())) {
		t.Errorf("process %d started by the restart still runs", v.Int64())
	}

	// A new bus starts the plugin again.
	b = newBus()
	if p.PID() == 0 {
		t.Fatal("no plugin process for the new bus")
	}
	if err := b.Deliver(context.Background(), delivery(t, Ping{}, nil)); err != nil {
		t.Fatal(err)
	}
	if err := b.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if p.PID() != 0 {
		t.Fatal("plugin process still runs after the last bus stopped")
	}
}

// TestPanicAfterNextEndsThePluginsNext: a panic in the rest of the chain,
// which the bus recovers above the plugin's layer, ends the plugin's next
// at once (the host cancels the call) instead of leaving it waiting until
// the process stops.
func TestPanicAfterNextEndsThePluginsNext(t *testing.T) {
	rec, logger := newRecorder(t)
	p := load(t, "catch", plugin.WithLogger(logger))
	panics := bus.Middleware{Name: "panics", Incoming: func(context.Context, *bus.Incoming, *bus.IncomingNext) error { panic("boom") }}
	b, err := bus.New(bus.WithEndpoint("svc"), bus.WithLogger(logger), bus.WithMiddleware(p, panics),
		bus.WithHandler(func(context.Context, Ping, bus.Attributes) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer b.Stop(ctx)
	if err := b.Deliver(ctx, delivery(t, Ping{N: 1}, nil)); !errors.Is(err, bus.ErrPanic) {
		t.Fatalf("Deliver: %v, want the recovered panic", err)
	}
	rec.awaitText(t, "caught") // the plugin's next returned, before Stop
}

// WithBackoff refuses a back-off whose delays make no sense, saying what
// to change; a zero field keeps its default (here Max, 30s, below the
// Initial given).
func TestWithBackoffRefusesInvalid(t *testing.T) {
	for _, b := range []bus.Backoff{{Initial: -time.Second}, {Initial: time.Minute}, {Initial: time.Second, Max: time.Millisecond}} {
		_, err := plugin.Load(bins.around, plugin.WithSHA256(bins.aroundSum), plugin.WithBackoff(b))
		if err == nil || !strings.Contains(err.Error(), "plugin: WithBackoff") || !strings.Contains(err.Error(), "Initial") {
			t.Errorf("Load with WithBackoff(%+v) = %v, want an error saying what to change", b, err)
		}
	}
}

// TestStartAgainAfterAFailedStart: when a later middleware's Start hook
// fails, the bus runs the plugin's Stop hook (which releases its
// instance, and stops the process of the last bus using it); Start may
// be called again, and the plugin must then serve the bus again, as an
// in-process middleware would, instead of being down for good.
func TestStartAgainAfterAFailedStart(t *testing.T) {
	for _, scenario := range []string{"pass", "short"} {
		t.Run(scenario, func(t *testing.T) {
			p := load(t, scenario)
			pid := p.PID()
			failures := 1
			flaky := bus.Middleware{Name: "flaky", Start: func(context.Context) error {
				if failures > 0 {
					failures--
					return errors.New("flaky: not ready")
				}
				return nil
			}}
			handled := 0
			b, err := bus.New(bus.WithEndpoint("svc"), bus.WithMiddleware(p, flaky), bus.WithLogger(testLogger(t)),
				bus.WithHandler(func(context.Context, Ping, bus.Attributes) error { handled++; return nil }))
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if err := b.Start(ctx); err == nil {
				t.Fatal("Start succeeded despite the failing hook")
			}
			if !processGone(pid) || p.PID() != 0 {
				t.Fatalf("plugin process %d still runs after the failed Start stopped the plugin", pid)
			}
			if err := b.Start(ctx); err != nil {
				t.Fatal(err)
			}
			if err := b.Deliver(ctx, delivery(t, Ping{}, nil)); err != nil {
				t.Fatalf("Deliver after the second Start: %v", err)
			}
			want := map[string]int{"pass": 1, "short": 0}[scenario]
			if handled != want {
				t.Fatalf("handled %d, want %d", handled, want)
			}
			if err := b.Stop(ctx); err != nil {
				t.Fatal(err)
			}
			if p.PID() != 0 {
				t.Fatal("plugin process still runs after the last bus stopped")
			}
		})
	}
}

// startBus starts a bus of the given name using p.
func startBus(t *testing.T, p bus.Plugin, name string) (*bus.Bus, error) {
	t.Helper()
	b, err := bus.New(bus.WithEndpoint(name), bus.WithMiddleware(p), bus.WithLogger(testLogger(t)),
		bus.WithHandler(func(context.Context, Ping, bus.Attributes) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	return b, b.Start(context.Background())
}

// TestFailedStartHookIsNotReplayedAfterACrash: a plugin whose Start hook
// failed for one bus (which therefore never started, and never runs its
// Stop hook) is restored after a crash for the buses it serves: the
// restart does not run the hook that failed again, which would fail the
// restart, again and again, and leave every bus without the plugin.
func TestFailedStartHookIsNotReplayedAfterACrash(t *testing.T) {
	rec, logger := newRecorder(t)
	p := load(t, "start-fails", plugin.WithLogger(logger), plugin.WithBackoff(bus.Backoff{Initial: 10 * time.Millisecond, Max: 20 * time.Millisecond}))
	good, err := startBus(t, p, "good")
	if err != nil {
		t.Fatal(err)
	}
	defer good.Stop(context.Background())
	if _, err := startBus(t, p, scenarios.RefusedBus); err == nil || !strings.Contains(err.Error(), "refusing to start") {
		t.Fatalf("Start of the refused bus: %v, want the hook's error", err)
	}
	if err := syscall.Kill(p.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if r := rec.await(t, msgRestarted, "restoring plugin instances after restart failed; retrying"); r.Message != msgRestarted {
		t.Fatalf("got %q: %v, want %q", r.Message, attr(r, "error"), msgRestarted)
	}
	if err := good.Deliver(context.Background(), delivery(t, Ping{}, nil)); err != nil {
		t.Fatalf("Deliver on the started bus after the restart: %v", err)
	}
}

// TestStartHookPanicIsReportedAndTheProcessSurvives: a plugin's Start hook
// that panics fails the bus's Start with a *plugin.Error naming the
// plugin and matching bus.ErrPanic, as a panicking stage does; the
// process goes on serving the other buses.
func TestStartHookPanicIsReportedAndTheProcessSurvives(t *testing.T) {
	p := load(t, "start-panics")
	pid := p.PID()
	good, err := startBus(t, p, "good")
	if err != nil {
		t.Fatal(err)
	}
	defer good.Stop(context.Background())
	_, err = startBus(t, p, scenarios.RefusedBus)
	var pe *plugin.Error
	if !errors.As(err, &pe) || pe.Plugin != scenarios.Name || !errors.Is(err, bus.ErrPanic) || !strings.Contains(err.Error(), "start hook boom") ||
		strings.Contains(err.Error(), "unknown stage") {
		t.Fatalf("Start: %v (%T), want a *plugin.Error naming %q and matching bus.ErrPanic", err, err, scenarios.Name)
	}
	if err := good.Deliver(context.Background(), delivery(t, Ping{}, nil)); err != nil {
		t.Fatalf("Deliver on the started bus: %v", err)
	}
	if got, s := p.PID(), p.Stats(); got != pid || s.Crashes != 0 {
		t.Fatalf("pid %d, stats %+v; want the process %d still serving, no crash", got, s, pid)
	}
}

// TestUnavailableOutsideAStageSaysNothingOfAMessage: a plugin that is
// unavailable when a bus is built (it is restarting) fails bus.New with
// an *plugin.UnavailableError that says so, without the fate of a message
// (there is none) nor an "unknown stage".
func TestUnavailableOutsideAStageSaysNothingOfAMessage(t *testing.T) {
	rec, logger := newRecorder(t)
	hold := holdFailure{logger.Handler(), make(chan struct{})}
	release := sync.OnceFunc(func() { close(hold.release) })
	p := load(t, "pass", plugin.WithLogger(slog.New(hold)))
	t.Cleanup(release) // before the plugin closes: its watcher is held
	if err := syscall.Kill(p.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	rec.await(t, msgFailed) // the restart is under way, held before its back-off
	_, err := bus.New(bus.WithEndpoint("svc"), bus.WithMiddleware(p), bus.WithLogger(testLogger(t)))
	if !errors.Is(err, plugin.ErrUnavailable) {
		t.Fatalf("bus.New during the restart: %v, want an *plugin.UnavailableError", err)
	}
	if msg := err.Error(); strings.Contains(msg, "message") || strings.Contains(msg, "unknown stage") || !strings.Contains(msg, "restarting") {
		t.Fatalf("bus.New during the restart: %q, want it to say the plugin is restarting, and nothing of a message or a stage", msg)
	}
}
