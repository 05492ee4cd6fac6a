package pluginproto

import (
	"context"
	"io"
	"log"
	"log/slog"
	"slices"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// NewHCLogger adapts l to the hclog.Logger go-plugin logs through, on both
// sides. Records go to l at the matching slog level (trace becomes debug);
// the "timestamp" key go-plugin adds to relayed plugin records is dropped,
// since l stamps its own.
func NewHCLogger(l *slog.Logger) hclog.Logger { return &hcLogger{l: l} }

type hcLogger struct {
	l    *slog.Logger
	name string
}

func slogLevel(level hclog.Level) slog.Level {
	switch level {
	case hclog.Trace, hclog.Debug:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	case hclog.Error:
		return slog.LevelError
	}
	return slog.LevelInfo
}

func (h *hcLogger) Log(level hclog.Level, msg string, args ...any) {
	if level == hclog.Off {
		return
	}
	lv := slogLevel(level)
	ctx := context.Background()
	if !h.l.Enabled(ctx, lv) {
		return
	}
	relayed := false
	for i := 0; i+1 < len(args); i += 2 {
		switch k, _ := args[i].(string); k {
		case "timestamp":
			args = append(args[:i:i], args[i+2:]...)
			i -= 2
			relayed = true
		case "plugin": // go-plugin's own key for the binary; ours names the plugin
			args[i] = "plugin_path"
		}
	}
	if relayed {
		// go-plugin decodes a plugin's record into a map, losing the
		// attributes' order: log them sorted by key, the same every time.
		args = sortedPairs(args)
	}
	h.l.Log(ctx, lv, msg, args...)
}

// sortedPairs returns key-value args sorted by key; a trailing odd value
// stays last.
func sortedPairs(args []any) []any {
	n := len(args) / 2
	pairs := make([][2]any, n)
	for i := range pairs {
		pairs[i] = [2]any{args[2*i], args[2*i+1]}
	}
	slices.SortStableFunc(pairs, func(a, b [2]any) int {
		ka, _ := a[0].(string)
		kb, _ := b[0].(string)
		return strings.Compare(ka, kb)
	})
	out := make([]any, 0, len(args))
	for _, p := range pairs {
		out = append(out, p[0], p[1])
	}
	return append(out, args[2*n:]...)
}

func (h *hcLogger) Trace(msg string, args ...any) { h.Log(hclog.Trace, msg, args...) }
func (h *hcLogger) Debug(msg string, args ...any) { h.Log(hclog.Debug, msg, args...) }
func (h *hcLogger) Info(msg string, args ...any)  { h.Log(hclog.Info, msg, args...) }
func (h *hcLogger) Warn(msg string, args ...any)  { h.Log(hclog.Warn, msg, args...) }
func (h *hcLogger) Error(msg string, args ...any) { h.Log(hclog.Error, msg, args...) }

func (h *hcLogger) enabled(l slog.Level) bool { return h.l.Enabled(context.Background(), l) }
func (h *hcLogger) IsTrace() bool             { return h.enabled(slog.LevelDebug) }
func (h *hcLogger) IsDebug() bool             { return h.enabled(slog.LevelDebug) }
func (h *hcLogger) IsInfo() bool              { return h.enabled(slog.LevelInfo) }
func (h *hcLogger) IsWarn() bool              { return h.enabled(slog.LevelWarn) }
func (h *hcLogger) IsError() bool             { return h.enabled(slog.LevelError) }
func (h *hcLogger) ImpliedArgs() []any        { return nil }
func (h *hcLogger) With(args ...any) hclog.Logger {
	return &hcLogger{l: h.l.With(args...), name: h.name}
}
func (h *hcLogger) Name() string                        { return h.name }
func (h *hcLogger) Named(name string) hclog.Logger      { return &hcLogger{l: h.l, name: name} }
func (h *hcLogger) ResetNamed(name string) hclog.Logger { return &hcLogger{l: h.l, name: name} }
func (h *hcLogger) SetLevel(hclog.Level)                {}

func (h *hcLogger) GetLevel() hclog.Level {
	switch {
	case h.IsDebug():
		return hclog.Trace
	case h.IsInfo():
		return hclog.Info
	case h.IsWarn():
		return hclog.Warn
	case h.IsError():
		return hclog.Error
	}
	return hclog.Off
}

func (h *hcLogger) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(h.StandardWriter(opts), "", 0)
}

func (h *hcLogger) StandardWriter(*hclog.StandardLoggerOptions) io.Writer { return lineWriter{h} }

type lineWriter struct{ h *hcLogger }

func (w lineWriter) Write(p []byte) (int, error) {
	w.h.Info(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// LevelName names l for [LogLevelEnv].
func LevelName(l *slog.Logger) string {
	ctx := context.Background()
	switch {
	case l.Enabled(ctx, slog.LevelDebug):
		return "debug"
	case l.Enabled(ctx, slog.LevelInfo):
		return "info"
	case l.Enabled(ctx, slog.LevelWarn):
		return "warn"
	}
	return "error"
}
