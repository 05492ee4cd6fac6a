package sqs_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/sqs"
)

// silentEndpoint accepts connections and reads the requests, never
// answering: AWS behind a connection that went silent.
func silentEndpoint(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() { _, _ = io.Copy(io.Discard, c) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return "http://" + ln.Addr().String()
}

func TestSendOnSilentConnectionFailsAfterRequestTimeout(t *testing.T) {
	cfg := aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("test", "test", ""),
		BaseEndpoint: aws.String(silentEndpoint(t)), HTTPClient: &http.Client{Transport: httpTransport}}
	tr := sqs.New(cfg, sqs.WithRequestTimeout(200*time.Millisecond), sqs.WithLogger(slog.New(slog.DiscardHandler)))
	defer tr.Close(context.Background())
	env := &bus.Envelope{Name: "test.job", Body: []byte(`{}`), Attributes: bus.NewAttributes("m-1", "c-1", time.Now(), nil, nil)}
	start := time.Now()
	err := tr.Send(context.Background(), env, "orders")
	if took := time.Since(start); err == nil || !strings.Contains(err.Error(), "got no answer within 200ms") || took > 10*time.Second {
		t.Fatalf("Send on a silent connection: %v after %v, want the request timeout's error after a few attempts of 200ms", err, took)
	}
}
