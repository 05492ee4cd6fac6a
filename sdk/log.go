package sdk

import (
	"context"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/hashicorp/go-hclog"
	"github.com/plugbus/plugbus/internal/pluginproto"
)

// newHostHandler writes records to w (the process's original stderr) as
// the JSON lines go-plugin relays to the host: "@level" and "@message",
// the other attributes as they are. The host stamps the time itself.
func newHostHandler(w io.Writer, level slog.Level) slog.Handler {
	return slog.NewJSONHandler(w, &slog.HandlerOptions{
		Level: level,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) > 0 {
				return a
			}
			switch a.Key {
			case slog.TimeKey:
				return slog.Attr{}
			case slog.LevelKey:
				l, _ := a.Value.Any().(slog.Level)
				name := "info"
				switch {
				case l < slog.LevelInfo:
					name = "debug"
				case l >= slog.LevelError:
					name = "error"
				case l >= slog.LevelWarn:
					name = "warn"
				}
				return slog.String("@level", name)
			case slog.MessageKey:
				return slog.String("@message", a.Value.String())
			}
			return a
		},
	})
}

func levelFromEnv() slog.Level {
	switch strings.ToLower(os.Getenv(pluginproto.LogLevelEnv)) {
	case "debug":
		return slog.LevelDebug
	case "warn":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	}
	return slog.LevelInfo
}

func newHCLogger(l *slog.Logger) hclog.Logger { return pluginproto.NewHCLogger(l) }

// lazyHandler defers WithAttrs and WithGroup to the first record: stage
// contexts scope a logger for every invocation (bus.NewIncoming and
// friends), and most invocations never log.
type lazyHandler struct {
	h   slog.Handler
	ops []func(slog.Handler) slog.Handler
}

func (l lazyHandler) resolve() slog.Handler {
	h := l.h
	for _, op := range l.ops {
		h = op(h)
	}
	return h
}

func (l lazyHandler) Enabled(ctx context.Context, lv slog.Level) bool { return l.h.Enabled(ctx, lv) }

func (l lazyHandler) Handle(ctx context.Context, r slog.Record) error {
	return l.resolve().Handle(ctx, r)
}

func (l lazyHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return lazyHandler{h: l.h, ops: append(l.ops[:len(l.ops):len(l.ops)], func(h slog.Handler) slog.Handler { return h.WithAttrs(as) })}
}

func (l lazyHandler) WithGroup(name string) slog.Handler {
	return lazyHandler{h: l.h, ops: append(l.ops[:len(l.ops):len(l.ops)], func(h slog.Handler) slog.Handler { return h.WithGroup(name) })}
}
