package rabbitmq_test

import (
	"sync"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/testenv"
	"github.com/plugbus/plugbus/transports/rabbitmq"
	"github.com/plugbus/plugbus/transports/transporttest"
)

// A bulk replay acts on the dead letters there when it starts ("one that
// arrives meanwhile is not touched"): a replayed copy that fails again
// while the replay still runs comes back to the dead-letter queue under
// the same ID (its message id), and must not be replayed a second time
// by the same operation.
func TestReplayLeavesADeadLetterThatArrivedMeanwhile(t *testing.T) {
	url := testenv.RabbitMQ(t)
	adm := newAdmin(t, url)
	exchange, ep := transporttest.Name("plugbus-replay"), transporttest.Name("replay-meanwhile")
	t.Cleanup(func() { adm.deleteExchange(t, exchange) })
	ctx := testContext(t, 60*time.Second)
	tr := open(t, url, adm, rabbitmq.WithExchange(exchange))
	if err := tr.Setup(ctx, bus.Topology{Endpoint: ep, Handles: []string{"review.msg"}, MaxAttempts: 1, Concurrency: 1}); err != nil {
		t.Fatal(err)
	}
	const total = 17 // one more than the replay window
	deadLetter(ctx, t, tr, ep, "review.msg", total, "first failure")
	m := open(t, url, adm, rabbitmq.WithExchange(exchange))
	// What the CLI does: list, then act on the listed IDs.
	listed, err := m.ListDeadLetters(ctx, bus.DeadLetterFilter{Endpoint: ep})
	if err != nil || len(listed) != total {
		t.Fatalf("listed %d dead letters (%v), want %d", len(listed), err, total)
	}
	f := bus.DeadLetterFilter{Endpoint: ep}
	for _, dl := range listed {
		f.IDs = append(f.IDs, dl.ID)
	}
	var once sync.Once
	replays := map[string]int{}
	n, err := m.ReplayDeadLetters(ctx, f, bus.Replay{By: "review"}, func(dl bus.DeadLetter) {
		replays[dl.ID]++
		once.Do(func() {
			// Meanwhile the endpoint's consumer takes a replayed copy and
			// it fails again (the bug is not fixed yet).
			d, err := tr.Receive(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			if err := tr.Fail(ctx, d, bus.Failure{Reason: "failed again", Endpoint: ep, Attempts: 1}); err != nil {
				t.Error(err)
				return
			}
			for { // until the new dead letter is ready in the queue
				c, err := m.CountDeadLetters(ctx, ep)
				if err != nil || c > 0 || ctx.Err() != nil {
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	for id, c := range replays {
		if c > 1 {
			t.Errorf("dead letter %s replayed %d times by one operation", id, c)
		}
	}
	if n != total {
		t.Errorf("replayed %d, want the %d listed", n, total)
	}
}
