package plugin_test

import (
	"context"
	"log/slog"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/memory"
)

// A fail-closed plugin killed twice during 10,000 messages costs time, not
// messages: with the bus's default retry policy the messages that failed
// while it restarted wait for a delayed retry instead of using up their
// attempts in milliseconds. None is dead-lettered, none lost.
func TestKilledTwiceUnderTheDefaultRetryPolicyLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 messages through a plugin killed twice; skipped with -short")
	}
	const n = 10_000
	p := load(t, "pass") // fail closed, the default restart back-off
	tr := memory.New()
	var mu sync.Mutex
	handled := make(map[int]bool, n)
	allHandled := make(chan struct{})
	b, err := bus.New(bus.WithEndpoint("svc"), bus.WithTransport(tr), bus.WithMiddleware(p), bus.WithConcurrency(8),
		bus.WithLogger(slog.New(slog.DiscardHandler)), // thousands of retries
		bus.WithHandler(func(_ context.Context, m Ping, _ bus.Attributes) error {
			mu.Lock()
			defer mu.Unlock()
			handled[m.N] = true
			if len(handled) == n {
				close(allHandled)
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
	t.Cleanup(func() { _ = b.Stop(context.Background()) })
	var killed []int
	for i := range n {
		if err := b.Send(ctx, Ping{N: i}); err != nil {
			t.Fatal(err)
		}
		if i == n/4 || i == 3*n/5 {
			// The host notices a crash a few milliseconds after the kill,
			// when thousands of sends may have gone: until then PID is
			// the killed process's.
			waitFor(t, "the plugin running after the crashes so far", func() bool {
				return p.Stats().Crashes == uint64(len(killed)) && p.PID() != 0
			})
			pid := p.PID()
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed = append(killed, pid)
		}
	}
	select {
	case <-allHandled:
	case <-time.After(3 * time.Minute):
		mu.Lock()
		t.Fatalf("%d of %d messages handled", len(handled), n)
	}
	if dl := tr.Broker().DeadLetters("svc"); len(dl) != 0 {
		t.Fatalf("%d messages dead-lettered, want 0; the first: %s", len(dl), dl[0].Failure.Reason)
	}
	s := p.Stats()
	if s.Crashes != 2 || s.Restarts < 2 {
		t.Errorf("stats %+v, want the two crashes and their restarts", s)
	}
	for _, pid := range killed {
		if !processGone(pid) {
			t.Errorf("killed process %d not reaped", pid)
		}
	}
	t.Logf("plugin stats %+v", s)
}
