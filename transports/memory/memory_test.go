package memory_test

import (
	"context"
	"testing"

	"go.uber.org/goleak"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/memory"
	"github.com/plugbus/plugbus/transports/transporttest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	broker := memory.NewBroker()
	transporttest.Run(t, func(testing.TB) bus.Transport { return memory.New(memory.WithBroker(broker)) }, transporttest.Features{
		Ordered: true,
		DeadLetters: func(_ context.Context, _ testing.TB, endpoint string, _ int) []bus.DeadLetter {
			return broker.DeadLetters(endpoint)
		},
	})
}
