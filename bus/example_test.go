package bus_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/plugbus/plugbus/bus"
)

type OrderPlaced struct {
	OrderID string `json:"order_id"`
}

func (OrderPlaced) MessageName() string { return "shop.order_placed" }

type ChargeCard struct {
	OrderID string `json:"order_id"`
}

func (ChargeCard) MessageName() string { return "billing.charge_card" }

// run starts b, sends msg, waits for done and stops b.
func run(b *bus.Bus, msg bus.Message, opts []bus.SendOption, done <-chan struct{}) {
	ctx := context.Background()
	if err := b.Start(ctx); err != nil {
		panic(err)
	}
	defer b.Stop(ctx)
	if err := b.Send(ctx, msg, opts...); err != nil {
		fmt.Println("send:", err)
		return
	}
	<-done
}

// A bus with one typed handler on the default in-memory transport.
func Example() {
	done := make(chan struct{})
	b, err := bus.New(
		bus.WithEndpoint("orders"),
		bus.WithLogger(discard()),
		bus.WithHandler(func(ctx context.Context, m OrderPlaced, a bus.Attributes) error {
			fmt.Println("order placed:", m.OrderID)
			close(done)
			return nil
		}),
	)
	if err != nil {
		panic(err)
	}
	run(b, OrderPlaced{OrderID: "o-1"}, nil, done)
	// Output: order placed: o-1
}

// Incoming middleware: pass through, short-circuit (the message is deleted
// without running handlers) and fail (the message is retried).
func ExampleIncomingFunc() {
	done := make(chan struct{})
	tenancy := bus.Middleware{
		Name: "tenancy",
		Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
			tenant, ok := in.Attributes().StickyValue("tenant")
			switch {
			case !ok:
				fmt.Println("no tenant: handled without handlers")
				close(done)
				return nil // short-circuit: deleted, handlers skipped
			case tenant == "banned":
				return errors.New("tenant banned") // returned for retry, then dead-lettered
			}
			fmt.Println("tenant", tenant)
			return next.Call(ctx) // pass through
		},
	}
	b, _ := bus.New(bus.WithEndpoint("orders"), bus.WithLogger(discard()), bus.WithMiddleware(tenancy),
		bus.WithHandler(func(ctx context.Context, m OrderPlaced, a bus.Attributes) error {
			fmt.Println("handled", m.OrderID)
			return nil
		}))
	run(b, OrderPlaced{OrderID: "o-1"}, nil, done)
	// Output: no tenant: handled without handlers
}

// Handler middleware wraps each handler. An error fails that handler alone
// and discards what it sent.
func ExampleHandlingFunc() {
	done := make(chan struct{})
	audit := bus.Middleware{
		Name: "audit",
		Handling: func(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
			err := next.Call(ctx)
			fmt.Printf("handler %s of %s: err=%v\n", h.HandlerName(), h.MessageName(), err)
			close(done)
			return err
		},
	}
	b, _ := bus.New(bus.WithEndpoint("orders"), bus.WithLogger(discard()), bus.WithMiddleware(audit),
		bus.WithHandler(func(ctx context.Context, m OrderPlaced, a bus.Attributes) error { return nil },
			bus.HandlerName("reserve-stock")))
	run(b, OrderPlaced{OrderID: "o-1"}, nil, done)
	// Output: handler reserve-stock of shop.order_placed: err=<nil>
}

