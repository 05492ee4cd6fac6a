package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/rabbitmq"
	"github.com/plugbus/plugbus/transports/sqs"
)

// broker is where `plugbus dlq` and `plugbus console` find the dead
// letters: the flags naming a transport, and the transport they opened.
type broker struct {
	rabbitURL, exchange string
	sqs                 bool
	sqsEndpoint, prefix string
	region              string
	connectTimeout      time.Duration
}

// flags defines the broker's flags on fs. The environment variables are
// read by open, not made the flags' defaults: -h prints the defaults, and
// $PLUGBUS_RABBITMQ_URL holds a password.
func (b *broker) flags(fs *flag.FlagSet) {
	fs.StringVar(&b.rabbitURL, "rabbitmq", "", "RabbitMQ broker URL, amqp://user:password@host:5672/vhost (default $PLUGBUS_RABBITMQ_URL)")
	fs.StringVar(&b.exchange, "exchange", rabbitmq.DefaultExchange, "RabbitMQ: the bus's topic exchange")
	fs.BoolVar(&b.sqs, "sqs", false, "use AWS SQS, configured as the AWS SDK is (AWS_REGION, credentials ...)")
	fs.StringVar(&b.sqsEndpoint, "sqs-endpoint", "", "SQS: the endpoint URL, for an emulator (default $PLUGBUS_SQS_ENDPOINT)")
	fs.StringVar(&b.prefix, "sqs-prefix", "", "SQS: the bus's queue name prefix (sqs.WithPrefix)")
	fs.StringVar(&b.region, "sqs-region", "", "SQS: the AWS region, when not configured otherwise")
	fs.DurationVar(&b.connectTimeout, "connect-timeout", 15*time.Second, "RabbitMQ: give up when the broker does not answer within this time (0: wait for it, until interrupted)")
}

// managed is an open transport that manages dead letters.
type managed interface {
	bus.Transport
	bus.DeadLetterManager
}

// open opens the transport the flags name. The transport logs to stderr,
// warnings only.
func (b *broker) open(ctx context.Context, stderr io.Writer) (managed, error) {
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if b.connectTimeout < 0 {
		return nil, fmt.Errorf("-connect-timeout %v: want a duration, or 0 to wait for the broker", b.connectTimeout)
	}
	// The environment fills what the flags leave empty; -sqs alone is
	// not "both" because $PLUGBUS_RABBITMQ_URL is set.
	if b.rabbitURL == "" && !b.sqs {
		b.rabbitURL = os.Getenv("PLUGBUS_RABBITMQ_URL")
	}
	if b.sqsEndpoint == "" {
		b.sqsEndpoint = os.Getenv("PLUGBUS_SQS_ENDPOINT")
	}
	switch {
	case b.rabbitURL != "" && b.sqs:
		return nil, errors.New("give either -rabbitmq or -sqs, not both")
	case b.rabbitURL != "":
		t, err := rabbitmq.New(b.rabbitURL, rabbitmq.WithExchange(b.exchange), rabbitmq.WithLogger(log))
		if err != nil {
			return nil, err
		}
		// The transport retries for ever, as a bus should; a command gives
		// up, unless told to wait (0).
		cctx, cancel := context.WithCancel(ctx)
		if b.connectTimeout > 0 {
			cctx, cancel = context.WithTimeout(ctx, b.connectTimeout)
		}
		defer cancel()
		if err := t.Connect(cctx); err != nil {
			_ = t.Close(context.WithoutCancel(ctx))
			return nil, err
		}
		return t, nil
	case b.sqs:
		var opts []func(*config.LoadOptions) error
		if b.region != "" {
			opts = append(opts, config.WithRegion(b.region))
		}
		cfg, err := config.LoadDefaultConfig(ctx, opts...)
		if err != nil {
			return nil, fmt.Errorf("loading the AWS configuration: %w", err)
		}
		if b.sqsEndpoint != "" {
			cfg.BaseEndpoint = aws.String(b.sqsEndpoint)
		}
		t, err := sqs.New(cfg, sqs.WithPrefix(b.prefix), sqs.WithLogger(log))
		if err != nil {
			return nil, fmt.Errorf("-sqs-prefix: %w", err)
		}
		return t, nil
	}
	return nil, errors.New("no broker: give -rabbitmq URL (or $PLUGBUS_RABBITMQ_URL) or -sqs")
}
