// Package sdktest runs a plugbus plugin's unit tests both in process and
// across the process boundary, so that what holds for the middleware in
// process is proved to hold out of process too.
//
// [Run] runs a test function once per [Mode]: with the plugin value itself
// (as bus.WithMiddleware gets it), through the real wire encoding inside
// the test process ([Wire]: sdk.ServeTest and plugin.Attach over a unix
// socket), and, with [WithChildProcess], as a real child process: the test
// binary itself, started by plugin.Load, pinned to its checksum. A test
// binary serves as that child when its TestMain starts with [ServeChild]:
//
//	func TestMain(m *testing.M) {
//		sdktest.ServeChild(tenancy.New("acme"))
//		goleak.VerifyTestMain(m)
//	}
//
//	func TestTenantCrossesStages(t *testing.T) {
//		sdktest.Run(t, tenancy.New("acme"), func(t *testing.T, p bus.Plugin) {
//			b := bustest.Start(t, bus.WithMiddleware(p), ...)
//			...
//		}, sdktest.WithChildProcess())
//	}
package sdktest

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"

	goplugin "github.com/hashicorp/go-plugin"
	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/pluginproto"
	"github.com/plugbus/plugbus/plugin"
	"github.com/plugbus/plugbus/sdk"
)

// Mode is how a test gets the plugin.
type Mode uint8

const (
	// InProcess gives the plugin value itself.
	InProcess Mode = iota
	// Wire serves the plugin inside the test process with sdk.ServeTest
	// and loads it with plugin.Attach: every stage invocation goes through
	// the host's plugin layer, protobuf and gRPC over a unix socket, and
	// the SDK, as out of process.
	Wire
	// ChildProcess starts the test binary as a real plugin process with
	// plugin.Load (checksum, mutual TLS, no inherited environment); the
	// child serves the plugin its TestMain gave [ServeChild].
	ChildProcess
)

