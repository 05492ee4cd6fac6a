package bus_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
)

// What a handler sends reaches the transport only once the handler
// succeeded.
func TestSendsBufferedUntilHandlerSucceeds(t *testing.T) {
	release := make(chan struct{})
	sent := make(chan struct{})
	delivered := make(chan string, 2)
	e := newEnv(t, nil, bus.WithConcurrency(2),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			if err := handlingBus(ctx).Send(ctx, chargeCard{OrderID: m.ID}); err != nil {
				return err
			}
			close(sent)
			<-release
			return nil
		}),
		bus.WithHandler(func(ctx context.Context, m chargeCard, a bus.Attributes) error { delivered <- m.OrderID; return nil }))
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}); err != nil {
		t.Fatal(err)
	}
	await(t, sent)
	if got := e.chargesSentTo("ep"); len(got) != 0 {
		t.Fatalf("%v reached the transport before the handler returned", got)
	}
	close(release)
	if got := await(t, delivered); got != "1" {
		t.Fatalf("delivered %s", got)
	}
}

// Outgoing middleware runs when a handler sends, and not again when the
// handler's buffer is flushed.
func TestFlushDoesNotRerunOutgoing(t *testing.T) {
	var mu sync.Mutex
	var outgoing []string
	inHandler := make(chan bool, 4)
	done := make(chan struct{}, 1)
	e := newEnv(t, nil,
		bus.WithMiddleware(bus.Middleware{Name: "count", Outgoing: func(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
			mu.Lock()
			outgoing = append(outgoing, out.Name())
			mu.Unlock()
			inHandler <- out.InHandler()
			return next.Call(ctx)
		}}),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			if err := handlingBus(ctx).Send(ctx, chargeCard{OrderID: m.ID}); err != nil {
				return err
			}
			mu.Lock()
			n := len(outgoing)
			mu.Unlock()
			if n != 2 {
				return errors.New("outgoing did not run at Send time")
			}
			return nil
		}),
		bus.WithHandler(func(ctx context.Context, m chargeCard, a bus.Attributes) error { done <- struct{}{}; return nil }))
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}); err != nil {
		t.Fatal(err)
	}
	await(t, done)
	e.expect(bustest.Deleted)
	e.expect(bustest.Deleted)
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(outgoing, []string{"shop.order_placed", "shop.charge_card"}) {
		t.Fatalf("outgoing ran for %v, want once per send", outgoing)
	}
	if a, b := <-inHandler, <-inHandler; a || !b {
		t.Fatalf("InHandler: outside %v inside %v", a, b)
	}
}

// A send with the context of a handler that returned is refused: its
// buffer was flushed already.
func TestSendAfterHandlerReturnedIsRefused(t *testing.T) {
	kept := make(chan context.Context, 1)
	e := newEnv(t, nil, bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
		kept <- ctx
		return nil
	}))
	if err := e.bus.Send(t.Context(), orderPlaced{}); err != nil {
		t.Fatal(err)
	}
	ctx := await(t, kept)
	e.expect(bustest.Deleted)
	if err := e.bus.Send(ctx, chargeCard{}, bus.To("ep")); err == nil || !strings.Contains(err.Error(), "already returned") {
		t.Fatalf("send with a finished handler's context: %v", err)
	}
}

// A send with Immediately reaches the transport before the handler
// returns, and stays sent when the handler fails; the handler's other
// sends are discarded.
func TestImmediatelyBypassesTheHandlerOutbox(t *testing.T) {
	inHandler := make(chan bool, 2)
	var e *env
	e = newEnv(t, nil,
		bus.WithMiddleware(bus.Middleware{Name: "see", Outgoing: func(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
			inHandler <- out.InHandler()
			return next.Call(ctx)
		}}),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			b := handlingBus(ctx)
			if err := b.Send(ctx, chargeCard{OrderID: "now"}, bus.To("listener"), bus.Immediately()); err != nil {
				return err
			}
			if got := e.chargesSentTo("listener"); !slices.Equal(got, []string{"now"}) {
				return fmt.Errorf("sent %v before the handler returned, want the immediate send", got)
			}
			if err := b.Send(ctx, chargeCard{OrderID: "buffered"}, bus.To("listener")); err != nil {
				return err
			}
			return errors.New("handler fails: its buffered send is discarded, the immediate one is out")
		}), bus.WithMaxAttempts(1))
	if err := e.bus.Send(t.Context(), orderPlaced{}, bus.WithStickyAttribute("tenant", "acme")); err != nil {
		t.Fatal(err)
	}
	<-inHandler // the outer send
	s := e.expect(bustest.DeadLettered)
	if !strings.Contains(s.Failure.Reason, "handler fails") {
		t.Fatalf("failed with %q", s.Failure.Reason)
	}
	if a, b := <-inHandler, <-inHandler; a || !b {
		t.Fatalf("InHandler: immediate %v, buffered %v", a, b)
	}
	if got := e.chargesSentTo("listener"); !slices.Equal(got, []string{"now"}) {
		t.Fatalf("sent %v, want the immediate send only", got)
	}
}

