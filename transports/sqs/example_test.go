package sqs_test

import (
	"context"
	"log"

	"github.com/aws/aws-sdk-go-v2/config"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/sqs"
)

type invoiceRequested struct {
	Order string `json:"order"`
}

func (invoiceRequested) MessageName() string { return "billing.invoice-requested" }

// A service on SQS: Start declares the queue "prod-billing", its
// dead-letter queue "prod-billing-dlq" and the topic of every message it
// handles, subscribed with raw delivery.
func Example() {
	ctx := context.Background()
	cfg, err := config.LoadDefaultConfig(ctx) // region and credentials from the environment
	if err != nil {
		log.Fatal(err)
	}
	tr, err := sqs.New(cfg, sqs.WithPrefix("prod-"))
	if err != nil {
		log.Fatal(err) // an option SQS would not accept: *sqs.OptionError
	}
	b, err := bus.New(
		bus.WithEndpoint("billing"),
		bus.WithTransport(tr),
		bus.WithHandler(func(ctx context.Context, m invoiceRequested, _ bus.Attributes) error {
			log.Printf("invoicing %s", m.Order)
			return nil
		}),
	)
	if err != nil {
		log.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer b.Stop(ctx)
	// Publish goes to the topic of the message's name.
	_ = b.Publish(ctx, invoiceRequested{Order: "o-1"})
}
