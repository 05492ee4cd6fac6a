package requestreply_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugins/outbox"
	"github.com/plugbus/plugbus/plugins/requestreply"
	"github.com/plugbus/plugbus/store/storetest"
	"github.com/plugbus/plugbus/transports/memory"
)

type getKey struct{ K string }

func (getKey) MessageName() string { return "rr.outbox.get" }

type keyValue struct{ V string }

func (keyValue) MessageName() string { return "rr.outbox.value" }

// TestErrorReplyWithOutbox: a responder whose handler fails with a
// *requestreply.Error, with the durable outbox as the inner middleware.
// The error reply is sent by requestreply after the outbox's transaction
// rolled back: it must go to the bus's buffer (UseOutbox's restore), not
// into the rolled-back transaction, and reach the requester.
func TestErrorReplyWithOutbox(t *testing.T) {
	for _, order := range []string{"requestreply first", "outbox first"} {
		t.Run(order, func(t *testing.T) {
			storetest.Each(t, func(t *testing.T, db storetest.DB) {
				st := db.Open(t)
				broker := memory.NewBroker()
				mws := []bus.Plugin{requestreply.New(), outbox.New(st, outbox.WithPollInterval(50*time.Millisecond))}
				if order == "outbox first" {
					mws[0], mws[1] = mws[1], mws[0]
				}
				resp, err := bus.New(bus.WithEndpoint("kv"), bus.WithTransport(memory.New(memory.WithBroker(broker))),
					bus.WithLogger(slog.New(slog.DiscardHandler)), bus.WithMaxAttempts(2), bus.WithMiddleware(mws...),
					bus.WithHandler(func(ctx context.Context, m getKey, _ bus.Attributes) error {
						return requestreply.Errorf("not_found", "no key %q", m.K)
					}))
				if err != nil {
					t.Fatal(err)
				}
				req, err := bus.New(bus.WithTransport(memory.New(memory.WithBroker(broker))), bus.WithMiddleware(requestreply.New()))
				if err != nil {
					t.Fatal(err)
				}
				startAll(t, resp, req)
				_, err = requestreply.Request[keyValue](context.Background(), req, getKey{K: "a"}, requestreply.To("kv"), requestreply.WithTimeout(10*time.Second))
				var re *requestreply.Error
				if !errors.As(err, &re) || !errors.Is(err, requestreply.ErrResponder) || re.Code != "not_found" {
					t.Fatalf("Request = %v, want the responder's *requestreply.Error not_found", err)
				}
			})
		})
	}
}

// A Request made inside outbox.Within goes out at once (it is sent with
// bus.Immediately), not into the transaction that waits for its reply.
func TestRequestInsideWithin(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db storetest.DB) {
		st := db.Open(t)
		broker := memory.NewBroker()
		quiet := slog.New(slog.DiscardHandler)
		resp, err := bus.New(bus.WithEndpoint("kv"), bus.WithTransport(memory.New(memory.WithBroker(broker))), bus.WithLogger(quiet),
			bus.WithMiddleware(requestreply.New()),
			bus.WithHandler(func(ctx context.Context, m getKey, _ bus.Attributes) error {
				return requestreply.Reply(ctx, keyValue{V: "value of " + m.K})
			}))
		if err != nil {
			t.Fatal(err)
		}
		req, err := bus.New(bus.WithTransport(memory.New(memory.WithBroker(broker))), bus.WithLogger(quiet),
			bus.WithMiddleware(requestreply.New(), outbox.New(st, outbox.WithPollInterval(time.Hour))))
		if err != nil {
			t.Fatal(err)
		}
		startAll(t, resp, req)
		var got keyValue
		err = outbox.Within(context.Background(), req, st, func(ctx context.Context, _ *sql.Tx) error {
			got, err = requestreply.Request[keyValue](ctx, req, getKey{K: "a"}, requestreply.To("kv"), requestreply.WithTimeout(10*time.Second))
			return err
		})
		if err != nil || got.V != "value of a" {
			t.Fatalf("Request inside Within = %+v, %v", got, err)
		}
	})
}

// startAll starts the buses and stops them when the test ends.
func startAll(t *testing.T, buses ...*bus.Bus) {
	t.Helper()
	for _, b := range buses {
		if err := b.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := b.Stop(context.Background()); err != nil {
				t.Error(err)
			}
		})
	}
}