// An outbox put in the context takes what its bus sends, not what
// another bus sends.
func TestContextWithOutboxTakesTheMessagesOfItsBusOnly(t *testing.T) {
	b, err := bus.New(bus.WithLogger(discard()), bus.WithRoute("ep", chargeCard{}))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop(context.Background())
	var box memoryOutbox
	ctx := bus.ContextWithOutbox(t.Context(), b, &box)
	if err := b.Send(ctx, chargeCard{OrderID: "1"}, bus.WithMessageID("m-1")); err != nil {
		t.Fatal(err)
	}
	if len(box) != 1 || box[0].Envelope.Attributes.MessageID != "m-1" || box[0].Destination != "ep" || box[0].Kind != bus.KindSend {
		t.Fatalf("outbox got %+v", box)
	}
	other, _ := bus.New(bus.WithLogger(discard()), bus.WithRoute("ep", chargeCard{}))
	defer other.Stop(context.Background())
	if err := other.Send(ctx, chargeCard{}); err != nil { // another bus ignores it
		t.Fatal(err)
	}
	if len(box) != 1 {
		t.Fatal("another bus used this bus's outbox")
	}
}

// Inside a handler an outbox put in the context takes the message instead
// of the handler's buffer (it commits with the caller's transaction, not
// with the handler); Immediately goes past every outbox.
func TestContextWithOutboxInsideAHandlerAndImmediately(t *testing.T) {
	tr := bustest.NewTransport()
	var box memoryOutbox
	var b *bus.Bus
	b, err := bus.New(bus.WithEndpoint("ep"), bus.WithLogger(discard()), bus.WithTransport(tr),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			ctx = bus.ContextWithOutbox(ctx, b, &box)
			if err := b.Send(ctx, chargeCard{OrderID: "stored"}, bus.To("billing")); err != nil {
				return err
			}
			if err := b.Send(ctx, chargeCard{OrderID: "now"}, bus.To("billing"), bus.Immediately()); err != nil {
				return err
			}
			if got := chargesSentTo(tr, "billing"); !slices.Equal(got, []string{"now"}) {
				return fmt.Errorf("sent %v to billing inside the handler; want the Immediately send", got)
			}
			return errors.New("the handler fails after its caller's transaction committed")
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop(context.Background())
	if err := b.Deliver(t.Context(), bustest.Delivery(orderPlaced{ID: "1"}, bus.Attributes{})); err == nil || !strings.Contains(err.Error(), "transaction committed") {
		t.Fatalf("Deliver: %v", err)
	}
	if len(box) != 1 || box[0].Envelope.Attributes.CorrelationID == "" {
		t.Fatalf("the context's outbox got %d message(s): %+v", len(box), box)
	}
	if got := chargesSentTo(tr, "billing"); !slices.Equal(got, []string{"now"}) {
		t.Fatalf("sent %v to billing after the handler failed; want the Immediately send only", got)
	}
}

// UseOutbox moves what the handler sent before it into the new outbox.
func TestUseOutboxMovesWhatWasAlreadySent(t *testing.T) {
	var box memoryOutbox
	e := newEnv(t, nil,
		bus.WithMiddleware(bus.Middleware{Name: "late-outbox", Handling: func(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
			if err := next.Call(ctx); err != nil {
				return err
			}
			_, err := h.UseOutbox(ctx, &box) // after the handler sent: its buffer moves to box
			return err
		}}),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			return handlingBus(ctx).Send(ctx, chargeCard{OrderID: "moved"}, bus.To("elsewhere"))
		}))
	if err := e.bus.Send(t.Context(), orderPlaced{}); err != nil {
		t.Fatal(err)
	}
	e.expect(bustest.Deleted)
	if len(box) != 1 || box[0].Envelope.Name != "shop.charge_card" || box[0].Destination != "elsewhere" {
		t.Fatalf("outbox got %+v", box)
	}
	if got := e.chargesSentTo("elsewhere"); len(got) != 0 {
		t.Fatalf("%v reached the transport although they moved to the outbox", got)
	}
}

// What is sent after UseOutbox's restore goes to the handler's buffer
// again, and out when the handler succeeds.
func TestUseOutboxRestoreSendsLaterOnesToTheBuffer(t *testing.T) {
	var box memoryOutbox
	e := newEnv(t, nil,
		bus.WithMiddleware(
			bus.Middleware{Name: "outer", Handling: func(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
				err := next.Call(ctx)
				// after the inner outbox's transaction ended: back to the bus's buffer
				return errors.Join(err, handlingBus(ctx).Send(ctx, chargeCard{OrderID: "after"}, bus.To("listener")))
			}},
			bus.Middleware{Name: "tx", Handling: func(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
				restore, err := h.UseOutbox(ctx, &box)
				defer restore()
				if err != nil {
					return err
				}
				return next.Call(ctx)
			}}),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			return handlingBus(ctx).Send(ctx, chargeCard{OrderID: "inside"}, bus.To("listener"))
		}))
	if err := e.bus.Send(t.Context(), orderPlaced{}); err != nil {
		t.Fatal(err)
	}
	e.expect(bustest.Deleted)
	if len(box) != 1 {
		t.Fatalf("outbox got %d messages, want the one sent inside", len(box))
	}
	if got := e.chargesSentTo("listener"); !slices.Equal(got, []string{"after"}) {
		t.Fatalf("sent %v, want the one sent after restore", got)
	}
}

