package sdktest_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
	"github.com/plugbus/plugbus/sdk/sdktest"
	"go.uber.org/goleak"
)

// The test binary is also the probe plugin's child process.
func TestMain(m *testing.M) {
	sdktest.ServeChild(probe{})
	goleak.VerifyTestMain(m)
}

// The probe's sentinels, declared once (probe.Errors).
var (
	ErrNoTenant = errors.New("probe: message has no tenant")
	ErrRefused  = errors.New("probe: refused")
)

// Header "x-tenant" carries the tenant; "x-mode" what the probe does.
const (
	tenantHeader = "x-tenant"
	modeHeader   = "x-mode"
)

type (
	tenantKey struct{}
	modeKey   struct{}
	stageKey  struct{}
)

// probe is a middleware with all three stages and code after next. Its
// incoming stage puts the tenant and the mode into ctx; its handler stage
// adds a value; its outgoing stage reads all three for sends made while
// handling.
type probe struct{}

func (probe) Errors() []error { return []error{ErrNoTenant, ErrRefused} }

func (probe) Instantiate(bus.PluginInfo) (bus.Middleware, error) {
	return bus.Middleware{
		Name: "probe",
		Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
			tenant, _ := in.Header(tenantHeader)
			mode, _ := in.Header(modeHeader)
			switch {
			case tenant == "":
				return fmt.Errorf("%w: %s", ErrNoTenant, in.Attributes().MessageID)
			case mode == "short-incoming":
				return nil
			case mode == "fail-incoming":
				return fmt.Errorf("incoming: %w", ErrRefused)
			case mode == "permanent":
				return bus.Permanent(fmt.Errorf("poison: %w", ErrRefused))
			}
			ctx = context.WithValue(context.WithValue(ctx, tenantKey{}, tenant), modeKey{}, mode)
			err := next.Call(ctx)
			if mode == "next-twice" {
				return next.Call(ctx)
			}
			if err != nil {
				return fmt.Errorf("probe saw: %w", err)
			}
			return nil
		},
		Handling: func(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
			if _, ok := ctx.Value(tenantKey{}).(string); !ok {
				return fmt.Errorf("handler stage of %s: %w", h.HandlerName(), ErrNoTenant)
			}
			switch ctx.Value(modeKey{}) {
			case "short-handler":
				return nil
			case "fail-handler":
				return fmt.Errorf("handler stage: %w", ErrRefused)
			}
			return next.Call(context.WithValue(ctx, stageKey{}, "handler"))
		},
		Outgoing: func(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
			tenant, ok := ctx.Value(tenantKey{}).(string)
			if !ok {
				return fmt.Errorf("outgoing %s: %w", out.Name(), ErrNoTenant)
			}
			switch ctx.Value(modeKey{}) {
			case "short-outgoing":
				return nil
			case "fail-outgoing":
				return fmt.Errorf("outgoing: %w", ErrRefused)
			}
			stage, _ := ctx.Value(stageKey{}).(string)
			out.Headers()[tenantHeader] = tenant
			out.Headers()["x-stage"] = stage
			out.SetSticky("tenant", tenant)
			return next.Call(ctx)
		},
	}, nil
}

type Order struct{ ID string }

func (Order) MessageName() string { return "probe.order" }

type Invoice struct{ Order string }

func (Invoice) MessageName() string { return "probe.invoice" }

// outcome is what became of a delivered order: the error Deliver
// returned, how many times the handler ran, what the bus sent.
type outcome struct {
	err     error
	handled int
	sent    []bustest.Sent
}

// deliver hands an order with the given headers to a bus whose handler
// sends an invoice.
func deliver(t *testing.T, p bus.Plugin, headers map[string]string) outcome {
	t.Helper()
	tr := bustest.NewTransport()
	var handled atomic.Int32
	var b *bus.Bus
	b = bustest.Start(t, bus.WithEndpoint("orders"), bus.WithTransport(tr), bus.WithMiddleware(p), bus.WithLogger(slog.New(slog.DiscardHandler)),
		bus.WithHandler(func(ctx context.Context, o Order, _ bus.Attributes) error {
			handled.Add(1)
			return b.Send(ctx, Invoice{Order: o.ID}, bus.To("billing"))
		}))
	d := bustest.Delivery(Order{ID: "o-1"}, bus.Attributes{})
	d.Headers = headers
	err := b.Deliver(context.Background(), d)
	return outcome{err, int(handled.Load()), tr.Sent()}
}

