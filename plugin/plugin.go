// Package plugin is the host side of plugbus's out-of-process plugins: it
// loads a plugin binary built with package sdk and exposes it to a bus as
// an ordinary [bus.Plugin].
//
//	p, err := plugin.Load("./bin/tenancy-plugin", plugin.WithSHA256(sum))
//	if err != nil { ... }
//	defer p.Close()
//	b, err := bus.New(bus.WithEndpoint("orders"), bus.WithMiddleware(p), ...)
//
// A manifest lists several plugins with their checksums, configuration and
// failure policies; [LoadManifest] loads them in one call.
//
// The binary's SHA-256 is checked before it runs (go-plugin's secure
// config), the connection uses automatic mutual TLS, and the process gets
// none of the host's environment. Each loaded plugin is one process,
// serving every bus it is instantiated for over gRPC: a lone invocation
// on a stream of its own, taken from a pool, and invocations made while
// others are in flight over one stream that carries their frames in
// batches. A crashed or hung
// process is reported through the logger and restarted with back-off;
// meanwhile the [FailurePolicy] decides whether messages are retried or the
// plugin skipped. Stopping the last bus using a plugin stops its process;
// Close stops it in any case.
package plugin

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goplugin "github.com/hashicorp/go-plugin"
	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/lazylog"
	"github.com/plugbus/plugbus/internal/pluginproto"
	"github.com/plugbus/plugbus/internal/wait"
)

// ImplementedStage is one stage a plugin's middleware implements, as the
// plugin reported it at load.
type ImplementedStage struct {
	Stage bus.Stage
	// BeforeOnly is true when the middleware declared it has no code after
	// next in this stage (sdk.BeforeOnly): it costs one round trip.
	BeforeOnly bool
}

// String returns the stage's name, with " (before-only)" when it is.
func (s ImplementedStage) String() string {
	if s.BeforeOnly {
		return s.Stage.String() + " (before-only)"
	}
	return s.Stage.String()
}

// ImplementedStages are the stages a plugin implements, in pipeline order.
type ImplementedStages []ImplementedStage

// String lists the stages, comma-separated ("incoming (before-only),
// outgoing"), or says "(none)".
func (ss ImplementedStages) String() string {
	if len(ss) == 0 {
		return "(none)"
	}
	names := make([]string, len(ss))
	for i, s := range ss {
		names[i] = s.String()
	}
	return strings.Join(names, ", ")
}

// Description is what a plugin reports about itself at load.
type Description struct {
	// Path is the binary; SHA256 its checksum (hex).
	Path, SHA256 string
	// Name is the middleware's name; Version the plugin's version.
	Name, Version string
	// ProtocolVersion is the negotiated wire protocol major.
	ProtocolVersion int
	// Stages lists the stages the middleware implements.
	Stages ImplementedStages
	// SDK is the plugbus version the plugin was built with.
	SDK string
	// Errors are the texts of the sentinel errors the plugin declares
	// (sdk.ErrorDeclarer): errors.Is matches them on the host.
	Errors []string
}

// Stats counts what happened to a plugin since it was loaded.
type Stats struct {
	// Invocations is the number of stage invocations routed to the plugin.
	Invocations uint64
	// Skipped counts invocations skipped under the fail-open policy.
	Skipped uint64
	// Unavailable counts invocations failed under the fail-closed policy.
	Unavailable uint64
	// Timeouts counts invocations that exceeded the invocation timeout.
	Timeouts uint64
	// Crashes counts processes that died or were found hung.
	Crashes uint64
	// Restarts counts successful restarts.
	Restarts uint64
}

