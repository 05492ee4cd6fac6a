package memory_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/memory"
)

type OrderPlaced struct {
	OrderID string `json:"order_id"`
}

func (OrderPlaced) MessageName() string { return "shop.order_placed" }

// Two buses in one process talk through one broker: billing subscribes to
// OrderPlaced when it starts, and what orders publishes reaches it.
func Example() {
	ctx := context.Background()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	broker := memory.NewBroker()
	charged := make(chan struct{})
	billing, err := bus.New(bus.WithEndpoint("billing"), bus.WithLogger(quiet),
		bus.WithTransport(memory.New(memory.WithBroker(broker))),
		bus.WithHandler(func(ctx context.Context, m OrderPlaced, _ bus.Attributes) error {
			fmt.Println("billing charges order", m.OrderID)
			close(charged)
			return nil
		}))
	if err != nil {
		panic(err)
	}
	orders, err := bus.New(bus.WithEndpoint("orders"), bus.WithLogger(quiet),
		bus.WithTransport(memory.New(memory.WithBroker(broker))))
	if err != nil {
		panic(err)
	}
	for _, b := range []*bus.Bus{billing, orders} {
		if err := b.Start(ctx); err != nil {
			panic(err)
		}
		defer b.Stop(ctx)
	}
	if err := orders.Publish(ctx, OrderPlaced{OrderID: "o-1"}); err != nil {
		panic(err)
	}
	<-charged
	// Output: billing charges order o-1
}

// A message the receiver fails goes to the endpoint's dead-letter queue
// with its failure. Here the transport is driven by hand, as a bus drives
// it.
func ExampleBroker_DeadLetters() {
	ctx := context.Background()
	broker := memory.NewBroker()
	tr := memory.New(memory.WithBroker(broker))
	defer tr.Close(ctx)
	if err := tr.Setup(ctx, bus.Topology{Endpoint: "billing"}); err != nil {
		panic(err)
	}
	env := &bus.Envelope{Name: "shop.order_placed", ContentType: "application/json", Body: []byte(`{"order_id":"o-2"}`)}
	if err := tr.Send(ctx, env, "billing"); err != nil {
		panic(err)
	}
	fmt.Println("waiting in billing:", broker.Depth("billing"))
	d, err := tr.Receive(ctx)
	if err != nil {
		panic(err)
	}
	if err := tr.Fail(ctx, d, bus.Failure{Reason: "card declined", Attempts: d.Attempt, Endpoint: "billing"}); err != nil {
		panic(err)
	}
	for _, dl := range broker.DeadLetters("billing") {
		fmt.Printf("dead letter: %s %s, %q after %d attempt(s)\n", dl.Envelope.Name, dl.Envelope.Body, dl.Failure.Reason, dl.Failure.Attempts)
	}
	fmt.Println("waiting in billing:", broker.Depth("billing"))
	// Output:
	// waiting in billing: 1
	// dead letter: shop.order_placed {"order_id":"o-2"}, "card declined" after 1 attempt(s)
	// waiting in billing: 0
}
