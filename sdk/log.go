package sdk

import (
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
