package sqs_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/sqstest"
	"github.com/plugbus/plugbus/transports/sqs"
)

// closedAddress returns a loopback address where nothing listens.
func closedAddress(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// Against an endpoint that cannot be reached, Start of a receiving bus
// fails once the AWS SDK's retries are spent (3 attempts by default), and
// the first Send of a send-only bus, whose Start contacts nothing, fails
// the same way. Each retried attempt is logged at WARN with the address
// and the time of the next attempt; no credential is ever logged.
func TestUnreachableEndpoint(t *testing.T) {
	const keyID, secret = "AKIDPLUGBUSTEST", "plugbus-test-secret"
	for _, receiving := range []bool{true, false} {
		name := map[bool]string{true: "start", false: "send-only"}[receiving]
		t.Run(name, func(t *testing.T) {
			addr := closedAddress(t)
			logs := &sqstest.LogRecorder{}
			cfg := aws.Config{
				Region:       "us-east-1",
				Credentials:  credentials.NewStaticCredentialsProvider(keyID, secret, ""),
				BaseEndpoint: aws.String("http://" + addr),
				HTTPClient:   &http.Client{Transport: httpTransport},
			}
			opts := []bus.Option{bus.WithTransport(sqstest.New(t, cfg, sqs.WithLogger(logs.Logger()))), bus.WithLogger(logs.Logger())}
			if receiving {
				opts = append(opts, bus.WithEndpoint("billing"), bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error { return nil }))
			}
			b, err := bus.New(opts...)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			began := time.Now()
			err = b.Start(ctx)
			if !receiving {
				if err != nil {
					t.Fatalf("Start of a send-only bus: %v, want nil (it contacts nothing)", err)
				}
				defer b.Stop(context.Background())
				err = b.Send(ctx, orderPlaced{ID: "1"}, bus.To("billing"))
			}
			if err == nil || !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "attempts, 3") {
				t.Fatalf("error = %v, want the refused connection to %s after 3 attempts", err, addr)
			}
			if ctx.Err() != nil {
				t.Fatalf("gave up only when the context ended (%v)", time.Since(began))
			}
			warnings := logs.Warnings(t, "could not reach")
			if len(warnings) != 2 {
				t.Fatalf("warnings = %d, want one per retried attempt (2)\n%s", len(warnings), logs)
			}
			for i, w := range warnings {
				next, err := time.Parse(time.RFC3339Nano, w["retry_at"].(string))
				if w["address"] != "http://"+addr || w["attempt"] != float64(i+1) || w["service"] != "sqs" || err != nil || next.Before(began) {
					t.Errorf("warning %d = %v, want address http://%s, attempt %d, service sqs and the next retry time", i, w, addr, i+1)
				}
			}
			if all := logs.String() + err.Error(); strings.Contains(all, keyID) || strings.Contains(all, secret) {
				t.Errorf("a credential was logged or returned:\n%s", all)
			}
		})
	}
}
