package sqlstore

import (
	"context"
	"log/slog"
	"time"
)

// RunPurge calls purge every interval until ctx ends, logging failures
// (retried at the next interval) and how many rows each run deleted. The
// inbox and outbox cleanup jobs run on it; what names the job in logs.
func RunPurge(ctx context.Context, every time.Duration, logger *slog.Logger, what string, purge func(context.Context) (int64, error)) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := purge(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			logger.WarnContext(ctx, what+" failed; retrying at the next interval", slog.Any("error", err))
		case n > 0:
			logger.DebugContext(ctx, what, slog.Int64("deleted", n))
		}
	}
}
