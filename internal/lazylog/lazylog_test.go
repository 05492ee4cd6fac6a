package lazylog_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"testing/slogtest"

	"github.com/plugbus/plugbus/internal/lazylog"
)

// countingHandler counts the WithAttrs and WithGroup calls it receives.
type countingHandler struct {
	slog.Handler
	scoped *atomic.Int64
}

func (c countingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c.scoped.Add(1)
	return countingHandler{c.Handler.WithAttrs(as), c.scoped}
}

func (c countingHandler) WithGroup(name string) slog.Handler {
	c.scoped.Add(1)
	return countingHandler{c.Handler.WithGroup(name), c.scoped}
}

func TestScopesReachTheBaseOnlyWhenARecordIsHandled(t *testing.T) {
	var out bytes.Buffer
	var scoped atomic.Int64
	base := countingHandler{slog.NewTextHandler(&out, &slog.HandlerOptions{ReplaceAttr: dropTime}), &scoped}
	l := slog.New(lazylog.New(base)).With("stage", "incoming").WithGroup("g").With("k", 1)
	l.Debug("not enabled")
	if n := scoped.Load(); n != 0 {
		t.Fatalf("the base was scoped %d times before any record", n)
	}
	l.Info("one")
	l.Info("two")
	if got, want := out.String(), "level=INFO msg=one stage=incoming g.k=1\nlevel=INFO msg=two stage=incoming g.k=1\n"; got != want {
		t.Fatalf("output:\n%s\nwant:\n%s", got, want)
	}
	if n := scoped.Load(); n != 3 {
		t.Fatalf("the base was scoped %d times for two records, want 3 (once per scope, kept)", n)
	}
}

func TestNewOfALazyHandlerDoesNotStack(t *testing.T) {
	h := lazylog.New(slog.DiscardHandler)
	if lazylog.New(h) != h {
		t.Fatal("New wrapped a lazy handler in another")
	}
}

func TestFollowUsesTheBaseAsItIsAtEachRecord(t *testing.T) {
	var first, second bytes.Buffer
	var current atomic.Pointer[slog.Logger]
	current.Store(slog.New(slog.NewTextHandler(&first, &slog.HandlerOptions{ReplaceAttr: dropTime, Level: slog.LevelWarn})))
	l := slog.New(lazylog.Follow(func() slog.Handler { return current.Load().Handler() })).With("plugin", "p")
	l.Info("below the first base's level")
	l.Warn("one")
	current.Store(slog.New(slog.NewTextHandler(&second, &slog.HandlerOptions{ReplaceAttr: dropTime})))
	l.Info("two")
	if got, want := first.String(), "level=WARN msg=one plugin=p\n"; got != want {
		t.Fatalf("first base got %q, want %q", got, want)
	}
	if got, want := second.String(), "level=INFO msg=two plugin=p\n"; got != want {
		t.Fatalf("second base got %q, want %q", got, want)
	}
}

// The handler passes the standard library's conformance tests for
// handlers, for a fixed and for a followed base.
func TestHandlerConformance(t *testing.T) {
	for name, wrap := range map[string]func(slog.Handler) slog.Handler{
		"New":    func(h slog.Handler) slog.Handler { return lazylog.New(h) },
		"Follow": func(h slog.Handler) slog.Handler { return lazylog.Follow(func() slog.Handler { return h }) },
	} {
		t.Run(name, func(t *testing.T) {
			var out bytes.Buffer
			slogtest.Run(t, func(*testing.T) slog.Handler {
				out.Reset()
				return wrap(slog.NewJSONHandler(&out, nil))
			}, func(t *testing.T) map[string]any { return parseJSONLine(t, out.String()) })
		})
	}
}

func dropTime(groups []string, a slog.Attr) slog.Attr {
	if len(groups) == 0 && a.Key == slog.TimeKey {
		return slog.Attr{}
	}
	return a
}

func parseJSONLine(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(strings.TrimSpace(s)), &m); err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return m
}