// Outgoing middleware changes attributes and native headers, drops a
// message (Send returns nil) or rejects it (Send returns the error).
func ExampleOutgoingFunc() {
	done := make(chan struct{})
	stamp := bus.Middleware{
		Name: "stamp",
		Outgoing: func(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
			if out.Name() == "billing.charge_card" {
				return errors.New("charges go through the payments API") // reject
			}
			out.SetSticky("tenant", "acme")        // copied onto every message sent while handling
			out.Headers()["x-origin"] = "web-shop" // an AMQP header, an SQS message attribute
			return next.Call(ctx)
		},
	}
	b, _ := bus.New(bus.WithEndpoint("orders"), bus.WithLogger(discard()), bus.WithMiddleware(stamp),
		bus.WithHandler(func(ctx context.Context, m OrderPlaced, a bus.Attributes) error {
			tenant, _ := a.StickyValue("tenant")
			fmt.Println("tenant:", tenant)
			b, _, _ := bus.MessageContext(ctx)
			//lint:ignore S1016 a message is built field by field, as a reader would build it
			fmt.Println("charge:", b.Send(ctx, ChargeCard{OrderID: m.OrderID}, bus.To("billing")))
			close(done)
			return nil
		}))
	run(b, OrderPlaced{OrderID: "o-1"}, nil, done)
	// Output:
	// tenant: acme
	// charge: charges go through the payments API
}

// A filter is a yes/no decision over the incoming or outgoing stage.
func ExampleFilterIncoming() {
	done := make(chan struct{})
	onlyBig := bus.FilterIncoming("only-big-orders", func(ctx context.Context, in *bus.Incoming) bus.FilterResult {
		if v, _ := in.Attributes().Value("size"); v != "big" {
			return bus.FilterStop
		}
		return bus.FilterContinue
	})
	b, _ := bus.New(bus.WithEndpoint("orders"), bus.WithLogger(discard()), bus.WithMiddleware(onlyBig),
		bus.WithHandler(func(ctx context.Context, m OrderPlaced, a bus.Attributes) error {
			fmt.Println("big order", m.OrderID)
			close(done)
			return nil
		}))
	ctx := context.Background()
	_ = b.Start(ctx)
	defer b.Stop(ctx)
	_ = b.Send(ctx, OrderPlaced{OrderID: "small"})
	_ = b.Send(ctx, OrderPlaced{OrderID: "big"}, bus.WithAttribute("size", "big"))
	<-done
	// Output: big order big
}

// A plugin is a factory: the bus calls it once, in New, so each bus gets
// its own state.
func ExamplePluginFunc() {
	counter := bus.PluginFunc(func(info bus.PluginInfo) (bus.Middleware, error) {
		sent := 0 // per bus
		return bus.Middleware{
			Name: "counter",
			Outgoing: func(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
				sent++
				return next.Call(ctx)
			},
			Stop: func(context.Context) error {
				fmt.Printf("%s sent %d\n", info.Name, sent)
				return nil
			},
		}, nil
	})
	for _, name := range []string{"a", "b"} {
		b, _ := bus.New(bus.WithName(name), bus.WithLogger(discard()), bus.WithRoute("elsewhere", OrderPlaced{}), bus.WithMiddleware(counter))
		ctx := context.Background()
		_ = b.Start(ctx)
		_ = b.Send(ctx, OrderPlaced{})
		_ = b.Stop(ctx)
	}
	// Output:
	// a sent 1
	// b sent 1
}

// A message whose name no handler handles is dead-lettered at once by
// default, with a reason naming it; an endpoint built with
// bus.UnhandledDiscard deletes it instead, and incoming middleware sees
// that through Incoming.Unhandled.
func ExampleWithUnhandled() {
	for _, policy := range []bus.UnhandledPolicy{bus.UnhandledDeadLetter, bus.UnhandledDiscard} {
		done := make(chan struct{})
		watch := bus.Middleware{Name: "watch", Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
			defer close(done)
			err := next.Call(ctx)
			fmt.Printf("%s: %s, unhandled %t, permanent %t\n", policy, in.Name(), in.Unhandled(), bus.IsPermanent(err))
			return err
		}}
		b, _ := bus.New(bus.WithEndpoint("orders"), bus.WithLogger(discard()), bus.WithUnhandled(policy), bus.WithMiddleware(watch),
			bus.WithHandler(func(ctx context.Context, m OrderPlaced, a bus.Attributes) error { return nil }))
		run(b, ChargeCard{OrderID: "o-1"}, []bus.SendOption{bus.To("orders")}, done)
	}
	// Output:
	// dead-letter: billing.charge_card, unhandled true, permanent true
	// discard: billing.charge_card, unhandled true, permanent false
}