// An outgoing middleware that drops a message (does not call next), or
// returns an error after next: inside a handler and into a context's
// outbox, Send returns nil or that error and nothing is buffered or
// stored, while the handler's other sends go out.
func TestOutgoingDropOrErrorAfterNextStoresNothing(t *testing.T) {
	for _, c := range []struct {
		name    string
		mw      func(ctx context.Context, next bus.Next) error // for chargeCard
		wantErr string                                         // "" for nil
	}{
		{"drop", func(context.Context, bus.Next) error { return nil }, ""},
		{"error after next", func(ctx context.Context, next bus.Next) error {
			if err := next.Call(ctx); err != nil {
				return err
			}
			return errors.New("audit write failed")
		}, "audit write failed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			check := func(err error) error {
				if (c.wantErr == "" && err != nil) || (c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr))) {
					return fmt.Errorf("Send = %v, want %q", err, c.wantErr)
				}
				return nil
			}
			tr := bustest.NewTransport()
			mw := bus.Middleware{Name: "mw", Outgoing: func(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
				if out.Name() == (chargeCard{}).MessageName() {
					return c.mw(ctx, next)
				}
				return next.Call(ctx)
			}}
			var b *bus.Bus
			b, err := bus.New(bus.WithEndpoint("ep"), bus.WithLogger(discard()), bus.WithTransport(tr),
				bus.WithMiddleware(mw),
				bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
					if err := check(b.Send(ctx, chargeCard{}, bus.To("billing"))); err != nil {
						return err
					}
					return b.Send(ctx, orderShipped{}, bus.To("shipping")) // the handler goes on
				}))
			if err != nil {
				t.Fatal(err)
			}
			defer b.Stop(context.Background())
			if err := b.Deliver(t.Context(), bustest.Delivery(orderPlaced{ID: "1"}, bus.Attributes{})); err != nil {
				t.Fatal(err)
			}
			if got := destinations(tr); !slices.Equal(got, []string{"shipping"}) {
				t.Fatalf("sent to %q after the handler succeeded; want to shipping only", got)
			}
			var box memoryOutbox
			if err := check(b.Send(bus.ContextWithOutbox(t.Context(), b, &box), chargeCard{}, bus.To("billing"))); err != nil {
				t.Fatal(err)
			}
			if len(box) != 0 {
				t.Fatalf("the outbox stored %d message(s)", len(box))
			}
		})
	}
}

// blockingValidator holds header validation (part of the outgoing terminal
// step) until released.
type blockingValidator struct {
	bus.Transport
	in, release chan struct{}
}

func (v *blockingValidator) ValidateHeaders(bus.Headers) error {
	close(v.in)
	<-v.release
	return nil
}

// An outgoing middleware that returns nil while the next it called still
// runs on another goroutine: a send into the handler's buffer says it was
// not stored, and nothing is sent.
func TestOutgoingMiddlewareReturningBeforeItsNextStoresNothing(t *testing.T) {
	rec := bustest.NewTransport()
	tr := &blockingValidator{Transport: rec, in: make(chan struct{}), release: make(chan struct{})}
	detached := make(chan error, 1)
	early := bus.Middleware{Name: "early", Outgoing: func(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
		out.Headers()["x-audit"] = "1"
		go func() { detached <- next.Call(ctx) }()
		<-tr.in // the terminal step runs
		return nil
	}}
	var b *bus.Bus
	b, err := bus.New(bus.WithEndpoint("ep"), bus.WithLogger(discard()), bus.WithTransport(tr), bus.WithMiddleware(early),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			err := b.Send(ctx, chargeCard{}, bus.To("billing"))
			close(tr.release)
			if err == nil || !strings.Contains(err.Error(), "returned before the next it called did") {
				return fmt.Errorf("Send = %v, want the message reported not stored", err)
			}
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop(context.Background())
	if err := b.Deliver(t.Context(), bustest.Delivery(orderPlaced{ID: "1"}, bus.Attributes{})); err != nil {
		t.Fatal(err)
	}
	if err := <-detached; err != nil {
		t.Fatalf("the detached next: %v", err)
	}
	if got := destinations(rec); len(got) != 0 {
		t.Fatalf("sent to %q; want nothing sent", got)
	}
}
