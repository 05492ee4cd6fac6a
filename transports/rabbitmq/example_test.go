package rabbitmq_test

import (
	"context"
	"log"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/rabbitmq"
)

type placeOrder struct {
	ID string `json:"id"`
}

func (placeOrder) MessageName() string { return "orders.place" }

// A bus on RabbitMQ: the transport connects at Start, declares the
// endpoint's queue, its dead-letter queue and the bindings, and consumes.
func ExampleNew() {
	t, err := rabbitmq.New("amqp://guest:guest@127.0.0.1:5672/",
		rabbitmq.WithQueueArguments(amqp.Table{"x-queue-type": "quorum"}))
	if err != nil {
		log.Fatal(err)
	}
	b, err := bus.New(
		bus.WithEndpoint("orders"),
		bus.WithTransport(t),
		bus.WithHandler(func(ctx context.Context, m placeOrder, _ bus.Attributes) error {
			log.Printf("placing order %s", m.ID)
			return nil
		}),
	)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	if err := b.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer b.Stop(ctx)
	// Returns once the broker confirmed the message.
	if err := b.Send(ctx, placeOrder{ID: "42"}); err != nil {
		log.Fatal(err)
	}
}

// Incoming middleware reads native AMQP headers, of any type, from the raw
// delivery.
func Example_rawDelivery() {
	mw := bus.Middleware{
		Name: "x-death",
		Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
			if d, ok := in.Raw().(*amqp.Delivery); ok {
				if deaths, ok := d.Headers["x-death"].([]any); ok {
					in.Logger().InfoContext(ctx, "message was dead-lettered before", "times", len(deaths))
				}
			}
			return next.Call(ctx)
		},
	}
	_ = mw
}

// A send-only service checks the broker at startup: its bus's Start does
// not reach the transport, Connect does, and says why it could not.
func ExampleTransport_Connect() {
	t, err := rabbitmq.New("amqp://guest:guest@127.0.0.1:5672/")
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := t.Connect(ctx); err != nil {
		// A *rabbitmq.UnreachableError: the address (no password), the
		// failed attempts and the last failure.
		log.Fatal(err)
	}
	b, err := bus.New(bus.WithTransport(t))
	if err != nil {
		log.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer b.Stop(context.Background())
	if err := b.Send(ctx, placeOrder{ID: "42"}, bus.To("orders")); err != nil {
		log.Fatal(err)
	}
}
