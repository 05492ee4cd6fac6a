package plugin_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
	"github.com/plugbus/plugbus/plugin"
	"github.com/plugbus/plugbus/plugin/internal/scenarios"
	"github.com/plugbus/plugbus/sdk"
	"github.com/plugbus/plugbus/sdk/sdktest"
)

// A before-only stage that ends with `return next.Call(nctx)`, nctx having a
// shorter deadline, has the rest of the chain run under that deadline, as
// in process.
func TestBeforeOnlyShorterDeadline(t *testing.T) {
	sdktest.Run(t, sdk.BeforeOnly(scenarios.New("shorter")), func(t *testing.T, p bus.Plugin) {
		var got time.Duration = -1
		b, err := bus.New(bus.WithEndpoint("svc"), bus.WithMiddleware(p), bus.WithLogger(testLogger(t)),
			bus.WithHandler(func(ctx context.Context, _ Ping, _ bus.Attributes) error {
				if dl, ok := ctx.Deadline(); ok {
					got = time.Until(dl)
				}
				return nil
			}))
		if err != nil {
			t.Fatal(err)
		}
		if err := deliverOnce(t, b); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatal(err)
		}
		if got < 0 || got > 10*scenarios.ShorterDeadline {
			t.Fatalf("the handler ran with %v left before its deadline (-1: none); want at most %v (the deadline the before-only stage gave next)", got, scenarios.ShorterDeadline)
		}
	}, sdktest.WithModes(sdktest.InProcess, sdktest.Wire))
}

// A handler-stage middleware reads the received message's native headers
// out of process as in process.
func TestHandlerStageReadsTheHeaders(t *testing.T) {
	mw := bus.Middleware{Name: "tenant-guard", Handling: func(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
		if v, ok := h.Header("x-tenant"); !ok || v != "acme" {
			return bus.Permanent(errors.New("handler stage: no x-tenant header"))
		}
		if all := maps.Collect(h.Headers()); len(all) != 2 || all["x-region"] != "eu" {
			return bus.Permanent(fmt.Errorf("handler stage: headers %v", all))
		}
		return next.Call(ctx)
	}}
	sdktest.Run(t, mw, func(t *testing.T, p bus.Plugin) {
		handled := 0
		b, err := bus.New(bus.WithEndpoint("svc"), bus.WithMiddleware(p), bus.WithLogger(testLogger(t)),
			bus.WithHandler(func(context.Context, Ping, bus.Attributes) error { handled++; return nil }))
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if err := b.Start(ctx); err != nil {
			t.Fatal(err)
		}
		derr := b.Deliver(ctx, delivery(t, Ping{N: 1}, bus.Headers{"x-tenant": "acme", "x-region": "eu"}))
		if err := b.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if derr != nil || handled != 1 {
			t.Fatalf("Deliver returned %v, handled %d times; want nil and once", derr, handled)
		}
	}, sdktest.WithModes(sdktest.InProcess, sdktest.Wire))
}

// deadlineOf classifies the deadline of ctx for comparison across modes:
// the caller's (a minute), a shorter one (ten seconds), a later one (an
// hour), or none.
func deadlineOf(ctx context.Context) string {
	dl, ok := ctx.Deadline()
	switch left := time.Until(dl); {
	case !ok:
		return "none"
	case left <= 15*time.Second:
		return "shorter"
	case left <= 2*time.Minute:
		return "the caller's"
	default:
		return "later"
	}
}

// The rest of the chain runs under the deadline of the context a
// middleware gives next, out of process as in process, in every stage and
// in a before-only stage: the same deadline, a shorter one, a later one
// or none. A middleware lengthens or drops its deadline by detaching the
// rest from its context (context.WithoutCancel); out of process the host
// kept its own deadline then.
func TestNextRunsUnderTheDeadlineOfItsContext(t *testing.T) {
	nexts := map[string]func(ctx context.Context) (context.Context, context.CancelFunc){
		"the caller's": func(ctx context.Context) (context.Context, context.CancelFunc) { return ctx, func() {} },
		"shorter": func(ctx context.Context) (context.Context, context.CancelFunc) {
			return context.WithTimeout(ctx, 10*time.Second)
		},
		"later": func(ctx context.Context) (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.WithoutCancel(ctx), time.Hour)
		},
		"none": func(ctx context.Context) (context.Context, context.CancelFunc) {
			return context.WithoutCancel(ctx), func() {}
		},
	}
	for _, stage := range []bus.Stage{bus.StageIncoming, bus.StageHandler, bus.StageOutgoing} {
		for _, beforeOnly := range []bool{false, true} {
			for want, nextCtx := range nexts {
				name := fmt.Sprintf("%s/before-only=%v/%s", stage, beforeOnly, want)
				t.Run(name, func(t *testing.T) {
					call := func(ctx context.Context, next bus.Next) error {
						nctx, cancel := nextCtx(ctx)
						defer cancel()
						return next.Call(nctx)
					}
					mw := bus.Middleware{Name: "deadline"}
					switch stage {
					case bus.StageIncoming:
						mw.Incoming = func(ctx context.Context, _ *bus.Incoming, next *bus.IncomingNext) error { return call(ctx, next) }
					case bus.StageHandler:
						mw.Handling = func(ctx context.Context, _ *bus.Handling, next *bus.HandlingNext) error { return call(ctx, next) }
					case bus.StageOutgoing:
						mw.Outgoing = func(ctx context.Context, _ *bus.Outgoing, next *bus.OutgoingNext) error { return call(ctx, next) }
					}
					var p bus.Plugin = mw
					if beforeOnly {
						p = sdk.BeforeOnly(mw)
					}
					sameOverTheWire(t, p, want, "the rest of the chain ran under %s deadline; want %s (as the context given to next)",
						func(t *testing.T, loaded bus.Plugin) string { return restDeadline(t, loaded, stage) })
				})
			}
		}
	}
}