// Plugin is a loaded out-of-process plugin. It is a [bus.Plugin]: pass it to
// bus.WithMiddleware. It is safe for concurrent use.
type Plugin struct {
	path        string
	cfg         config
	attach      func() (*goplugin.ReattachConfig, func(), error) // nil: run the binary at path
	description Description

	logScope   atomic.Pointer[logScope] // replaced whole, under logScopeMu
	logScopeMu sync.Mutex
	log        *slog.Logger // follows logScope: a plugin loaded before its bus logs to the bus's logger once instantiated

	live atomic.Pointer[process] // nil when down or idle

	mu             sync.Mutex
	proc           *process // current process, possibly dead, nil when idle
	restarting     bool
	restartCount   int // restarts since a process stayed up: the back-off's retry number
	instances      map[uint32]*instance
	lastInstanceID uint32
	closed         bool
	closing        context.Context // done once Close began
	beginClose     context.CancelFunc
	wg             sync.WaitGroup

	// lastCallID numbers the invocations of every process of the plugin:
	// an id a dead process gave never names another invocation in its
	// successor (a parent call held there, say).
	lastCallID atomic.Uint64

	invocations, skipped, unavailable, timeouts, crashes, restarts atomic.Uint64
	lastSkipLog                                                    atomic.Int64
}

// Load starts the plugin binary at path, after checking its checksum, and
// asks it to describe itself. The process serves every bus the returned
// plugin is instantiated for; Close it when done (stopping the last bus
// using it also stops the process).
func Load(path string, opts ...Option) (*Plugin, error) {
	c, err := configure(opts)
	if err != nil {
		return nil, err
	}
	if c.sum == nil && !c.unpinned {
		return nil, fmt.Errorf("%w (loading %s)", ErrNotPinned, path)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("plugin: %s: %w", path, err)
	}
	sum, err := SHA256File(abs)
	if err != nil {
		return nil, err
	}
	if c.sum != nil && sum != hex.EncodeToString(c.sum) {
		return nil, &ChecksumError{Path: abs, Want: hex.EncodeToString(c.sum), Got: sum}
	}
	return load(&Plugin{path: abs, cfg: c}, filepath.Base(abs), sum)
}

// Attach loads a plugin that is served, not started from a binary: serve
// is called for each process the host would start (at load, after a crash,
// when a bus needs it again after the last one stopped) and returns
// go-plugin's reattach configuration of a plugin serving in test mode, and
// a function that stops that serving and returns once it ended, which the
// host calls where it would stop the process.
// sdk/sdktest's wire mode attaches to sdk.ServeTest this way, in the test's
// own process. The connection is gRPC over a local socket with the same
// wire protocol as for a binary, but without checksum (nothing is run) and
// without TLS. Options other than the checksum ones apply as for [Load].
func Attach(serve func() (rc *goplugin.ReattachConfig, stop func(), err error), opts ...Option) (*Plugin, error) {
	if serve == nil {
		return nil, errors.New("plugin: Attach: nil serve function")
	}
	c, err := configure(opts)
	if err != nil {
		return nil, err
	}
	return load(&Plugin{path: "(attached)", cfg: c, attach: serve}, "attached", "")
}

func configure(opts []Option) (config, error) {
	c := defaults()
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&c); err != nil {
			return config{}, err
		}
	}
	return c, nil
}

// load starts p's first process and asks it to describe itself.
func load(p *Plugin, name, sum string) (*Plugin, error) {
	c, abs := p.cfg, p.path
	p.instances = make(map[uint32]*instance)
	p.closing, p.beginClose = context.WithCancel(context.Background())
	base := c.logger
	if base == nil {
		base = slog.Default()
	}
	p.initLog(name, base)

	proc, err := p.start()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.startTimeout)
	defer cancel()
	d, err := proc.rpc.Describe(ctx, &pluginproto.DescribeRequest{Config: c.pluginConfig})
	if err != nil {
		proc.stop()
		return nil, fmt.Errorf("plugin: %s did not describe itself: %w", abs, err)
	}
	p.setLogScope(d.Name, nil)
	p.description = Description{Path: abs, SHA256: sum, Name: d.Name, Version: d.Version, ProtocolVersion: proc.client.NegotiatedVersion(), SDK: d.Sdk, Errors: d.Errors}
	for _, s := range d.Stages {
		p.description.Stages = append(p.description.Stages, ImplementedStage{Stage: pluginproto.BusStage(s.Stage), BeforeOnly: s.BeforeOnly})
	}
	p.mu.Lock()
	p.install(proc)
	p.mu.Unlock()
	p.log.Info("plugin loaded", slog.String("path", abs), slog.String("version", d.Version), slog.Int("pid", proc.pid))
	return p, nil
}

