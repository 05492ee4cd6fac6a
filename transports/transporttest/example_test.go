package transporttest_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/memory"
	"github.com/plugbus/plugbus/transports/transporttest"
)

// deadLettersOf reads the dead letters of broker for the suite, waiting
// until endpoint holds at least n or ctx ends. The memory broker has no
// event for a dead letter, so it polls.
func deadLettersOf(broker *memory.Broker) func(ctx context.Context, t testing.TB, endpoint string, n int) []bus.DeadLetter {
	return func(ctx context.Context, _ testing.TB, endpoint string, n int) []bus.DeadLetter {
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
	}
}

// The conformance suite for the memory transport: a Factory whose
// transports share one broker, and the features the transport claims. A
// transport's test passes them to Run:
//
//	func TestConformance(t *testing.T) {
//		transporttest.Run(t, factory, features)
//	}
//
// What follows does by hand what the suite relies on: a message one
// transport of the factory sends, another receives, and a message it
// fails is among the dead letters Features.DeadLetters reads.
func ExampleRun() {
	broker := memory.NewBroker()
	factory := transporttest.Factory(func(testing.TB) bus.Transport { return memory.New(memory.WithBroker(broker)) })
	features := transporttest.Features{Ordered: true, DeadLetters: deadLettersOf(broker)}

	ctx := context.Background()
	sender, receiver := factory(nil), factory(nil) // the suite passes its *testing.T
	defer sender.Close(ctx)
	defer receiver.Close(ctx)
	if err := receiver.Setup(ctx, bus.Topology{Endpoint: "orders", Handles: []string{"shop.order_placed"}, MaxAttempts: 5, Concurrency: 1}); err != nil {
		panic(err)
	}
	env := &bus.Envelope{Name: "shop.order_placed", ContentType: "application/json", Body: []byte(`{}`),
		Attributes: bus.NewAttributes("m-1", "m-1", time.Now(), nil, nil)}
	if err := sender.Publish(ctx, env); err != nil {
		panic(err)
	}
	d, err := receiver.Receive(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("received", d.Name, "attempt", d.Attempt)
	if err := receiver.Fail(ctx, d, bus.Failure{Reason: "card declined", Attempts: 1, Endpoint: "orders"}); err != nil {
		panic(err)
	}
	for _, dl := range features.DeadLetters(ctx, nil, "orders", 1) {
		fmt.Printf("dead letter %s: %s\n", dl.Envelope.Attributes.MessageID, dl.Failure.Reason)
	}
	// Output:
	// received shop.order_placed attempt 1
	// dead letter m-1: card declined
}

// Name makes the endpoint and message names of one test unique, so that
// tests sharing a broker (a RabbitMQ server, an SQS account) never see
// each other's messages.
func ExampleName() {
	a, b := transporttest.Name("orders"), transporttest.Name("orders")
	fmt.Println(strings.HasPrefix(a, "orders-"), a != b)
	// Output: true true
}
