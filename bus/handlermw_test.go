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

// tracer records the order in which handler-stage layers run.
type tracer struct {
	mu   sync.Mutex
	seen []string
}

func (tr *tracer) add(s string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.seen = append(tr.seen, s)
}

func (tr *tracer) take() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	s := tr.seen
	tr.seen = nil
	return s
}

func (tr *tracer) layer(name string) bus.Middleware {
	return bus.Middleware{Name: name, Handling: func(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
		tr.add(name + ">" + h.HandlerName())
		err := next.Call(ctx)
		tr.add("<" + name)
		return err
	}}
}

// A handler's own middleware runs for that handler only, inside the
// bus's handler-stage middleware, in the order given.
func TestHandlerMiddlewareRunsInsideBusMiddlewareForItsHandlerOnly(t *testing.T) {
	tr := &tracer{}
	e := newEnv(t, nil,
		bus.WithMiddleware(tr.layer("a"), tr.layer("b")),
		bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error { tr.add("handler x"); return nil },
			bus.HandlerName("x"), bus.HandlerMiddleware(tr.layer("x1"), tr.layer("x2")), bus.HandlerMiddleware(tr.layer("x3"))),
		bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error { tr.add("handler y"); return nil },
			bus.HandlerName("y")))
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}); err != nil {
		t.Fatal(err)
	}
	e.expect(bustest.Deleted)
	want := []string{
		"a>x", "b>x", "x1>x", "x2>x", "x3>x", "handler x", "<x3", "<x2", "<x1", "<b", "<a",
		"a>y", "b>y", "handler y", "<b", "<a",
	}
	if got := tr.take(); !slices.Equal(got, want) {
		t.Fatalf("order\n got %v\nwant %v", got, want)
	}
}

// A handler's own middleware follows the handler stage's rules: not
// calling next skips that handler (succeeded), an error fails it alone
// and its sends are discarded, next twice is a NextMisuseError naming it.
func TestHandlerMiddlewareFollowsTheHandlerStageRules(t *testing.T) {
	t.Run("skip", func(t *testing.T) {
		ran := make(chan string, 2)
		e := newEnv(t, nil,
			bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error { ran <- "x"; return nil }, bus.HandlerName("x"),
				bus.HandlerMiddleware(bus.Middleware{Name: "skip", Handling: func(context.Context, *bus.Handling, *bus.HandlingNext) error { return nil }})),
			bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error { ran <- "y"; return nil }, bus.HandlerName("y")))
		if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}); err != nil {
			t.Fatal(err)
		}
		e.expect(bustest.Deleted)
		if got := await(t, ran); got != "y" {
			t.Fatalf("ran %s, want only y", got)
		}
		if !strings.Contains(e.logs.String(), `"middleware":"skip"`) {
			t.Fatalf("no debug log naming the middleware that skipped the handler:\n%s", e.logs)
		}
	})
	t.Run("fail", func(t *testing.T) {
		e := newEnv(t, nil, bus.WithMaxAttempts(1),
			bus.WithHandler(func(ctx context.Context, _ orderPlaced, _ bus.Attributes) error {
				return handlingBus(ctx).Send(ctx, chargeCard{OrderID: "from-x"}, bus.To("listener"))
			}, bus.HandlerName("x"), bus.HandlerMiddleware(bus.Middleware{Name: "reject", Handling: func(ctx context.Context, _ *bus.Handling, next *bus.HandlingNext) error {
				if err := next.Call(ctx); err != nil {
					return err
				}
				return errors.New("rejected after x ran")
			}})),
			bus.WithHandler(func(ctx context.Context, _ orderPlaced, _ bus.Attributes) error {
				return handlingBus(ctx).Send(ctx, chargeCard{OrderID: "from-y"}, bus.To("listener"))
			}, bus.HandlerName("y")))
		if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}); err != nil {
			t.Fatal(err)
		}
		s := e.expect(bustest.DeadLettered)
		if want := "1 handler(s) of shop.order_placed failed: x: rejected after x ran"; !strings.Contains(s.Failure.Reason, want) {
			t.Fatalf("reason %q, want %q", s.Failure.Reason, want)
		}
		if got := e.chargesSentTo("listener"); !slices.Equal(got, []string{"from-y"}) {
			t.Fatalf("sent %v, want from-y only", got)
		}
	})
	t.Run("next twice", func(t *testing.T) {
		e := newEnv(t, nil, bus.WithMaxAttempts(1),
			bus.WithHandler(nop[orderPlaced], bus.HandlerName("x"), bus.HandlerMiddleware(bus.Middleware{Name: "twice", Handling: func(ctx context.Context, _ *bus.Handling, next *bus.HandlingNext) error {
				_ = next.Call(ctx)
				return next.Call(ctx)
			}})))
		if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}); err != nil {
			t.Fatal(err)
		}
		s := e.expect(bustest.DeadLettered)
		if want := (&bus.NextMisuseError{Stage: bus.StageHandler, Middleware: "twice"}).Error(); !strings.Contains(s.Failure.Reason, want) {
			t.Fatalf("reason %q, want %q", s.Failure.Reason, want)
		}
	})
}