// Describe returns what the plugin reported at load.
func (p *Plugin) Describe() Description { return p.description }

// Name returns the plugin's middleware name.
func (p *Plugin) Name() string { return p.logScope.Load().name }

// logScope is the plugin's name and the logger it logs to: the one set
// with WithLogger, or the last bus's, with the plugin's name.
type logScope struct {
	name   string
	base   *slog.Logger // without the name
	logger *slog.Logger // base with the name
}

// initLog names the plugin and makes p.log, which follows later changes
// of the name and of the logger.
func (p *Plugin) initLog(name string, base *slog.Logger) {
	p.setLogScope(name, base)
	p.log = slog.New(lazylog.Follow(func() slog.Handler { return p.logScope.Load().logger.Handler() }))
}

// setLogScope changes the plugin's name, or the logger it logs to, or
// both; an empty name or a nil base keeps the current one.
func (p *Plugin) setLogScope(name string, base *slog.Logger) {
	p.logScopeMu.Lock()
	defer p.logScopeMu.Unlock()
	if cur := p.logScope.Load(); cur != nil {
		name, base = cmp.Or(name, cur.name), cmp.Or(base, cur.base)
	}
	p.logScope.Store(&logScope{name: name, base: base, logger: base.With(slog.String("plugin", name))})
}

// PID returns the process id of the running plugin process, 0 when none runs.
func (p *Plugin) PID() int {
	if proc := p.live.Load(); proc != nil {
		return proc.pid
	}
	return 0
}

// Stats returns the plugin's counters.
func (p *Plugin) Stats() Stats {
	return Stats{Invocations: p.invocations.Load(), Skipped: p.skipped.Load(), Unavailable: p.unavailable.Load(),
		Timeouts: p.timeouts.Load(), Crashes: p.crashes.Load(), Restarts: p.restarts.Load()}
}

// Close stops the plugin process and its supervision. Buses still using
// the plugin then see it as down (see [FailurePolicy]). Close is idempotent.
func (p *Plugin) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.wg.Wait()
		return nil
	}
	p.closed = true
	p.beginClose()
	proc := p.proc
	p.proc = nil
	p.live.Store(nil)
	p.mu.Unlock()
	if proc != nil {
		proc.stop()
	}
	p.wg.Wait()
	return nil
}

