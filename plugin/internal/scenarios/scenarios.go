// Package scenarios holds the middleware the plugin tests run both in
// process and out of process, chosen by name.
package scenarios

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/plugbus/plugbus/bus"
)

// Name is the middleware name every scenario reports.
const Name = "scenario"

// ShorterDeadline is the timeout the "shorter" scenario gives next.
const ShorterDeadline = 100 * time.Millisecond

// PermanentReason is the text of the permanent failures of the
// "permanent", "handler-permanent" and "decode" scenarios.
const PermanentReason = "scenario: invalid for good"

// HangHeader is the header that makes the "hang-on-header" scenario wait
// for its ctx to end; without it the scenario calls next.
const HangHeader = "hang"

type whoKey struct{}

// Plugin is a middleware whose behaviour is the named scenario.
type Plugin struct{ scenario string }

// New returns the scenario plugin.
func New(scenario string) *Plugin { return &Plugin{scenario: scenario} }

// Configure reads {"scenario": "name"}.
func (p *Plugin) Configure(raw json.RawMessage) error {
	var c struct{ Scenario string }
	if err := json.Unmarshal(raw, &c); err != nil {
		return err
	}
	p.scenario = c.Scenario
	return nil
}

// RefusedBus is the name of the bus whose Start hook the "start-fails"
// scenario fails.
const RefusedBus = "refused"

