package rabbitmq_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/testenv"
)

// rabbitmqctl returns a function running rabbitmqctl with its arguments
// (PLUGBUS_RABBITMQCTL overrides the command, for example
// "docker exec rabbitmq rabbitmqctl"), skipping t when there is none.
func rabbitmqctl(t *testing.T) func(ctx context.Context, args ...string) error {
	t.Helper()
	cmd := strings.Fields(testenv.Getenv("PLUGBUS_RABBITMQCTL", "rabbitmqctl"))
	if _, err := exec.LookPath(cmd[0]); err != nil {
		msg := "restarting the broker needs rabbitmqctl (set PLUGBUS_RABBITMQCTL to the command that runs it): " + err.Error()
		if testenv.CI() {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return func(ctx context.Context, args ...string) error {
		c := exec.CommandContext(ctx, cmd[0], append(cmd[1:], args...)...)
		c.Env = os.Environ()
		out, err := c.CombinedOutput()
		if err != nil {
			t.Logf("rabbitmqctl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return err
	}
}

// TestBrokerRestartLosesNothing restarts the broker twice while 10,000
// messages are being sent and handled: every message is handled.
func TestBrokerRestartLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts the broker; skipped with -short")
	}
	e := newEnv(t)
	ctl := rabbitmqctl(t)
	t.Cleanup(func() {
		// Whatever happened, leave the broker running.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := ctl(ctx, "start_app"); err != nil {
			t.Errorf("restarting the broker at cleanup: %v", err)
		}
		if err := ctl(ctx, "await_startup"); err != nil {
			t.Errorf("waiting for the broker at cleanup: %v", err)
		}
	})

	const n = 10_000
	var mu sync.Mutex
	seen := make(map[int]bool, n)
	all := make(chan struct{})
	var handledTotal atomic.Int64
	b := e.start(t, bus.WithConcurrency(8), bus.WithHandler(func(_ context.Context, o order, _ bus.Attributes) error {
		handledTotal.Add(1)
		mu.Lock()
		defer mu.Unlock()
		if !seen[o.ID] {
			seen[o.ID] = true
			if len(seen) == n {
				close(all)
			}
		}
		return nil
	}))

	ctx := testContext(t, 4*time.Minute)
	var sent atomic.Int64
	sendsDone := make(chan struct{})
	restarted := make(chan error, 1)
	go func() {
		defer close(restarted)
		// The first restart after 1,500 sends, the second 1,000 sends after
		// the broker is back (or when the sends are over, while the
		// consumer still works through the queue).
		at := int64(1500)
		for range 2 {
			for sent.Load() < at { // no signal to wait on: poll the counter
				select {
				case <-ctx.Done():
					return
				case <-sendsDone:
					at = 0
				case <-time.After(5 * time.Millisecond):
				}
			}
			t.Logf("stopping the broker after %d sends", sent.Load())
			if err := ctl(ctx, "stop_app"); err != nil {
				restarted <- err
				return
			}
			if err := ctl(ctx, "start_app"); err != nil {
				restarted <- err
				return
			}
			t.Logf("broker back after %d sends", sent.Load())
			at = sent.Load() + 1000
		}
	}()

	var wg sync.WaitGroup
	const senders = 8
	for w := range senders {
		wg.Go(func() {
			for i := w; i < n; i += senders {
				if err := b.Send(ctx, order{ID: i}); err != nil {
					t.Errorf("Send %d: %v", i, err)
					return
				}
				sent.Add(1)
			}
		})
	}
	wg.Wait()
	close(sendsDone)
	if err := <-restarted; err != nil {
		t.Fatalf("restarting the broker: %v", err)
	}
	select {
	case <-all:
	case <-ctx.Done():
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("handled %d distinct messages of %d before the timeout", len(seen), n)
	}
	t.Logf("%d messages handled %d times in all (duplicates come from unconfirmed sends and unacknowledged deliveries at the restarts)", n, handledTotal.Load())
}
