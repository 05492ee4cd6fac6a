package sqslambda_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/sqs"
	"github.com/plugbus/plugbus/transports/sqs/sqslambda"
)

type invoiceRequested struct {
	Order string `json:"order"`
}

func (invoiceRequested) MessageName() string { return "billing.invoice-requested" }

// A Lambda function's handler: each record of the SQS event runs through
// the bus, and the records that failed are reported for Lambda to retry.
// In the function, load the AWS configuration with
// config.LoadDefaultConfig(ctx) and pass the handler to the Lambda
// runtime, for example lambda.Start(handler) with
// github.com/aws/aws-lambda-go.
func ExampleNewHandler() {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := aws.Config{Region: "eu-west-1"}
	tr, err := sqs.New(cfg, sqs.WithPrefix("prod-"))
	if err != nil {
		panic(err)
	}
	b, err := bus.New(
		bus.WithEndpoint("billing"),
		bus.WithLogger(quiet),
		bus.WithTransport(tr),
		bus.WithMaxAttempts(5),
		bus.WithHandler(func(ctx context.Context, m invoiceRequested, _ bus.Attributes) error {
			if m.Order == "" {
				return errors.New("no order to invoice")
			}
			fmt.Println("invoicing", m.Order)
			return nil
		}),
	)
	if err != nil {
		panic(err)
	}
	handler, err := sqslambda.NewHandler(b, sqslambda.WithMaxAttempts(5), sqslambda.WithLogger(quiet))
	if err != nil {
		panic(err)
	}

	// The event as Lambda passes it, cut down to what this example needs.
	var ev sqslambda.Event
	if err := json.Unmarshal([]byte(`{"Records": [
		{"messageId": "m-1", "body": "{\"order\":\"o-1\"}", "attributes": {"ApproximateReceiveCount": "1"},
		 "messageAttributes": {"plugbus": {"dataType": "String", "stringValue": "{\"v\":1,\"name\":\"billing.invoice-requested\",\"id\":\"i-1\"}"}}},
		{"messageId": "m-2", "body": "{}", "attributes": {"ApproximateReceiveCount": "1"},
		 "messageAttributes": {"plugbus": {"dataType": "String", "stringValue": "{\"v\":1,\"name\":\"billing.invoice-requested\",\"id\":\"i-2\"}"}}}
	]}`), &ev); err != nil {
		panic(err)
	}
	resp, err := handler(context.Background(), ev)
	if err != nil {
		panic(err)
	}
	fmt.Println("to retry:", resp.BatchItemFailures)
	// Output:
	// invoicing o-1
	// to retry: [{m-2}]
}
