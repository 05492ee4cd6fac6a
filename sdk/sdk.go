// Package sdk is what a third-party author imports to serve a plugbus
// plugin from its own binary, loaded by a host with package plugin.
//
// The plugin is an ordinary [bus.Plugin] — the very value one could pass to
// bus.WithMiddleware — and its unit tests use bustest unchanged. The main of
// the plugin binary is one call:
//
//	func main() { sdk.Serve(tenancy.New("acme")) }
//
// Inside the plugin process the middleware runs exactly as in process: its
// stage functions receive stage contexts built from what the host sent
// ([bus.NewIncoming], [bus.NewHandling], [bus.NewOutgoing]) and a next that
// crosses back to the host, which runs the rest of the chain and returns its
// outcome. Differences are few and listed on [Serve]. A middleware with no
// code after next can say so with [BeforeOnly] to halve its cost.
package sdk

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"slices"

	goplugin "github.com/hashicorp/go-plugin"
	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/lazylog"
	"github.com/plugbus/plugbus/internal/pluginproto"
)

// ProtocolVersion is the wire protocol major this SDK speaks.
const ProtocolVersion = pluginproto.ProtocolVersion

// Option configures [Serve].
type Option func(*serveConfig)

type serveConfig struct {
	version string
}

// WithVersion sets the version the plugin reports to the host (printed by
// `plugbus plugin verify`). The default is the main module's version from
// the build information, or "(devel)".
func WithVersion(v string) Option { return func(c *serveConfig) { c.version = v } }

// Configurer is implemented by a plugin that takes configuration from the
// host (the "config" of its manifest entry, or plugin.WithConfig). Configure
// is called with the raw JSON before each Instantiate; it is not called when
// the host passes no configuration.
type Configurer interface {
	Configure(config json.RawMessage) error
}

// ErrorDeclarer is implemented by a plugin that declares the sentinel
// errors its middleware returns, plain or wrapped, so that errors.Is
// matches them on the host as it does in process:
//
//	func (p *Plugin) Errors() []error { return []error{ErrNoTenant} }
//
// Out of process, an error that matches a declared sentinel crosses with
// that sentinel's text as its code (the way connect-go carries codes), and
// the host's *plugin.Error matches every error with that text: the host
// imports the sentinel from the plugin's package, the plugin declares it
// once. Declare sentinels only (errors.New values with a package prefix),
// never errors whose text varies.
type ErrorDeclarer interface {
	Errors() []error
}

// Serve serves p over go-plugin and never returns normally: the host ends
// the process. Call it from the plugin binary's main. Serve also makes the
// process's default slog logger write to the host, which logs each record
// through its own *slog.Logger with the plugin's name.
//
// What differs from running p in process:
//   - bus.PluginInfo.Bus and Transport are nil; Name, Endpoint, Handles and
//     Logger are set.
//   - Incoming.Raw and Handling.Raw return nil.
//   - Handling.Message and Outgoing.Message return a [RawMessage] (JSON).
//   - Values stored in the ctx given to next reach p's own later stages
//     for the same message (its handler stage, its outgoing stage for
//     sends made while handling), as in process, but not the host nor
//     other plugins; values of the host's ctx do not reach p. The ctx's
//     cancellation does not cross; its deadline does: the host runs the
//     rest of the chain under it, and next returns what the rest
//     returned, as in process, even when that ctx expired meanwhile.
//   - errors.Is matches on the host only the bus's sentinels and those p
//     declares ([ErrorDeclarer]).
//   - Changes an outgoing middleware makes after next returns are not sent
//     back (in process they have no effect either: the message is built).
//   - bus.Middleware.Unique crosses (bus.New refuses p twice around a
//     handler, as in process); bus.Middleware.TxSource does not: a
//     transaction of the plugin's process never holds the host's handler.
//
// Run as a program by hand, Serve prints that the binary is a plugin and exits.
func Serve(p bus.Plugin, opts ...Option) {
	if err := serve(p, opts); err != nil {
		fmt.Fprintln(os.Stderr, "plugbus plugin:", err)
		os.Exit(1)
	}
}

func newServeConfig(opts []Option) serveConfig {
	c := serveConfig{}
	for _, o := range opts {
		o(&c)
	}
	if c.version == "" {
		c.version = "(devel)"
		if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
			c.version = bi.Main.Version
		}
	}
	return c
}

func serve(p bus.Plugin, opts []Option) error {
	if p == nil {
		return errors.New("sdk.Serve: nil plugin")
	}
	c := newServeConfig(opts)
	logger := slog.New(newHostHandler(os.Stderr, levelFromEnv()))
	slog.SetDefault(logger)
	// Stage contexts scope this logger for every invocation; most never log.
	s := newServer(p, c.version, slog.New(lazylog.New(logger.Handler())))
	goplugin.Serve(&goplugin.ServeConfig{
		HandshakeConfig: pluginproto.Handshake,
		VersionedPlugins: map[int]goplugin.PluginSet{
			pluginproto.ProtocolVersion: {pluginproto.PluginKey: &pluginproto.GRPCPlugin{Impl: s}},
		},
		GRPCServer: newGRPCServer,
		Logger:     newHCLogger(logger),
	})
	return nil
}

