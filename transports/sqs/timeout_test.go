package sqs_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/sqstest"
	"github.com/plugbus/plugbus/internal/testenv"
	"github.com/plugbus/plugbus/transports/sqs"
)

func TestSendOnSilentConnectionFailsAfterRequestTimeout(t *testing.T) {
	cfg := aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("test", "test", ""),
		BaseEndpoint: aws.String("http://" + testenv.SilentServer(t)), HTTPClient: &http.Client{Transport: httpTransport}}
	var logs sqstest.LogRecorder
	tr := sqstest.New(t, cfg, sqs.WithRequestTimeout(200*time.Millisecond), sqs.WithLogger(logs.Logger()))
	defer tr.Close(context.Background())
	env := &bus.Envelope{Name: "test.job", Body: []byte(`{}`), Attributes: bus.NewAttributes("m-1", "c-1", time.Now(), nil, nil)}
	start := time.Now()
	err := tr.Send(context.Background(), env, "orders")
	if took := time.Since(start); err == nil || !strings.Contains(err.Error(), "got no answer within 200ms") || took > 10*time.Second {
		t.Fatalf("Send on a silent connection: %v after %v, want the request timeout's error after a few attempts of 200ms", err, took)
	}
	retries := logs.Warnings(t, "AWS request could not reach its endpoint; retrying")
	if len(retries) == 0 || retries[0]["address"] != aws.ToString(cfg.BaseEndpoint) {
		t.Errorf("retries logged: %v, want them with the address %s", retries, aws.ToString(cfg.BaseEndpoint))
	}
}
