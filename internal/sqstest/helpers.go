package sqstest

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"go.uber.org/goleak"

	"github.com/plugbus/plugbus/internal/testenv"
	"github.com/plugbus/plugbus/transports/sqs"
	"github.com/plugbus/plugbus/transports/transporttest"
)

// Main runs a package's tests, closes the idle connections of client (the
// HTTP transport its AWS clients share), then fails the run when a
// goroutine leaked.
func Main(m *testing.M, client *http.Transport) {
	code := m.Run()
	client.CloseIdleConnections()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// New returns sqs.New(cfg, opts...), failing t when New refuses the
// options.
func New(t testing.TB, cfg aws.Config, opts ...sqs.Option) *sqs.Transport {
	t.Helper()
	tr, err := sqs.New(cfg, opts...)
	if err != nil {
		t.Fatalf("sqs.New: %v", err)
	}
	return tr
}

// FastOptions keep tests quick: short long polls and visibility timeouts.
func FastOptions(prefix string, extra ...sqs.Option) []sqs.Option {
	return append([]sqs.Option{
		sqs.WithPrefix(prefix),
		sqs.WithWaitTime(time.Second),
		sqs.WithVisibilityTimeout(5 * time.Second),
	}, extra...)
}

// UniquePrefix returns a prefix for the queues and topics of one test and
// deletes them all when the test ends.
func UniquePrefix(t testing.TB, cfg aws.Config) string {
	t.Helper()
	prefix := transporttest.Name("pbt") + "-"
	t.Cleanup(func() { DeleteResources(t, cfg, prefix) })
	return prefix
}

// LogRecorder keeps what a JSON slog handler writes, for tests to read
// (slog's handlers write one record per call).
type LogRecorder struct {
	testenv.LogBuffer
}

// Logger returns a logger writing JSON records of level info and above to l.
func (l *LogRecorder) Logger() *slog.Logger { return slog.New(slog.NewJSONHandler(l, nil)) }

// DebugLogger returns a logger writing every record, debug included, to l.
func (l *LogRecorder) DebugLogger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// Warnings returns the WARN records whose message contains msg.
func (l *LogRecorder) Warnings(t *testing.T, msg string) []map[string]any {
	t.Helper()
	return l.Records(t, "WARN", msg)
}

// Records returns the records of level whose message contains msg.
func (l *LogRecorder) Records(t *testing.T, level, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for line := range strings.Lines(l.String()) {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if rec["level"] == level && strings.Contains(rec["msg"].(string), msg) {
			out = append(out, rec)
		}
	}
	return out
}
