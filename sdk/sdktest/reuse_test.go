package sdktest_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
	"github.com/plugbus/plugbus/internal/testenv"
	"github.com/plugbus/plugbus/sdk"
	"github.com/plugbus/plugbus/sdk/sdktest"
)

type keptCall struct {
	messageID string
	err       error
}

// The plugin process reuses a stream's call and stage context from one
// invocation to the next only when the invocation ended clean: every
// message's context reads and logs that message, and a middleware that
// keeps its context and next past its return keeps the message it was
// given, its late next refused as called after return, while the messages
// after it go through.
func TestStageContextsAreReusedOnlyAfterACleanInvocation(t *testing.T) {
	kept := make(chan keptCall, 1)
	release := make(chan struct{})
	var logs testenv.LogBuffer
	logger := slog.New(slog.NewJSONHandler(&logs, nil))
	keeper := bus.Middleware{Name: "keeper", Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
		in.Logger().Info("seen")
		if _, ok := in.Header("x-keep"); ok {
			go func() {
				<-release
				id := in.Attributes().MessageID
				kept <- keptCall{id, next.Call(ctx)}
			}()
			return nil
		}
		return next.Call(ctx)
	}}
	p := sdktest.Load(t, keeper, sdktest.Wire, sdktest.WithLogger(logger))

	var (
		mu      sync.Mutex
		handled []string
	)
	b := bustest.Start(t, bus.WithEndpoint("orders"), bus.WithMiddleware(p), bus.WithLogger(slog.New(slog.DiscardHandler)),
		bus.WithHandler(func(_ context.Context, _ Order, a bus.Attributes) error {
			mu.Lock()
			handled = append(handled, a.MessageID)
			mu.Unlock()
			return nil
		}))
	for _, id := range []string{"m-1", "m-2", "m-3", "m-4", "m-5", "m-6"} {
		d := bustest.Delivery(Order{ID: id}, bus.Attributes{MessageID: id})
		if id == "m-4" {
			d.Headers = map[string]string{"x-keep": "1"}
		}
		if err := b.Deliver(context.Background(), d); err != nil {
			t.Fatalf("delivering %s: %v", id, err)
		}
	}
	close(release)
	k := <-kept
	var misuse *bus.NextMisuseError
	if k.messageID != "m-4" || !errors.As(k.err, &misuse) || !misuse.AfterReturn {
		t.Fatalf("the kept context read %q and its next returned %v; want m-4 and next refused after return", k.messageID, k.err)
	}
	mu.Lock()
	got := strings.Join(handled, ",")
	mu.Unlock()
	if got != "m-1,m-2,m-3,m-5,m-6" {
		t.Fatalf("handled %s, want every message but the kept one", got)
	}
	for _, id := range []string{"m-1", "m-2", "m-3", "m-4", "m-5", "m-6"} {
		if !strings.Contains(logs.String(), `"msg":"seen","stage":"incoming","middleware":"keeper","message_name":"probe.order","message_id":"`+id+`"`) {
			t.Fatalf("no record of %s scoped with its own message:\n%s", id, logs.String())
		}
	}
}

type incomingKey struct{}

// A before-only middleware's stage context stays valid while the host's
// next runs, as in process (where the middleware is still on the stack):
// one put into the context it gives next reads its own message from the
// same plugin's handler stage, though the plugin answered the incoming
// invocation before the host ran next.
func TestAHeldContextKeepsItsStageContext(t *testing.T) {
	keeper := sdk.BeforeOnly(bus.Middleware{Name: "keeper",
		Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
			return next.Call(context.WithValue(ctx, incomingKey{}, in))
		},
		Handling: func(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
			in, ok := ctx.Value(incomingKey{}).(*bus.Incoming)
			if !ok {
				return errors.New("no incoming stage context in ctx")
			}
			if got, want := in.Attributes().MessageID, h.Attributes().MessageID; got != want {
				return fmt.Errorf("the incoming stage context reads %s in the handler stage of %s", got, want)
			}
			return next.Call(ctx)
		},
	}, bus.StageIncoming)
	p := sdktest.Load(t, keeper, sdktest.Wire)
	handled := make(chan string, 10)
	b := bustest.Start(t, bus.WithEndpoint("orders"), bus.WithMiddleware(p), bus.WithLogger(slog.New(slog.DiscardHandler)),
		bus.WithHandler(func(_ context.Context, _ Order, a bus.Attributes) error {
			handled <- a.MessageID
			return nil
		}))
	for _, id := range []string{"m-1", "m-2", "m-3"} {
		if err := b.Deliver(context.Background(), bustest.Delivery(Order{ID: id}, bus.Attributes{MessageID: id})); err != nil {
			t.Fatalf("delivering %s: %v", id, err)
		}
		if got := <-handled; got != id {
			t.Fatalf("handled %s, want %s", got, id)
		}
	}
}
