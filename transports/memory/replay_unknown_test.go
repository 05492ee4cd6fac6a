package memory_test

import (
	"context"
	"errors"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/dltest"
	"github.com/plugbus/plugbus/transports/memory"
)

// A replay to the instance queue of a closed transport is refused and
// leaves the dead letter: Send drops a message to such a queue, and the
// replay then removed the dead letter of a copy that went nowhere.
func TestReplayToAClosedInstanceQueueKeepsTheDeadLetter(t *testing.T) {
	ctx := t.Context()
	broker := memory.NewBroker()
	stopped := memory.New(memory.WithBroker(broker))
	if err := stopped.Setup(ctx, bus.Topology{Instance: true}); err != nil {
		t.Fatal(err)
	}
	gone := stopped.InstanceAddress()
	if err := stopped.Close(ctx); err != nil {
		t.Fatal(err)
	}
	tr := memory.New(memory.WithBroker(broker))
	defer func() { _ = tr.Close(context.Background()) }()
	if err := tr.Setup(ctx, bus.Topology{Endpoint: "shop", MaxAttempts: 1, Concurrency: 1}); err != nil {
		t.Fatal(err)
	}
	dltest.Make(ctx, t, tr, "shop", dltest.Message{Name: "shop.order", Body: `{}`, Reason: "failed"})
	n, err := tr.ReplayDeadLetters(ctx, bus.DeadLetterFilter{Endpoint: "shop"}, bus.Replay{To: gone}, nil)
	var ue *bus.UnknownEndpointError
	if n != 0 || !errors.As(err, &ue) || ue.Endpoint != gone {
		t.Errorf("replay to %s = %d, %v; want 0 and a *bus.UnknownEndpointError naming it", gone, n, err)
	}
	if c, err := tr.CountDeadLetters(ctx, "shop"); err != nil || c != 1 {
		t.Errorf("after the replay %d dead letters (%v), want the 1 as it was", c, err)
	}
}
