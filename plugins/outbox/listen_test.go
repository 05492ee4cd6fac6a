package outbox_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugins/outbox"
	"github.com/plugbus/plugbus/store"
	"github.com/plugbus/plugbus/store/storetest"
)

// droppingNotifier listens successfully (it wakes once, as
// postgres.Notifier does after LISTEN) and then loses the connection.
type droppingNotifier struct{ calls chan struct{} }

func (d droppingNotifier) Listen(ctx context.Context, _ string, wake func()) error {
	wake()
	select {
	case d.calls <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	return errors.New("connection lost")
}

// listenFailures is a log handler handing the relay's "listening for
// commits failed" records to a channel.
type listenFailures chan slog.Record

func (l listenFailures) Enabled(context.Context, slog.Level) bool { return true }

func (l listenFailures) Handle(_ context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, "outbox relay: listening for commits failed") {
		l <- r
	}
	return nil
}

func (l listenFailures) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l listenFailures) WithGroup(string) slog.Handler      { return l }

// After a LISTEN that worked, the relay reconnects after the first
// back-off step again (retry 1, at most 100 ms), not after an
// ever-growing one: six connections lost right after LISTEN each log
// retry 1 and are re-established quickly.
func TestListenBackoffResets(t *testing.T) {
	db := storetest.New(t, storetest.SQLite)
	n := droppingNotifier{calls: make(chan struct{})}
	st := db.Open(t, store.WithNotifier(n))
	failures := make(listenFailures, 16)
	b, err := bus.New(bus.WithMiddleware(outbox.New(st)), bus.WithLogger(slog.New(failures)))
	if err != nil {
		t.Fatal(err)
	}
	start(t, b)
	begin := time.Now()
	deadline := time.After(10 * time.Second)
	for i := range 6 {
		select {
		case <-n.calls:
		case <-deadline:
			t.Fatal("the relay stopped listening")
		}
		if i == 0 {
			continue // the first LISTEN
		}
		var rec slog.Record
		select {
		case rec = <-failures:
		case <-deadline:
			t.Fatal("the lost connection was not logged")
		}
		var retry, backoff slog.Value
		rec.Attrs(func(a slog.Attr) bool {
			switch a.Key {
			case "retry":
				retry = a.Value
			case "backoff":
				backoff = a.Value
			}
			return true
		})
		if retry.Kind() != slog.KindInt64 || retry.Int64() != 1 || backoff.Kind() != slog.KindDuration || backoff.Duration() > outbox.DefaultBackoffInitial {
			t.Fatalf("reconnect %d logged retry %v, backoff %v; want retry 1 within %s: the back-off is not reset after a LISTEN that worked", i, retry, backoff, outbox.DefaultBackoffInitial)
		}
	}
	if took := time.Since(begin); took > 2*time.Second {
		t.Fatalf("6 reconnects took %s: the backoff is not reset after a LISTEN that worked", took)
	}
}