// sameOverTheWire checks that observe, given p loaded in process and then
// over each path of the wire, sees want each time; format reports what it
// saw and want.
func sameOverTheWire(t *testing.T, p bus.Plugin, want, format string, observe func(*testing.T, bus.Plugin) string) {
	t.Helper()
	if got := observe(t, sdktest.Load(t, p, sdktest.InProcess)); got != want {
		t.Fatalf("in process: "+format, got, want)
	}
	eachPath(t, func(t *testing.T, path plugin.Option) {
		if got := observe(t, sdktest.Load(t, p, sdktest.Wire, sdktest.WithHostOptions(path))); got != want {
			t.Errorf("over the wire: "+format, got, want)
		}
	})
}

// restDeadline runs one message through a bus with p followed by a
// middleware that records the deadline of the context its stage is
// given (incoming, handler) or one send (outgoing), and returns it.
func restDeadline(t *testing.T, p bus.Plugin, stage bus.Stage) string {
	t.Helper()
	var got string
	record := func(ctx context.Context, s bus.Stage) {
		if s == stage {
			got = deadlineOf(ctx)
		}
	}
	recorder := bus.Middleware{Name: "recorder",
		Incoming: func(ctx context.Context, _ *bus.Incoming, next *bus.IncomingNext) error {
			record(ctx, bus.StageIncoming)
			return next.Call(ctx)
		},
		Handling: func(ctx context.Context, _ *bus.Handling, next *bus.HandlingNext) error {
			record(ctx, bus.StageHandler)
			return next.Call(ctx)
		},
		Outgoing: func(ctx context.Context, _ *bus.Outgoing, next *bus.OutgoingNext) error {
			record(ctx, bus.StageOutgoing)
			return next.Call(ctx)
		}}
	b, err := bus.New(bus.WithEndpoint("svc"), bus.WithTransport(bustest.NewTransport()), bus.WithMiddleware(p, recorder),
		bus.WithLogger(testLogger(t)), bus.WithHandler(func(context.Context, Ping, bus.Attributes) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if stage == bus.StageOutgoing {
		err = b.Send(ctx, Ping{N: 1}, bus.To("elsewhere"))
	} else {
		err = b.Deliver(ctx, delivery(t, Ping{N: 1}, nil))
	}
	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// An outgoing middleware's changes made after next returned are not sent,
// out of process as in process: those of a before-only stage (which has
// no code after next to declare it so, but may) went with the message,
// made while the host had not run next yet. Changes made before next are
// sent, for a send outside a handler and for one a handler buffers.
func TestOutgoingChangesAfterNextAreNotSent(t *testing.T) {
	change := func(out *bus.Outgoing, when string) {
		out.SetValue("v-"+when, when)
		out.DeleteValue("drop-" + when)
		out.SetSticky("s-"+when, when)
		out.SetCorrelationID("corr-" + when)
		out.Headers()["h-"+when] = when
	}
	mw := bus.Middleware{Name: "stamp", Outgoing: func(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
		change(out, "before")
		err := next.Call(ctx)
		change(out, "after")
		return err
	}}
	want := "corr=corr-before values=map[drop-after:x keep:y v-before:before] sticky=map[s-before:before s0:z] headers=map[h-before:before]"
	for _, beforeOnly := range []bool{false, true} {
		for _, inHandler := range []bool{false, true} {
			t.Run(fmt.Sprintf("before-only=%v/in-handler=%v", beforeOnly, inHandler), func(t *testing.T) {
				var p bus.Plugin = mw
				if beforeOnly {
					p = sdk.BeforeOnly(mw)
				}
				sameOverTheWire(t, p, want, "sent %s; want %s (the changes made before next)",
					func(t *testing.T, loaded bus.Plugin) string { return sentWith(t, loaded, inHandler) })
			})
		}
	}
}

// sentWith sends one message through a bus with p, from a handler or
// not, and describes the message the transport got.
func sentWith(t *testing.T, p bus.Plugin, inHandler bool) string {
	t.Helper()
	tr := bustest.NewTransport()
	var b *bus.Bus
	send := func(ctx context.Context) error {
		return b.Send(ctx, Ping{N: 2}, bus.To("elsewhere"), bus.WithAttribute("drop-before", "x"), bus.WithAttribute("drop-after", "x"),
			bus.WithAttribute("keep", "y"), bus.WithStickyAttribute("s0", "z"))
	}
	var err error
	b, err = bus.New(bus.WithEndpoint("svc"), bus.WithTransport(tr), bus.WithMiddleware(p), bus.WithLogger(testLogger(t)),
		bus.WithHandler(func(ctx context.Context, _ Ping, _ bus.Attributes) error { return send(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if inHandler {
		err = b.Deliver(ctx, delivery(t, Ping{N: 1}, nil))
	} else {
		err = send(ctx)
	}
	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	sent := tr.Sent()
	if len(sent) != 1 {
		t.Fatalf("%d messages sent; want 1", len(sent))
	}
	a := sent[0].Envelope.Attributes
	return fmt.Sprintf("corr=%s values=%v sticky=%v headers=%v", a.CorrelationID, maps.Collect(a.Values()), maps.Collect(a.StickyValues()), sent[0].Envelope.Headers)
}
