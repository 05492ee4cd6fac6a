package pluginproto_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/plugbus/plugbus/internal/pluginproto"
)

// go-plugin relays a plugin's record with its attributes in map order and
// a "timestamp" last: the host logs them sorted, without the timestamp.
func TestRelayedRecordAttributesAreSorted(t *testing.T) {
	var buf bytes.Buffer
	l := pluginproto.NewHCLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}})))
	l.Info("relayed", "zone", "eu", "attempt", 2, "message_id", "m-1", "timestamp", "2026-12-01T00:00:00Z")
	l.Info("own", "zone", "eu", "attempt", 2)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	want := []string{`level=INFO msg=relayed attempt=2 message_id=m-1 zone=eu`, `level=INFO msg=own zone=eu attempt=2`}
	if len(lines) != 2 || lines[0] != want[0] || lines[1] != want[1] {
		t.Fatalf("logged\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
}
