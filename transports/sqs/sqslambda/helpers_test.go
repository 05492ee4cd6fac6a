package sqslambda_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"go.uber.org/goleak"

	"github.com/plugbus/plugbus/internal/sqstest"
	"github.com/plugbus/plugbus/transports/sqs"
	"github.com/plugbus/plugbus/transports/transporttest"
)

// httpTransport is shared by the tests' AWS clients, so that TestMain can
// close its idle connections before looking for leaked goroutines.
var httpTransport = &http.Transport{MaxIdleConns: 64, MaxIdleConnsPerHost: 32, IdleConnTimeout: 30 * time.Second}

func TestMain(m *testing.M) {
	code := m.Run()
	httpTransport.CloseIdleConnections()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// awsConfig points the SDK at the local emulator with static credentials.
func awsConfig(t testing.TB) aws.Config {
	t.Helper()
	return sqstest.Config(t, &http.Client{Transport: httpTransport})
}

// fastOptions keep tests quick: short long polls, immediate retries.
func fastOptions(prefix string, extra ...sqs.Option) []sqs.Option {
	return append([]sqs.Option{
		sqs.WithPrefix(prefix),
		sqs.WithWaitTime(time.Second),
		sqs.WithVisibilityTimeout(5 * time.Second),
		sqs.WithRetryBackoff(0, 0),
	}, extra...)
}

// uniquePrefix returns a prefix for the queues and topics of one test and
// deletes them all when the test ends.
func uniquePrefix(t testing.TB, cfg aws.Config) string {
	t.Helper()
	prefix := transporttest.Name("pbl") + "-"
	t.Cleanup(func() { sqstest.DeleteResources(t, cfg, prefix) })
	return prefix
}

// openTransport returns a transport with fastOptions on a fresh prefix,
// closed at the end of the test (before its queues are deleted).
func openTransport(t testing.TB) *sqs.Transport {
	t.Helper()
	cfg := awsConfig(t)
	tr := sqs.New(cfg, fastOptions(uniquePrefix(t, cfg))...)
	t.Cleanup(func() { _ = tr.Close(context.Background()) })
	return tr
}

// logRecorder keeps what a JSON slog handler writes, for tests to read.
type logRecorder struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logRecorder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p) // slog's handlers write one record per call
}

func (l *logRecorder) logger() *slog.Logger { return slog.New(slog.NewJSONHandler(l, nil)) }

// warnings returns the WARN records whose message contains msg.
func (l *logRecorder) warnings(t *testing.T, msg string) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for line := range bytes.Lines(l.buf.Bytes()) {
		var rec map[string]any
		if err := json.Unmarshal(line, &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if rec["level"] == "WARN" && strings.Contains(rec["msg"].(string), msg) {
			out = append(out, rec)
		}
	}
	return out
}