// A plugin given to a handler is instantiated for it, with the handler's
// name and message; its hooks run with the bus's, after the bus-level
// ones at Start and before them at Stop.
func TestHandlerMiddlewareIsInstantiatedPerHandler(t *testing.T) {
	var mu sync.Mutex
	var infos []bus.PluginInfo
	var hooks []string
	plugin := func(name string) bus.Plugin {
		return bus.PluginFunc(func(info bus.PluginInfo) (bus.Middleware, error) {
			mu.Lock()
			infos = append(infos, info)
			mu.Unlock()
			id := name + "/" + info.Handler
			return bus.Middleware{Name: name,
				Handling: func(ctx context.Context, _ *bus.Handling, next *bus.HandlingNext) error { return next.Call(ctx) },
				Start:    func(context.Context) error { hooks = append(hooks, "start "+id); return nil },
				Stop:     func(context.Context) error { hooks = append(hooks, "stop "+id); return nil },
			}, nil
		})
	}
	shared := plugin("p")
	b, err := bus.New(bus.WithEndpoint("ep"), bus.WithLogger(discard()),
		bus.WithMiddleware(plugin("bus")),
		bus.WithHandler(nop[orderPlaced], bus.HandlerName("x"), bus.HandlerMiddleware(shared)),
		bus.WithHandler(nop[chargeCard], bus.HandlerName("y"), bus.HandlerMiddleware(shared)))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := b.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, info := range infos {
		got = append(got, fmt.Sprintf("%s %v %v", info.Handler, info.Handles, info.Bus == b))
	}
	if want := []string{" [shop.charge_card shop.order_placed] true", "x [shop.order_placed] true", "y [shop.charge_card] true"}; !slices.Equal(got, want) {
		t.Fatalf("instantiated with %q, want %q", got, want)
	}
	if want := []string{"start bus/", "start p/x", "start p/y", "stop p/y", "stop p/x", "stop bus/"}; !slices.Equal(hooks, want) {
		t.Fatalf("hooks %q, want %q", hooks, want)
	}
}

// New refuses, per handler, what only runs per bus.
func TestHandlerMiddlewareRefusesBusOnlyStages(t *testing.T) {
	pass := func(ctx context.Context, _ *bus.Handling, next *bus.HandlingNext) error { return next.Call(ctx) }
	for _, c := range []struct {
		name string
		p    bus.Plugin
		want string
	}{
		{"incoming stage", bus.Middleware{Name: "in", Handling: pass, Incoming: func(ctx context.Context, _ *bus.Incoming, next *bus.IncomingNext) error { return next.Call(ctx) }}, `middleware "in" has an incoming or outgoing stage`},
		{"outgoing stage", bus.Middleware{Name: "out", Outgoing: func(ctx context.Context, _ *bus.Outgoing, next *bus.OutgoingNext) error { return next.Call(ctx) }}, `middleware "out" has an incoming or outgoing stage`},
		{"instance queue", bus.Middleware{Name: "iq", Handling: pass, InstanceQueue: true}, `"iq"`},
		{"no stage", bus.Middleware{Name: "none"}, `"none" has no handler stage`},
		{"no name", bus.Middleware{Handling: pass}, "without a name"},
		{"nil plugin", nil, "plugin 0 is nil"},
		{"failing plugin", bus.PluginFunc(func(bus.PluginInfo) (bus.Middleware, error) { return bus.Middleware{}, errors.New("boom") }), "boom"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := bus.New(bus.WithEndpoint("ep"), bus.WithHandler(nop[orderPlaced], bus.HandlerName("x"), bus.HandlerMiddleware(c.p)))
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "handler x of shop.order_placed") {
				t.Fatalf("New: %v, want an error naming the handler and containing %q", err, c.want)
			}
		})
	}
}
