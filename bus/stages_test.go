package bus_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
)

// trace records the order in which stage code runs.
type trace struct {
	mu  sync.Mutex
	log []string
}

func (tr *trace) add(s string) {
	tr.mu.Lock()
	tr.log = append(tr.log, s)
	tr.mu.Unlock()
}

func (tr *trace) get() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return slices.Clone(tr.log)
}

// tracingLayer is a pass-through middleware on all three stages that records
// entering and leaving each.
func tracingLayer(name string, tr *trace) bus.Middleware {
	return bus.Middleware{
		Name: name,
		Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
			tr.add("in>" + name)
			err := next.Call(ctx)
			tr.add("in<" + name)
			return err
		},
		Handling: func(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
			tr.add("h>" + name)
			err := next.Call(ctx)
			tr.add("h<" + name)
			return err
		},
		Outgoing: func(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
			tr.add("out>" + name)
			err := next.Call(ctx)
			tr.add("out<" + name)
			return err
		},
	}
}

// Within each stage the middleware registered first is the outermost
// layer.
func TestOrderFirstRegisteredIsOutermost(t *testing.T) {
	tr := &trace{}
	e := newEnv(t, nil,
		bus.WithMiddleware(tracingLayer("a", tr), tracingLayer("b", tr), tracingLayer("c", tr)),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			tr.add("handler")
			return nil
		}))
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}); err != nil {
		t.Fatal(err)
	}
	e.expect(bustest.Deleted)
	// The message may be received while the sender's outgoing chain
	// unwinds: each side is in order, not the two together.
	var sending, receiving []string
	for _, ev := range tr.get() {
		if strings.HasPrefix(ev, "out") {
			sending = append(sending, ev)
		} else {
			receiving = append(receiving, ev)
		}
	}
	if want := []string{"out>a", "out>b", "out>c", "out<c", "out<b", "out<a"}; !slices.Equal(sending, want) {
		t.Fatalf("outgoing order:\n got %v\nwant %v", sending, want)
	}
	want := []string{"in>a", "in>b", "in>c", "h>a", "h>b", "h>c", "handler", "h<c", "h<b", "h<a", "in<c", "in<b", "in<a"}
	if !slices.Equal(receiving, want) {
		t.Fatalf("incoming and handler order:\n got %v\nwant %v", receiving, want)
	}
}

// Each stage context's logger carries the bus, the stage, the middleware
// and the message (and the handler, in the handler stage).
func TestStageLoggersAreScoped(t *testing.T) {
	e := newEnv(t, nil,
		bus.WithMiddleware(bus.Middleware{
			Name: "logs",
			Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
				in.Logger().Info("from incoming")
				return next.Call(ctx)
			},
			Handling: func(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
				h.Logger().Info("from handling")
				return next.Call(ctx)
			},
			Outgoing: func(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
				out.Logger().Info("from outgoing")
				return next.Call(ctx)
			},
		}),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error { return nil }, bus.HandlerName("charge")))
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}, bus.WithMessageID("m-1"), bus.WithCorrelationID("c-1")); err != nil {
		t.Fatal(err)
	}
	e.expect(bustest.Deleted)
	logs := e.logs.String()
	for _, want := range []string{
		`"msg":"from incoming","bus":"ep","stage":"incoming","middleware":"logs","message_name":"shop.order_placed","message_id":"m-1","correlation_id":"c-1"`,
		`"msg":"from handling","bus":"ep","stage":"handler","middleware":"logs","message_name":"shop.order_placed","message_id":"m-1","correlation_id":"c-1","handler":"charge"`,
		`"msg":"from outgoing","bus":"ep","stage":"outgoing","middleware":"logs","message_name":"shop.order_placed","message_id":"m-1","correlation_id":"c-1"`,
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %s\n%s", want, logs)
		}
	}
}
