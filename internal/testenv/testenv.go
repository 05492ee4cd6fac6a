// Package testenv finds the services integration tests need, and starts
// those a test must have to itself (a RabbitMQ node it restarts:
// [StartRabbitMQNode]). When a service is absent a test skips with how to
// start it, except under CI=true, where an absent service fails the test.
package testenv

import (
	"context"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"
)

// CI reports whether the tests run under CI (CI=true).
func CI() bool { return os.Getenv("CI") == "true" }

// Require skips t (or fails it under CI=true) unless addr accepts TCP
// connections. howTo says how to start the service.
func Require(t testing.TB, service, addr, howTo string) {
	t.Helper()
	if err := Dial(addr); err != nil {
		msg := service + " is not reachable at " + addr + " (" + err.Error() + "); start it with: " + howTo + " (or run `make test`, which starts it)"
		if CI() {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
}

// Dial checks that addr accepts TCP connections.
func Dial(addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	return c.Close()
}

// Getenv returns the environment variable key, or def when it is empty.
func Getenv(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// RabbitMQ returns the AMQP URL of the test broker (PLUGBUS_AMQP_URL,
// default amqp://guest:guest@127.0.0.1:5672/), skipping t when it is absent.
func RabbitMQ(t testing.TB) string {
	t.Helper()
	Require(t, "RabbitMQ", Getenv("PLUGBUS_AMQP_ADDR", "127.0.0.1:5672"), "rabbitmq-server -detached")
	return Getenv("PLUGBUS_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
}

// Postgres returns the connection string of the test database
// (PLUGBUS_POSTGRES_DSN, default postgres://postgres@127.0.0.1:5432/test),
// skipping t when it is absent.
func Postgres(t testing.TB) string {
	t.Helper()
	Require(t, "PostgreSQL", Getenv("PLUGBUS_POSTGRES_ADDR", "127.0.0.1:5432"),
		"pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start")
	return Getenv("PLUGBUS_POSTGRES_DSN", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
}

// SQS returns the endpoint URL of the local AWS-compatible server
// (PLUGBUS_SQS_ENDPOINT, default http://127.0.0.1:4566), skipping t when it
// is absent.
func SQS(t testing.TB) string {
	t.Helper()
	Require(t, "the SQS/SNS emulator (fauxqs)", Getenv("PLUGBUS_SQS_ADDR", "127.0.0.1:4566"), "scripts/services.sh sqs")
	return Getenv("PLUGBUS_SQS_ENDPOINT", "http://127.0.0.1:4566")
}

// SilentServer starts a TCP server on 127.0.0.1 that accepts connections
// and reads from them, never answering: a service behind a connection
// that went silent without closing (half-open). It returns its host:port
// and stops, closing every connection, when t ends.
func SilentServer(t testing.TB) string {
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
	return ln.Addr().String()
}
