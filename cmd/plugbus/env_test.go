package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// The environment's broker URL and console token are secrets: -h prints
// every flag's default, so they must not be the flags' defaults (-h
// printed "(default "amqp://guest:s3cret@…")"). They are still used when
// the flags are not given, and -sqs alone is not refused as "both -rabbitmq
// and -sqs" because $PLUGBUS_RABBITMQ_URL is set.
func TestHelpPrintsNoSecretFromTheEnvironment(t *testing.T) {
	t.Setenv("PLUGBUS_RABBITMQ_URL", "amqp://guest:s3cret-password@127.0.0.1:1/")
	t.Setenv("PLUGBUS_CONSOLE_TOKEN", "s3cret-token")
	for _, args := range [][]string{{"dlq", "list", "-h"}, {"dlq", "replay", "-h"}, {"console", "-h"}} {
		var out, errw bytes.Buffer
		if err := run(t.Context(), args, stdio{out: &out, err: &errw}); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		help := out.String() + errw.String()
		if !strings.Contains(help, "$PLUGBUS_RABBITMQ_URL") {
			t.Fatalf("%v printed no help naming $PLUGBUS_RABBITMQ_URL:\n%s", args, help)
		}
		if strings.Contains(help, "s3cret") {
			t.Errorf("%v printed a secret from the environment:\n%s", args, help)
		}
	}

	// The URL of the environment is the one dialled (port 1: refused).
	_, err := cli(t, "dlq", "list", "-endpoint", "orders", "-connect-timeout", "200ms")
	if err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("dlq list with $PLUGBUS_RABBITMQ_URL: %v; want the broker of the environment unreachable, without its password", err)
	}

	// -sqs with $PLUGBUS_RABBITMQ_URL set opens SQS.
	t.Setenv("AWS_REGION", "us-east-1")
	b := broker{sqs: true, connectTimeout: time.Second}
	tr, err := b.open(t.Context(), &bytes.Buffer{})
	if err != nil {
		t.Fatalf("-sqs with $PLUGBUS_RABBITMQ_URL set: %v; want SQS", err)
	}
	_ = tr.Close(context.Background())
}