// String implements fmt.Stringer; it names Run's subtests.
func (m Mode) String() string {
	switch m {
	case InProcess:
		return "in-process"
	case Wire:
		return "wire"
	case ChildProcess:
		return "child-process"
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// Option configures [Run] and [Load].
type Option func(*config)

type config struct {
	child      bool
	config     json.RawMessage
	hostOpts   []plugin.Option
	logger     *slog.Logger
	modesGiven []Mode
}

// WithChildProcess adds [ChildProcess] to Run's modes. The test binary's
// TestMain must call [ServeChild] first.
func WithChildProcess() Option { return func(c *config) { c.child = true } }

// WithModes makes Run run exactly these modes.
func WithModes(modes ...Mode) Option {
	return func(c *config) { c.modesGiven = append([]Mode(nil), modes...) }
}

// WithConfig passes configuration (JSON) to the plugin: through
// plugin.WithConfig out of process, to its Configure (sdk.Configurer) in
// process, before it is instantiated.
func WithConfig(raw json.RawMessage) Option { return func(c *config) { c.config = raw } }

// WithHostOptions adds options for plugin.Attach and plugin.Load (a
// failure policy, an invocation timeout, ...).
func WithHostOptions(opts ...plugin.Option) Option {
	return func(c *config) { c.hostOpts = append(c.hostOpts, opts...) }
}

// WithLogger sets the logger of the host's plugin layer and of the
// plugin's stage contexts in Wire mode. The default discards records
// below warnings and writes the rest to stderr.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// Run runs f as one subtest per mode (named by [Mode.String]): InProcess
// and Wire, plus ChildProcess with [WithChildProcess], or the modes of
// [WithModes]. Each gets p in that mode, closed when the subtest ends.
func Run(t *testing.T, p bus.Plugin, f func(t *testing.T, p bus.Plugin), opts ...Option) {
	t.Helper()
	c := newConfig(opts)
	modes := c.modesGiven
	if modes == nil {
		modes = []Mode{InProcess, Wire}
		if c.child {
			modes = append(modes, ChildProcess)
		}
	}
	for _, m := range modes {
		t.Run(m.String(), func(t *testing.T) {
			f(t, Load(t, p, m, opts...))
		})
	}
}

// Load returns p in mode m, closed when the test ends. In ChildProcess
// mode the child serves the plugin its TestMain gave [ServeChild], not p:
// give both the same value (and differences of configuration with
// [WithConfig]).
func Load(t testing.TB, p bus.Plugin, m Mode, opts ...Option) bus.Plugin {
	t.Helper()
	c := newConfig(opts)
	switch m {
	case InProcess:
		if len(c.config) > 0 {
			if cf, ok := p.(sdk.Configurer); ok {
				if err := cf.Configure(c.config); err != nil {
					t.Fatalf("sdktest: configuring the plugin: %v", err)
				}
			}
		}
		return p
	case Wire:
		return attach(t, p, c)
	case ChildProcess:
		return child(t, c)
	}
	t.Fatalf("sdktest: unknown mode %v", m)
	return nil
}

func newConfig(opts []Option) config {
	var c config
	for _, o := range opts {
		o(&c)
	}
	if c.logger == nil {
		c.logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return c
}

func (c config) pluginOptions() []plugin.Option {
	opts := []plugin.Option{plugin.WithLogger(c.logger)}
	if len(c.config) > 0 {
		opts = append(opts, plugin.WithConfig(c.config))
	}
	return append(opts, c.hostOpts...)
}

// attach serves p in this process, once per process the host starts, and
// loads it over the wire.
func attach(t testing.TB, p bus.Plugin, c config) bus.Plugin {
	ctx, cancel := context.WithCancel(context.Background())
	var (
		mu     sync.Mutex // the host may restart the plugin from its own goroutine
		served []<-chan struct{}
	)
	t.Cleanup(func() {
		cancel()
		mu.Lock()
		defer mu.Unlock()
		for _, done := range served {
			<-done
		}
	})
	serve := func() (*goplugin.ReattachConfig, func(), error) {
		sctx, stopServing := context.WithCancel(ctx)
		rc, done, err := sdk.ServeTest(sctx, p, c.logger)
		if err != nil {
			stopServing()
			return nil, nil, err
		}
		mu.Lock()
		served = append(served, done)
		mu.Unlock()
		return rc, func() { stopServing(); <-done }, nil
	}
	hp, err := plugin.Attach(serve, c.pluginOptions()...)
	if err != nil {
		t.Fatalf("sdktest: loading the plugin over the wire: %v", err)
	}
	t.Cleanup(func() { hp.Close() })
	return hp
}

// child starts the test binary as the plugin process.
func child(t testing.TB, c config) bus.Plugin {
	exe, err := os.Executable()
	if err != nil {
		t.Fatalf("sdktest: finding the test binary: %v", err)
	}
	sum, err := plugin.SHA256File(exe)
	if err != nil {
		t.Fatalf("sdktest: %v", err)
	}
	opts := append([]plugin.Option{plugin.WithSHA256(sum), plugin.WithArgs("-test.run=^$")}, c.pluginOptions()...)
	hp, err := plugin.Load(exe, opts...)
	if err != nil {
		t.Fatalf("sdktest: starting the test binary as the plugin: %v (does TestMain call sdktest.ServeChild first?)", err)
	}
	t.Cleanup(func() { hp.Close() })
	return hp
}

// ServeChild serves p with sdk.Serve, and never returns, when this process
// was started as a plugin (by ChildProcess mode, or by any plugbus host);
// otherwise it returns at once. Call it first in the TestMain of a test
// binary that uses [WithChildProcess].
func ServeChild(p bus.Plugin, opts ...sdk.Option) {
	if os.Getenv(pluginproto.Handshake.MagicCookieKey) != pluginproto.Handshake.MagicCookieValue {
		return
	}
	sdk.Serve(p, opts...)
	os.Exit(0)
}
