package memory_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/memory"
	"github.com/plugbus/plugbus/transports/transporttest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	broker := memory.NewBroker()
	transporttest.Run(t, func(testing.TB) bus.Transport { return memory.New(memory.WithBroker(broker)) }, transporttest.Features{
		Ordered:           true,
		DeadLetterManager: true,
		Batch:             true,
		DeadLetters: func(ctx context.Context, _ testing.TB, endpoint string, n int) []bus.DeadLetter {
			// The broker has no event for a dead letter: poll, bounded by ctx.
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			for {
				dl := broker.DeadLetters(endpoint)
				if len(dl) >= n {
					return dl
				}
				select {
				case <-ctx.Done():
					return dl
				case <-tick.C:
				}
			}
		},
	})
}
