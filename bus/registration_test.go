package bus_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/plugbus/plugbus/bus"
)

// orderPlacedV2 claims the wire name of orderPlaced with other fields: a
// handler of it would decode orderPlaced bodies into zero values.
type orderPlacedV2 struct {
	OrderID string `json:"order_id"`
}

func (orderPlacedV2) MessageName() string { return "shop.order_placed" }

type unnamed struct{}

func (unnamed) MessageName() string { return "" }

// panicky's MessageName reads a field the zero value lacks.
type panicky struct{ names []string }

func (p panicky) MessageName() string { return p.names[0] }

func nop[T bus.Message](context.Context, T, bus.Attributes) error { return nil }

// Each registration mistake fails New with an error saying what to change,
// rather than being accepted (or panicking).
func TestNewRefusesRegistrationMistakes(t *testing.T) {
	for _, c := range []struct {
		name string
		opts []bus.Option
		want []string // every one is in the error
	}{
		{"two types with one message name", []bus.Option{
			bus.WithHandler(nop[orderPlaced], bus.HandlerName("v1")),
			bus.WithHandler(nop[orderPlacedV2], bus.HandlerName("v2")),
		}, []string{`"shop.order_placed"`, "bus_test.orderPlaced", "bus_test.orderPlacedV2", "give one type its own MessageName"}},
		{"two types with one message name, pointer first", []bus.Option{
			bus.WithHandler(nop[*orderPlacedV2], bus.HandlerName("v2")),
			bus.WithHandler(nop[orderPlaced], bus.HandlerName("v1")),
		}, []string{"*bus_test.orderPlacedV2", "bus_test.orderPlaced"}},
		{"one message routed to two endpoints", []bus.Option{
			bus.WithRoute("billing", chargeCard{}), bus.WithRoute("payments", orderShipped{}, chargeCard{}),
		}, []string{"shop.charge_card", `"billing"`, `"payments"`, "one route per message"}},
		{"route without messages", []bus.Option{bus.WithRoute("billing")}, []string{`WithRoute("billing")`, "pass the messages"}},
		{"route of a nil message", []bus.Option{bus.WithRoute("billing", nil)}, []string{"message 0 is nil"}},
		{"route of an unnamed message", []bus.Option{bus.WithRoute("billing", unnamed{})}, []string{"bus_test.unnamed.MessageName() returned an empty name"}},
		{"route to no endpoint", []bus.Option{bus.WithRoute("", chargeCard{})}, []string{"empty endpoint"}},
		{"nil handler function", []bus.Option{bus.WithHandler[orderPlaced](nil)}, []string{"WithHandler[bus_test.orderPlaced]: nil handler function"}},
		{"handler of an interface type", []bus.Option{bus.WithHandler(nop[bus.Message])}, []string{"bus.Message is an interface type", "one handler per concrete message type"}},
		{"handler of an unnamed message", []bus.Option{bus.WithHandler(nop[unnamed])}, []string{"returned an empty name"}},
		{"handler of a message whose name panics", []bus.Option{bus.WithHandler(nop[panicky])}, []string{"bus_test.panicky.MessageName() panicked", "must return a constant name"}},
		{"handler named with an empty name", []bus.Option{bus.WithHandler(nop[orderPlaced], bus.HandlerName(""))}, []string{`bus.HandlerName("")`, "give the handler a name"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			opts := append([]bus.Option{bus.WithEndpoint("ep"), bus.WithLogger(discard())}, c.opts...)
			b, err := bus.New(opts...)
			if err == nil {
				_ = b.Stop(context.Background())
				t.Fatal("New accepted it")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %s", err, w)
				}
			}
		})
	}
}

// What looks like a mistake but is not stays accepted: the same route
// twice, and one message type handled both as a value and as a pointer.
func TestNewAcceptsHarmlessRepeats(t *testing.T) {
	b, err := bus.New(bus.WithEndpoint("ep"), bus.WithLogger(discard()),
		bus.WithRoute("billing", chargeCard{}), bus.WithRoute("billing", chargeCard{}, orderShipped{}),
		bus.WithHandler(nop[orderPlaced], bus.HandlerName("by value")),
		bus.WithHandler(nop[*orderPlaced], bus.HandlerName("by pointer")))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := b.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// New refuses options that cannot work together or at all.
func TestNewRefusesBadOptions(t *testing.T) {
	handler := bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error { return nil })
	for name, opts := range map[string][]bus.Option{
		"handlers without endpoint": {handler},
		"zero concurrency":          {bus.WithConcurrency(0)},
		"zero attempts":             {bus.WithMaxAttempts(0)},
		"nil plugin":                {bus.WithMiddleware(nil)},
		"unnamed middleware":        {bus.WithMiddleware(bus.Middleware{})},
		"failing plugin": {bus.WithMiddleware(bus.PluginFunc(func(bus.PluginInfo) (bus.Middleware, error) {
			return bus.Middleware{}, errors.New("bad config")
		}))},
	} {
		if _, err := bus.New(opts...); err == nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
}

// New refuses two handlers of one message with one name: names identify
// handlers in errors, traces and the inbox.
func TestNewRefusesTwoHandlersWithOneName(t *testing.T) {
	h := func(ctx context.Context, m orderPlaced, a bus.Attributes) error { return nil }
	_, err := bus.New(bus.WithEndpoint("ep"), bus.WithHandler(h, bus.HandlerName("x")), bus.WithHandler(h, bus.HandlerName("x")))
	if err == nil || !strings.Contains(err.Error(), "bus.HandlerName") {
		t.Fatalf("New with two handlers named x: %v", err)
	}
}

// WithOptions applies its options in order, skips nil ones, and fails New
// with the first error.
func TestWithOptionsBundles(t *testing.T) {
	b, err := bus.New(bus.WithOptions(bus.WithEndpoint("bundled"), nil, bus.WithName("first")), bus.WithOptions(bus.WithName("second")))
	if err != nil {
		t.Fatal(err)
	}
	if b.Endpoint() != "bundled" || b.Name() != "second" {
		t.Fatalf("endpoint %q name %q; want bundled and second (applied in order)", b.Endpoint(), b.Name())
	}
	_, err = bus.New(bus.WithOptions(bus.WithEndpoint("x"), bus.WithEndpoint(""), bus.WithName("never")))
	if err == nil || !strings.Contains(err.Error(), "WithEndpoint: empty name") {
		t.Fatalf("New = %v; want the bundled option's error", err)
	}
}
