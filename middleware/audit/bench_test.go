package audit_test

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
	"github.com/plugbus/plugbus/middleware/audit"
)

// BenchmarkHandling measures one handler-stage record, written as JSON
// to nowhere, and one whose level the logger drops.
func BenchmarkHandling(b *testing.B) {
	for _, c := range []struct {
		name  string
		level slog.Level
	}{{"written", slog.LevelInfo}, {"dropped", slog.LevelError}} {
		b.Run(c.name, func(b *testing.B) {
			logger := slog.New(slog.NewJSONHandler(io.Discard, &slog.HandlerOptions{Level: c.level}))
			mw, err := audit.New(audit.WithLogger(logger)).Instantiate(bus.PluginInfo{Handler: "refund"})
			if err != nil {
				b.Fatal(err)
			}
			h := bustest.Handling("refund", refund{OrderID: "o-1"}, bus.Attributes{})
			next := bus.NewHandlingNext(func(context.Context) error { return nil })
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				next.Reset()
				if err := mw.Handling(ctx, h, next); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
