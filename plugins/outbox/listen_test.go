package outbox_test

import (
	"context"
	"errors"
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

// After a LISTEN that worked, the relay reconnects after the first backoff
// step again (100 ms), not after an ever-growing one: six connections lost
// right after LISTEN are re-established in well under the 3.1 s that a
// backoff never reset would take (100+200+400+800+1600 ms).
func TestListenBackoffResets(t *testing.T) {
	db := storetest.New(t, storetest.SQLite)
	n := droppingNotifier{calls: make(chan struct{})}
	st := db.Open(t, store.WithNotifier(n))
	b, err := bus.New(bus.WithMiddleware(outbox.New(st)))
	if err != nil {
		t.Fatal(err)
	}
	start(t, b)
	begin := time.Now()
	deadline := time.After(10 * time.Second)
	for range 6 {
		select {
		case <-n.calls:
		case <-deadline:
			t.Fatal("the relay stopped listening")
		}
	}
	if took := time.Since(begin); took > 2*time.Second {
		t.Fatalf("6 reconnects took %s: the backoff is not reset after a LISTEN that worked", took)
	}
}
