// Command quickstart is the README's quick start: one bus, one typed
// handler, the OpenTelemetry plugin, on the default in-memory transport.
package main

import (
	"context"
	"fmt"
	"log"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugins/otel"
)

// OrderPlaced is the message the quick start publishes.
type OrderPlaced struct{ OrderID string }

// MessageName implements bus.Message.
func (OrderPlaced) MessageName() string { return "shop.order_placed" }

func main() {
	ctx, done := context.Background(), make(chan struct{})
	b, err := bus.New(
		bus.WithEndpoint("orders"),
		bus.WithMiddleware(otel.New()), // plugins and middleware: first registered = outermost
		bus.WithHandler(func(ctx context.Context, m OrderPlaced, a bus.Attributes) error {
			fmt.Println("order", m.OrderID, "correlation", a.CorrelationID)
			close(done)
			return nil
		}))
	if err != nil {
		log.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer b.Stop(ctx)
	if err := b.Publish(ctx, OrderPlaced{OrderID: "o-1"}); err != nil {
		log.Fatal(err)
	}
	<-done
}
