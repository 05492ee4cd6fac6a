package pluginproto

import (
	"context"
	"io"
	"log"
	"log/slog"
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
	for i := 0; i+1 < len(args); i += 2 {
		switch k, _ := args[i].(string); k {
		case "timestamp":
			args = append(args[:i:i], args[i+2:]...)
			i -= 2
		case "plugin": // go-plugin's own key for the binary; ours names the plugin
			args[i] = "plugin_path"
		}
	}
	h.l.Log(ctx, lv, msg, args...)
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
