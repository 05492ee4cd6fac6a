package rabbitmq_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/testenv"
	"github.com/plugbus/plugbus/transports/rabbitmq"
)

const deadBrokerPassword = "s3cret-Pa55word"

// deadBroker returns the URL of a loopback port nothing listens on (with
// a password the logs must never show) and that URL as the transport
// reports it.
func deadBroker(t *testing.T) (url, redacted string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return "amqp://plugbus:" + deadBrokerPassword + "@" + addr + "/", "amqp://plugbus:xxxxx@" + addr + "/"
}

// deadTransport is a transport for a dead broker whose logs are recorded.
func deadTransport(t *testing.T) (*rabbitmq.Transport, *recordedLogs, string) {
	t.Helper()
	url, redacted := deadBroker(t)
	logs := newRecordedLogs()
	tr, err := rabbitmq.New(url, rabbitmq.WithBackoff(bus.Backoff{Initial: 10 * time.Millisecond, Max: 40 * time.Millisecond}), rabbitmq.WithLogger(logs.logger()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := tr.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return tr, logs, redacted
}

// checkConnectWarnings checks that at least n failed connection attempts
// were logged at warn level, each with the address (password redacted),
// its number and the time of the next, and that no line shows the password.
func checkConnectWarnings(t *testing.T, logs *recordedLogs, redacted string, n int) {
	t.Helper()
	ctx := testContext(t, 10*time.Second)
	warns := logs.await(ctx, slog.LevelWarn, "connecting to RabbitMQ failed", n)
	if len(warns) < n {
		t.Fatalf("%d failed connection attempts logged at warn level, want at least %d; logs:\n%s", len(warns), n, logs)
	}
	for i, w := range warns {
		retryAt, err := time.Parse(time.RFC3339Nano, w.attrs["retry_at"])
		if w.attrs["address"] != redacted || w.attrs["attempt"] == "" || err != nil || retryAt.IsZero() || !strings.Contains(w.attrs["error"], "connection refused") {
			t.Errorf("warning %d: %s; want address=%s, the attempt, the error and retry_at", i, w.text, redacted)
		}
	}
	if strings.Contains(logs.String(), deadBrokerPassword) {
		t.Errorf("the password appears in the logs:\n%s", logs)
	}
}

// Start of a bus that receives connects: against a broker that is down it
// retries, logging each attempt, until its context ends, and then returns
// an *UnreachableError that says where it tried and why it failed.
func TestStartAgainstDeadBrokerEndsWithItsContext(t *testing.T) {
	tr, logs, redacted := deadTransport(t)
	b, err := bus.New(bus.WithEndpoint("dead-broker"), bus.WithTransport(tr),
		bus.WithHandler(func(context.Context, order, bus.Attributes) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop(context.Background()) })
	const wait = 500 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	began := time.Now()
	err = b.Start(ctx)
	if took := time.Since(began); took > wait+2*time.Second {
		t.Errorf("Start returned %v after its context ended", took-wait)
	}
	var ue *rabbitmq.UnreachableError
	if !errors.As(err, &ue) || !errors.Is(err, rabbitmq.ErrUnreachable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Start against a dead broker: %v, want a *rabbitmq.UnreachableError", err)
	}
	if ue.Address != redacted || ue.Attempts < 2 || ue.Last == nil || !strings.Contains(err.Error(), "connection refused") || !strings.Contains(ue.Op, "dead-broker") {
		t.Errorf("UnreachableError %+v (%v); want the redacted address, the attempts and the last failure", ue, err)
	}
	if strings.Contains(err.Error(), deadBrokerPassword) {
		t.Errorf("the error shows the password: %v", err)
	}
	checkConnectWarnings(t, logs, redacted, 2)
}

// With a context that never ends, Start waits for the broker for as long
// as it takes, logging every failed attempt, and returns once the
// transport is closed.
func TestStartWithoutDeadlineLogsEveryAttempt(t *testing.T) {
	tr, logs, redacted := deadTransport(t)
	b, err := bus.New(bus.WithEndpoint("dead-broker"), bus.WithTransport(tr),
		bus.WithHandler(func(context.Context, order, bus.Attributes) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan error, 1)
	go func() { started <- b.Start(context.Background()) }()
	checkConnectWarnings(t, logs, redacted, 3)
	select {
	case err := <-started:
		t.Fatalf("Start returned %v with the broker down and no deadline", err)
	default:
	}
	if err := tr.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-started:
		if !errors.Is(err, bus.ErrClosed) {
			t.Errorf("Start after Close: %v, want bus.ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Start still waiting after the transport was closed")
	}
	_ = b.Stop(context.Background())
}

// A send-only bus never calls Setup: its Start connects (the transport is
// a bus.Connector) and fails when its context ends, and a later Send
// connects and waits as long as its own context allows.
func TestSendOnlyBusStartConnects(t *testing.T) {
	tr, logs, redacted := deadTransport(t)
	b, err := bus.New(bus.WithTransport(tr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop(context.Background()) })
	var ue *rabbitmq.UnreachableError
	if err := b.Start(testContext(t, 300*time.Millisecond)); !errors.As(err, &ue) || ue.Op != "Connect" || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Start of a send-only bus against a dead broker: %v, want a *rabbitmq.UnreachableError", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := tr.Connect(ctx); !errors.As(err, &ue) || ue.Op != "Connect" || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Connect to a dead broker: %v, want a *rabbitmq.UnreachableError", err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := b.Send(ctx, order{ID: 1}, bus.To("somewhere")); !errors.As(err, &ue) || !strings.Contains(ue.Op, "send of test.order to somewhere") {
		t.Errorf("Send to a dead broker: %v, want a *rabbitmq.UnreachableError", err)
	}
	checkConnectWarnings(t, logs, redacted, 2)
}

// Connect against a running broker returns once connected, which the
// transport logs with the address and no password.
func TestConnectLogsTheConnection(t *testing.T) {
	url := testenv.RabbitMQ(t)
	logs := newRecordedLogs()
	tr, err := rabbitmq.New(url, rabbitmq.WithLogger(logs.logger()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Close(context.Background()) })
	if err := tr.Connect(testContext(t, 10*time.Second)); err != nil {
		t.Fatalf("Connect: %v", err)
	}
	infos := logs.matching(slog.LevelInfo, "connected to RabbitMQ")
	if len(infos) != 1 || infos[0].attrs["address"] == "" {
		t.Errorf("connection logged as %v, want one info line with the address", infos)
	}
	if err := tr.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := tr.Connect(context.Background()); !errors.Is(err, bus.ErrClosed) {
		t.Errorf("Connect after Close: %v, want bus.ErrClosed", err)
	}
}
