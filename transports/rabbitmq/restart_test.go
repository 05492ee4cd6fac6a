package rabbitmq_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/testenv"
)

// TestBrokerRestartLosesNothing restarts the broker twice while 10,000
// messages are being sent and handled: every message is handled. The
// broker is a node of the test's own (testenv.StartRabbitMQNode), never
// the shared one.
func TestBrokerRestartLosesNothing(t *testing.T) {
	if testing.Short() && !testenv.CI() {
		t.Skip("starts and restarts a RabbitMQ node of its own; skipped with -short")
	}
	url, node := testenv.StartRabbitMQNode(t)
	e := newEnvAt(t, url)

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
			if err := node.Ctl(ctx, "stop_app"); err != nil {
				restarted <- err
				return
			}
			if err := node.Ctl(ctx, "start_app"); err != nil {
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