// TestProbeBehavesTheSameInEveryMode pins, in process, over the wire and
// in a child process, what the probe does with a message.
func TestProbeBehavesTheSameInEveryMode(t *testing.T) {
	sdktest.Run(t, probe{}, func(t *testing.T, p bus.Plugin) {
		t.Run("context crosses to the handler and outgoing stages", func(t *testing.T) {
			o := deliver(t, p, map[string]string{tenantHeader: "acme"})
			err, handled, sent := o.err, o.handled, o.sent
			if err != nil || handled != 1 || len(sent) != 1 {
				t.Fatalf("err %v, handled %d, sent %d, want nil, 1, 1", err, handled, len(sent))
			}
			env := sent[0].Envelope
			if env.Headers[tenantHeader] != "acme" || env.Headers["x-stage"] != "handler" {
				t.Fatalf("invoice headers %v, want the tenant and the handler stage's value", env.Headers)
			}
			if v, _ := env.Attributes.StickyValue("tenant"); v != "acme" {
				t.Fatalf("sticky tenant %q, want acme", v)
			}
		})
		t.Run("a declared sentinel matches on the host", func(t *testing.T) {
			o := deliver(t, p, nil)
			err, handled := o.err, o.handled
			if !errors.Is(err, ErrNoTenant) || errors.Is(err, ErrRefused) || handled != 0 {
				t.Fatalf("err %v, handled %d, want ErrNoTenant only, not handled", err, handled)
			}
			if !strings.Contains(err.Error(), ErrNoTenant.Error()) || !strings.Contains(err.Error(), "bustest-message") {
				t.Fatalf("err %q lost the probe's text", err)
			}
			if errors.Is(err, bus.ErrPermanent) {
				t.Fatalf("err %v is permanent, want transient", err)
			}
		})
		t.Run("a permanent error stays permanent", func(t *testing.T) {
			o := deliver(t, p, map[string]string{tenantHeader: "acme", modeHeader: "permanent"})
			err, handled := o.err, o.handled
			if !errors.Is(err, bus.ErrPermanent) || !errors.Is(err, ErrRefused) || handled != 0 {
				t.Fatalf("err %v, handled %d, want permanent ErrRefused, not handled", err, handled)
			}
		})
		for _, stage := range []string{"incoming", "handler", "outgoing"} {
			t.Run("a short-circuit in the "+stage+" stage", func(t *testing.T) {
				o := deliver(t, p, map[string]string{tenantHeader: "acme", modeHeader: "short-" + stage})
				err, handled, sent := o.err, o.handled, o.sent
				wantHandled := map[string]int{"incoming": 0, "handler": 0, "outgoing": 1}[stage]
				if err != nil || handled != wantHandled || len(sent) != 0 {
					t.Fatalf("err %v, handled %d, sent %d; want nil, %d, 0", err, handled, len(sent), wantHandled)
				}
			})
			t.Run("an error in the "+stage+" stage", func(t *testing.T) {
				o := deliver(t, p, map[string]string{tenantHeader: "acme", modeHeader: "fail-" + stage})
				err, handled, sent := o.err, o.handled, o.sent
				wantHandled := map[string]int{"incoming": 0, "handler": 0, "outgoing": 1}[stage]
				if !errors.Is(err, ErrRefused) || errors.Is(err, bus.ErrPermanent) || handled != wantHandled || len(sent) != 0 {
					t.Fatalf("err %v, handled %d, sent %d; want transient ErrRefused, %d, 0", err, handled, len(sent), wantHandled)
				}
				if stage != "incoming" && !strings.Contains(err.Error(), stage) {
					t.Fatalf("err %q does not say which stage refused", err)
				}
			})
		}
		t.Run("a second next is refused, naming stage and middleware", func(t *testing.T) {
			o := deliver(t, p, map[string]string{tenantHeader: "acme", modeHeader: "next-twice"})
			err, handled := o.err, o.handled
			var misuse *bus.NextMisuseError
			if !errors.As(err, &misuse) || misuse.Stage != bus.StageIncoming || misuse.Middleware != "probe" || misuse.AfterReturn || handled != 1 {
				t.Fatalf("err %v (%+v), handled %d; want next called twice in probe's incoming stage, handled once", err, misuse, handled)
			}
		})
	}, sdktest.WithChildProcess())
}
