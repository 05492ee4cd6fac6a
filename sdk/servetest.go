package sdk

import (
	"context"
	"errors"
	"log/slog"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"
	"github.com/hashicorp/go-plugin/runner"
	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/lazylog"
	"github.com/plugbus/plugbus/internal/pluginproto"
)

// ServeTest serves p inside this process, through the same gRPC service
// and wire encoding as [Serve] over a local unix socket, until ctx ends or
// the host connected to it stops it. It returns the go-plugin reattach
// configuration a host connects with (plugin.Attach) and a channel closed
// once serving ended. It is the in-process half of sdk/sdktest's wire mode;
// a plugin binary calls Serve instead.
//
// Unlike Serve, ServeTest leaves the process's default logger alone: stage
// contexts log to logger (slog.Default() when nil); go-plugin's own records
// are dropped. The connection has no TLS: nothing crosses a process
// boundary.
func ServeTest(ctx context.Context, p bus.Plugin, logger *slog.Logger, opts ...Option) (*goplugin.ReattachConfig, <-chan struct{}, error) {
	if p == nil {
		return nil, nil, errors.New("sdk.ServeTest: nil plugin")
	}
	c := newServeConfig(opts)
	if logger == nil {
		logger = slog.Default()
	}
	s := newServer(p, c.version, slog.New(lazylog.New(logger.Handler())))
	reattach := make(chan *goplugin.ReattachConfig, 1)
	closed := make(chan struct{})
	go goplugin.Serve(&goplugin.ServeConfig{
		HandshakeConfig: pluginproto.Handshake,
		VersionedPlugins: map[int]goplugin.PluginSet{
			pluginproto.ProtocolVersion: {pluginproto.PluginKey: &pluginproto.GRPCPlugin{Impl: s}},
		},
		GRPCServer: newGRPCServer,
		// go-plugin's own records (such as its listener closing when the
		// host stops the plugin) say nothing about the plugin under test.
		Logger: hclog.NewNullLogger(),
		Test:   &goplugin.ServeTestConfig{Context: ctx, ReattachConfigCh: reattach, CloseCh: closed},
	})
	select {
	case rc := <-reattach:
		rc.ReattachFunc = func() (runner.AttachedRunner, error) { return inProcess{closed: closed}, nil }
		return rc, closed, nil
	case <-closed:
		return nil, nil, errors.New("sdk.ServeTest: serving ended before it began (is ctx done?)")
	}
}

// inProcess is the go-plugin runner of a plugin served by ServeTest: it
// ends when serving ends.
type inProcess struct{ closed <-chan struct{} }

func (r inProcess) Wait(ctx context.Context) error {
	select {
	case <-r.closed:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (inProcess) Kill(context.Context) error { return nil }
func (inProcess) ID() string                 { return "in-process" }
func (inProcess) PluginToHost(network, addr string) (string, string, error) {
	return network, addr, nil
}
func (inProcess) HostToPlugin(network, addr string) (string, string, error) {
	return network, addr, nil
}

var _ runner.AttachedRunner = inProcess{}