// BeforeOnly declares that p's middleware has no code after next in the
// given stages (all stages when none is given): each such stage function
// either returns without calling next, returns an error, or ends with
// `return next.Call(ctx)`. Out of process, such a stage costs one round trip
// instead of two: the plugin answers "continue" and the host calls next
// itself. In process the returned plugin behaves exactly like p.
//
// A middleware that does work after next must not be declared before-only:
// out of process, its next returns nil at once.
func BeforeOnly(p bus.Plugin, stages ...bus.Stage) bus.Plugin {
	if len(stages) == 0 {
		stages = []bus.Stage{bus.StageIncoming, bus.StageHandler, bus.StageOutgoing}
	}
	return &beforeOnly{Plugin: p, stages: stages}
}

type beforeOnly struct {
	bus.Plugin
	stages []bus.Stage
}

// Configure forwards to the wrapped plugin.
func (b *beforeOnly) Configure(config json.RawMessage) error {
	if c, ok := b.Plugin.(Configurer); ok {
		return c.Configure(config)
	}
	return nil
}

// Errors forwards to the wrapped plugin.
func (b *beforeOnly) Errors() []error { return declaredErrors(b.Plugin) }

// declaredErrors returns the sentinels p declares, without nils.
func declaredErrors(p bus.Plugin) []error {
	d, ok := p.(ErrorDeclarer)
	if !ok {
		return nil
	}
	var out []error
	for _, e := range d.Errors() {
		if e != nil {
			out = append(out, e)
		}
	}
	return out
}

// beforeOnlyStages reports the stages p declared before-only, following
// nested BeforeOnly wrappers.
func beforeOnlyStages(p bus.Plugin) (set [4]bool) {
	for {
		b, ok := p.(*beforeOnly)
		if !ok {
			return set
		}
		for _, s := range b.stages {
			if s >= bus.StageIncoming && s <= bus.StageOutgoing {
				set[s] = true
			}
		}
		p = b.Plugin
	}
}

// RawMessage is what Handling.Message and Outgoing.Message return inside a
// plugin process: the message's wire name and its JSON encoding.
type RawMessage struct {
	Name string
	Body []byte
}

// MessageName returns the wire name.
func (m RawMessage) MessageName() string { return m.Name }

// Decode unmarshals the JSON body into v, as the bus's default
// serializer does (bus.JSON: encoding/json with a pooled decoder).
func (m RawMessage) Decode(v any) error {
	if err := (bus.JSON{}).Unmarshal(m.Body, v); err != nil {
		return fmt.Errorf("sdk: decoding %s: %w", m.Name, err)
	}
	return nil
}

// HostError is the error next returns in a plugin process when the rest of
// the chain, run by the host, failed. errors.Is matches the bus sentinel of
// its kind (bus.ErrHandlerDispatchRejected, bus.ErrPanic,
// context.DeadlineExceeded, ...), and bus.ErrPermanent when the host's
// error was marked permanent (bus.Permanent). Returning it unchanged from
// the middleware hands the host's original error back to the bus.
type HostError struct {
	// Message is the host error's text.
	Message   string
	code      pluginproto.ErrorCode
	permanent bool
}

// Error implements error.
func (e *HostError) Error() string { return e.Message }

// Is reports whether target is the sentinel of the error's kind, or
// bus.ErrPermanent for a permanent failure.
func (e *HostError) Is(target error) bool {
	if target == bus.ErrPermanent {
		return e.permanent
	}
	s := pluginproto.Sentinel(e.code)
	return s != nil && s == target
}

func decodeHostError(e *pluginproto.Error) error {
	if e == nil {
		return nil
	}
	if t := pluginproto.NextCalledTwice(e); t != nil {
		return t
	}
	return &HostError{Message: e.Message, code: e.Code, permanent: e.Permanent}
}

// implementedStages lists the stages m implements, for the host.
func implementedStages(m bus.Middleware, beforeOnly [4]bool) []*pluginproto.StageInfo {
	var out []*pluginproto.StageInfo
	add := func(s bus.Stage) {
		out = append(out, &pluginproto.StageInfo{Stage: pluginproto.StageOf(s), BeforeOnly: beforeOnly[s]})
	}
	if m.Incoming != nil {
		add(bus.StageIncoming)
	}
	if m.Handling != nil {
		add(bus.StageHandler)
	}
	if m.Outgoing != nil {
		add(bus.StageOutgoing)
	}
	return slices.Clip(out)
}
