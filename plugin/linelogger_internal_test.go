package plugin

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// records collects the messages logged through it.
type records struct {
	mu   sync.Mutex
	msgs []string
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, rec.Message)
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

// What a plugin prints without a newline (a progress bar redrawn with
// \r, binary data) is logged in pieces of at most maxLogLine bytes, as
// go-plugin logs the plugin's stderr, instead of being held by the host
// until a newline that may never come: the host's memory does not grow
// with what a plugin prints, and the output is not lost.
func TestPluginOutputWithoutNewlineIsLoggedInPieces(t *testing.T) {
	var r records
	w := &lineLogger{l: slog.New(&r), stream: "stdout"}
	chunk := bytes.Repeat([]byte("x"), 4<<10)
	const total = 1 << 20
	for range total / len(chunk) {
		if _, err := w.Write(chunk); err != nil {
			t.Fatal(err)
		}
		if held := len(w.buf); held > maxLogLine {
			t.Fatalf("the host holds %d bytes of a line without newline, want at most %d", held, maxLogLine)
		}
	}
	if _, err := w.Write([]byte("\nnext line\n")); err != nil {
		t.Fatal(err)
	}
	logged := 0
	for _, m := range r.msgs[:len(r.msgs)-1] {
		if len(m) > maxLogLine || strings.Trim(m, "x") != "" {
			t.Fatalf("a piece of %d bytes (%.20q...), want at most %d bytes of the line", len(m), m, maxLogLine)
		}
		logged += len(m)
	}
	if logged != total || r.msgs[len(r.msgs)-1] != "next line" {
		t.Fatalf("logged %d bytes of the long line and then %q, want %d and \"next line\"", logged, r.msgs[len(r.msgs)-1], total)
	}
}