// SHA256File returns the hex SHA-256 of the file at path.
func SHA256File(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("plugin: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("plugin: reading %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// start runs a new plugin process and opens its streams.
func (p *Plugin) start() (*process, error) {
	var secure *goplugin.SecureConfig
	if p.cfg.sum != nil {
		secure = &goplugin.SecureConfig{Checksum: p.cfg.sum, Hash: sha256.New()}
	}
	cc := &goplugin.ClientConfig{
		HandshakeConfig: pluginproto.Handshake,
		VersionedPlugins: map[int]goplugin.PluginSet{
			pluginproto.ProtocolVersion: {pluginproto.PluginKey: &pluginproto.GRPCPlugin{}},
		},
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		GRPCDialOptions:  pluginproto.DialOptions(),
		StartTimeout:     p.cfg.startTimeout,
		Logger:           pluginproto.NewHCLogger(p.log),
	}
	stopServed := func() {}
	if p.attach != nil {
		rc, stop, err := p.attach()
		if err != nil {
			return nil, fmt.Errorf("plugin: serving the attached plugin: %w", err)
		}
		stopServed = stop
		cc.Reattach = rc
		// A reattached client negotiates no version: it dispenses from
		// Plugins.
		cc.Plugins = cc.VersionedPlugins[pluginproto.ProtocolVersion]
	} else {
		cmd := exec.Command(p.path, p.cfg.args...)
		cmd.Env = []string{pluginproto.LogLevelEnv + "=" + pluginproto.LevelName(p.log)}
		cc.Cmd, cc.SecureConfig, cc.AutoMTLS, cc.SkipHostEnv = cmd, secure, true, true
		cc.SyncStdout = &lineLogger{l: p.log, stream: "stdout"}
		cc.SyncStderr = &lineLogger{l: p.log, stream: "stderr"}
	}
	client := goplugin.NewClient(cc)
	rpc, err := client.Client()
	if err != nil {
		stopServed()
		client.Kill()
		if errors.Is(err, goplugin.ErrChecksumsDoNotMatch) {
			got, _ := SHA256File(p.path)
			return nil, &ChecksumError{Path: p.path, Want: hex.EncodeToString(p.cfg.sum), Got: got}
		}
		return nil, fmt.Errorf("plugin: starting %s: %w", p.path, err)
	}
	raw, err := rpc.Dispense(pluginproto.PluginKey)
	if err != nil {
		stopServed()
		_ = rpc.Close()
		client.Kill()
		return nil, fmt.Errorf("plugin: %s: %w", p.path, err)
	}
	proc := newProcess(p, client, raw.(pluginproto.PluginClient))
	proc.attached, proc.stopServed = p.attach != nil, stopServed
	if rc := client.ReattachConfig(); rc != nil {
		proc.pid = rc.Pid
	}
	if gc, ok := rpc.(*goplugin.GRPCClient); ok {
		proc.conn = gc
	}
	if err := proc.openSession(); err != nil { // before the watcher, which reads proc.session
		proc.stop()
		return nil, fmt.Errorf("plugin: %s: opening the batching stream: %w", p.path, err)
	}
	proc.watchTimeouts(max(p.cfg.callTimeout/8, time.Millisecond))
	if err := proc.watchLiveness(); err != nil {
		proc.stop()
		return nil, fmt.Errorf("plugin: %s: opening a stream: %w", p.path, err)
	}
	for range p.cfg.streams { // warm the pool
		cs, err := proc.openCall()
		if err != nil {
			proc.stop()
			return nil, fmt.Errorf("plugin: %s: opening a stream: %w", p.path, err)
		}
		proc.release(cs)
	}
	return proc, nil
}

// install makes proc current and watches it. p.mu is held.
func (p *Plugin) install(proc *process) {
	p.proc = proc
	p.live.Store(proc)
	p.wg.Go(func() { p.watch(proc) })
}

// watch waits for proc to die and restarts the plugin with back-off,
// unless the death was asked for.
func (p *Plugin) watch(proc *process) {
	select {
	case <-proc.dead:
	case <-p.closing.Done():
		return
	}
	p.mu.Lock()
	if p.closed || p.proc != proc || proc.stopping.Load() {
		p.mu.Unlock()
		return
	}
	p.live.Store(nil)
	p.restarting = true
	if time.Since(proc.started) >= p.cfg.stableUptime {
		p.restartCount = 0 // it ran fine for a while: back to the initial delay
	}
	restart, backoff := p.nextBackoff()
	p.mu.Unlock()
	p.crashes.Add(1)
	p.log.Error("plugin process failed; restarting it", slog.Any("error", proc.cause), slog.Int("pid", proc.pid),
		slog.String("policy", p.cfg.policy.String()), slog.Int("restart", restart), slog.Duration("backoff", backoff))
	proc.stop()

	for {
		if !wait.Sleep(p.closing, backoff) {
			return
		}
		p.mu.Lock()
		unneeded := p.restartUnneeded()
		p.mu.Unlock()
		if unneeded {
			p.log.Info("plugin process stopped: no bus uses it")
			return
		}
		np, err := p.start()
		if err != nil {
			p.mu.Lock()
			restart, backoff = p.nextBackoff()
			p.mu.Unlock()
			p.log.Error("restarting plugin failed; retrying", slog.Any("error", err), slog.Int("restart", restart), slog.Duration("backoff", backoff))
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			np.stop()
			return
		}
		if p.restartUnneeded() {
			p.mu.Unlock()
			np.stop()
			p.log.Info("plugin process stopped: no bus uses it", slog.Int("pid", np.pid))
			return
		}
		if err := p.replay(np); err != nil {
			restart, backoff = p.nextBackoff()
			p.mu.Unlock()
			np.stop()
			p.log.Error("restoring plugin instances after restart failed; retrying", slog.Any("error", err), slog.Int("restart", restart), slog.Duration("backoff", backoff))
			continue
		}
		p.restarting = false
		p.install(np)
		p.mu.Unlock()
		p.restarts.Add(1)
		p.log.Warn("plugin restarted", slog.Int("pid", np.pid))
		return
	}
}

// restartUnneeded reports whether the last bus using the plugin stopped
// during the restart, and then ends the restart. p.mu is held.
func (p *Plugin) restartUnneeded() bool {
	if p.proc != nil {
		return false
	}
	p.restarting = false
	return true
}

// nextBackoff counts the next restart attempt and returns its number and
// the delay before it (the configured back-off's). p.mu is held.
func (p *Plugin) nextBackoff() (restart int, delay time.Duration) {
	p.restartCount++
	return p.restartCount, p.cfg.delay(p.restartCount)
}

// replay re-creates every live instance in a new process. p.mu is held.
func (p *Plugin) replay(proc *process) error {
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.startTimeout)
	defer cancel()
	for _, inst := range p.instances {
		if _, err := proc.rpc.Instantiate(ctx, inst.request()); err != nil {
			return fmt.Errorf("instantiating for bus %q: %w", inst.info.Name, err)
		}
		if inst.started && inst.hasStart {
			r, err := proc.rpc.Lifecycle(ctx, &pluginproto.LifecycleRequest{Instance: inst.id, Op: pluginproto.LifecycleRequest_OP_START, DeadlineUnixNano: pluginproto.Deadline(ctx)})
			if err == nil && r.Error != nil {
				err = errors.New(r.Error.Message)
			}
			if err != nil {
				return fmt.Errorf("starting for bus %q: %w", inst.info.Name, err)
			}
		}
	}
	return nil
}

// ensure returns a live process, starting one when the plugin is idle.
// p.mu is held. It returns nil, nil while a restart is in progress.
func (p *Plugin) ensure() (*process, error) {
	if p.closed {
		return nil, ErrClosed
	}
	if p.proc != nil || p.restarting {
		return p.live.Load(), nil
	}
	proc, err := p.start()
	if err != nil {
		return nil, err
	}
	p.install(proc)
	return proc, nil
}

// maxLogLine is the longest piece of a line of the plugin's stdout or
// stderr logged as one record: go-plugin's buffer for the plugin's log
// lines.
const maxLogLine = 64 << 10

// lineLogger logs what the plugin writes to its stdout or stderr.
type lineLogger struct {
	l      *slog.Logger
	stream string
	mu     sync.Mutex
	buf    []byte
}

func (w *lineLogger) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, b...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		switch {
		case i >= 0 && i <= maxLogLine:
			w.l.Info(string(w.buf[:i]), slog.String("stream", w.stream))
			w.buf = w.buf[i+1:]
		case len(w.buf) >= maxLogLine:
			// A line this long (or output without newline at all) is
			// logged in pieces, rather than held until a newline that
			// may never come.
			w.l.Info(string(w.buf[:maxLogLine]), slog.String("stream", w.stream))
			w.buf = w.buf[maxLogLine:]
		default:
			return len(b), nil
		}
	}
}

var _ bus.Plugin = (*Plugin)(nil)
