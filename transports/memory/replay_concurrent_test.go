package memory_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/memory"
)

// Two operators replay the same dead letters at once (two console
// requests, or the console and `plugbus dlq`): each dead letter is
// replayed once, by one of them.
func TestConcurrentReplaysReplayEachOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tr := memory.New(memory.WithBroker(memory.NewBroker()))
	defer func() { _ = tr.Close(context.Background()) }()
	const ep = "review-orders"
	if err := tr.Setup(ctx, bus.Topology{Endpoint: ep, Handles: []string{"review.msg"}, MaxAttempts: 1, Concurrency: 1}); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		env := &bus.Envelope{Name: "review.msg", ContentType: "application/json", Body: fmt.Appendf(nil, `{"n":%d}`, i),
			Attributes: bus.NewAttributes(fmt.Sprintf("m-%d", i), "", time.Now(), nil, nil)}
		if err := tr.Send(ctx, env, ep); err != nil {
			t.Fatal(err)
		}
		d, err := tr.Receive(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := tr.Fail(ctx, d, bus.Failure{Reason: "boom", Endpoint: ep, Attempts: 1}); err != nil {
			t.Fatal(err)
		}
	}
	all := bus.DeadLetterFilter{Endpoint: ep}
	second := 0
	first, err := tr.ReplayDeadLetters(ctx, all, bus.Replay{By: "alice"}, func(bus.DeadLetter) {
		if second == 0 {
			// Bob's replay runs while Alice's is between two dead letters.
			n, err := tr.ReplayDeadLetters(ctx, all, bus.Replay{By: "bob"}, nil)
			if err != nil {
				t.Error(err)
			}
			second = n
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	copies, err := tr.QueueDepth(ctx, ep) // the replayed copies wait in the endpoint's queue
	if err != nil {
		t.Fatal(err)
	}
	if first+second != 2 || copies != 2 {
		t.Errorf("2 dead letters: alice replayed %d, bob %d, %d copies delivered; want 2 in all, each once", first, second, copies)
	}
}