// Instantiate returns the scenario's middleware.
func (p *Plugin) Instantiate(info bus.PluginInfo) (bus.Middleware, error) {
	m := bus.Middleware{Name: Name}
	switch p.scenario {
	case "pass":
		m.Incoming = func(ctx context.Context, _ *bus.Incoming, next *bus.IncomingNext) error { return next.Call(ctx) }
	case "start-fails":
		// Passes messages on; its Start hook fails for the bus named
		// RefusedBus.
		m.Incoming = func(ctx context.Context, _ *bus.Incoming, next *bus.IncomingNext) error { return next.Call(ctx) }
		m.Start = func(context.Context) error {
			if info.Name == RefusedBus {
				return errors.New("scenario: refusing to start for " + info.Name)
			}
			return nil
		}
	case "start-panics":
		// Passes messages on; its Start hook panics for the bus named
		// RefusedBus.
		m.Incoming = func(ctx context.Context, _ *bus.Incoming, next *bus.IncomingNext) error { return next.Call(ctx) }
		m.Start = func(context.Context) error {
			if info.Name == RefusedBus {
				panic("scenario: start hook boom")
			}
			return nil
		}
	case "short":
		m.Incoming = func(context.Context, *bus.Incoming, *bus.IncomingNext) error { return nil }
	case "error":
		m.Incoming = func(context.Context, *bus.Incoming, *bus.IncomingNext) error { return errors.New("scenario: rejected") }
	case "catch":
		m.Incoming = func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
			if err := next.Call(ctx); err != nil {
				in.Logger().Info("caught", "error", err)
			}
			return nil
		}
	case "after":
		m.Incoming = func(ctx context.Context, _ *bus.Incoming, next *bus.IncomingNext) error {
			if err := next.Call(ctx); err != nil {
				return fmt.Errorf("after next: %w", err)
			}
			return nil
		}
	case "twice":
		m.Incoming = func(ctx context.Context, _ *bus.Incoming, next *bus.IncomingNext) error {
			_ = next.Call(ctx)
			return next.Call(ctx)
		}
	case "mutate":
		m.Outgoing = func(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
			out.SetValue("mw", "1")
			out.DeleteValue("drop")
			out.SetSticky("st", "2")
			out.SetCorrelationID("corr-mw")
			out.Headers()["x-mw"] = "3"
			return next.Call(ctx)
		}
	case "bad-utf8":
		// Strings that are not valid UTF-8, which protobuf cannot carry:
		// a header set on an outgoing message, an incoming error's text.
		m.Outgoing = func(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
			out.Headers()["x-bad"] = "\xff"
			return next.Call(ctx)
		}
		m.Incoming = func(context.Context, *bus.Incoming, *bus.IncomingNext) error {
			return errors.New("refused \xff here")
		}
	case "due":
		// Reads the due time into a header and postpones it by a minute;
		// one without a due time gets one a minute from now.
		m.Outgoing = func(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
			due := out.Due()
			if due.IsZero() {
				out.Headers()["x-due"] = "none"
				out.SetDue(time.Now().Add(time.Minute))
				return next.Call(ctx)
			}
			out.Headers()["x-due"] = due.UTC().Format(time.RFC3339Nano)
			out.SetDue(due.Add(time.Minute))
			return next.Call(ctx)
		}
	case "deadline":
		m.Incoming = func(ctx context.Context, _ *bus.Incoming, next *bus.IncomingNext) error {
			dl, ok := ctx.Deadline()
			if !ok {
				return errors.New("scenario: no deadline crossed")
			}
			if rem := time.Until(dl); rem < 30*time.Second || rem > 61*time.Second {
				return fmt.Errorf("scenario: deadline in %s, want about a minute", rem)
			}
			nctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			return next.Call(nctx)
		}
	case "shorter":
		// next under a deadline shorter than the caller's: the rest of the
		// chain runs under it, and next returns what the rest returned.
		m.Incoming = func(ctx context.Context, _ *bus.Incoming, next *bus.IncomingNext) error {
			nctx, cancel := context.WithTimeout(ctx, ShorterDeadline)
			defer cancel()
			return next.Call(nctx)
		}
	case "handler-skip":
		m.Handling = func(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
			if h.HandlerName() == "skipped" {
				return nil
			}
			return next.Call(ctx)
		}
	case "hang-on-header":
		m.Incoming = func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
			if _, ok := in.Header(HangHeader); !ok {
				return next.Call(ctx)
			}
			<-ctx.Done()
			return ctx.Err()
		}
	case "hang":
		m.Incoming = func(ctx context.Context, _ *bus.Incoming, _ *bus.IncomingNext) error {
			<-ctx.Done()
			return ctx.Err()
		}
	case "permanent":
		m.Incoming = func(context.Context, *bus.Incoming, *bus.IncomingNext) error {
			return bus.Permanent(errors.New(PermanentReason))
		}
	case "handler-permanent":
		m.Handling = func(context.Context, *bus.Handling, *bus.HandlingNext) error {
			return fmt.Errorf("handler stage: %w", bus.Permanent(errors.New(PermanentReason)))
		}
	case "decode":
		// The bus's own kind of permanent failure, made by the middleware.
		m.Incoming = func(_ context.Context, in *bus.Incoming, _ *bus.IncomingNext) error {
			return &bus.DecodeError{Message: in.Name(), Type: "scenario", Err: errors.New(PermanentReason)}
		}
	case "mark-after":
		// Marks the rest of the chain's failure permanent.
		m.Incoming = func(ctx context.Context, _ *bus.Incoming, next *bus.IncomingNext) error {
			if err := next.Call(ctx); err != nil {
				return bus.Permanent(fmt.Errorf("marked after next: %w", err))
			}
			return nil
		}
	case "drop-permanent":
		// Reads next's error: a permanent failure is dropped, others
		// returned.
		m.Incoming = func(ctx context.Context, _ *bus.Incoming, next *bus.IncomingNext) error {
			if err := next.Call(ctx); !errors.Is(err, bus.ErrPermanent) {
				return err
			}
			return nil
		}
	case "who":
		// Hands the incoming message's "who" attribute to the rest of its
		// handling in ctx; an outgoing message sent there carries it as
		// "seen-who".
		m.Incoming = func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
			who, _ := in.Attributes().Value("who")
			return next.Call(context.WithValue(ctx, whoKey{}, who))
		}
		m.Outgoing = func(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
			if who, ok := ctx.Value(whoKey{}).(string); ok {
				out.SetValue("seen-who", who)
			}
			return next.Call(ctx)
		}
	case "panic":
		m.Incoming = func(context.Context, *bus.Incoming, *bus.IncomingNext) error { panic("scenario: boom") }
	default:
		return bus.Middleware{}, fmt.Errorf("scenarios: unknown scenario %q", p.scenario)
	}
	return m, nil
}
