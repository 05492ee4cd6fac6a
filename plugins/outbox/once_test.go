package outbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugins/outbox"
	"github.com/plugbus/plugbus/store/storetest"
)

// TestOutboxTwiceOnOneBusIsRefused: two outboxes nest a transaction in
// another around each handler and run two relays; bus.New refuses the
// plugin given twice with a *bus.DuplicateMiddlewareError naming it.
func TestOutboxTwiceOnOneBusIsRefused(t *testing.T) {
	db := storetest.New(t, storetest.SQLite)
	st := db.Open(t)
	p := outbox.New(st)
	for name, opts := range map[string][]bus.Option{
		"two plugins":      {bus.WithMiddleware(outbox.New(st), outbox.New(st))},
		"one plugin twice": {bus.WithMiddleware(p, p)},
		"in two options":   {bus.WithMiddleware(p), bus.WithMiddleware(outbox.New(st, outbox.WithoutRelay()))},
		"the bus's and one handler's": {bus.WithMiddleware(p), bus.WithEndpoint("worker"),
			bus.WithHandler(func(ctx context.Context, _ Work, _ bus.Attributes) error { return nil }, bus.HandlerMiddleware(outbox.New(st)))},
	} {
		_, err := bus.New(opts...)
		var dup *bus.DuplicateMiddlewareError
		if !errors.As(err, &dup) || !errors.Is(err, bus.ErrDuplicateMiddleware) || dup.Middleware != "outbox" {
			t.Errorf("%s: New = %v; want a *bus.DuplicateMiddlewareError for outbox", name, err)
		}
	}
}
