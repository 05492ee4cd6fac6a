package bench

import (
	"context"
	"errors"
	"io"

	goplugin "github.com/hashicorp/go-plugin"
	"github.com/plugbus/plugbus/internal/pluginproto"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The raw go-plugin baseline: a plugin that echoes every message of one
// bidirectional gRPC stream, served and dialled with the same go-plugin
// and gRPC settings as plugbus's plugins (unix socket, AutoMTLS, the same
// static 1 MiB flow-control windows), without plugbus's protocol.

// rawEchoHandshake is the baseline's own handshake: a plugbus host would
// refuse it, and it would refuse a plugbus host.
var rawEchoHandshake = goplugin.HandshakeConfig{ProtocolVersion: 1, MagicCookieKey: "PLUGBUS_BENCH_RAWECHO", MagicCookieValue: "echo"}

const rawEchoKey = "echo"

var rawEchoDesc = grpc.ServiceDesc{
	ServiceName: "plugbus.bench.Echo",
	HandlerType: (*any)(nil),
	Streams: []grpc.StreamDesc{{
		StreamName:    "Echo",
		ServerStreams: true,
		ClientStreams: true,
		Handler: func(_ any, stream grpc.ServerStream) error {
			m := new(wrapperspb.BytesValue)
			for {
				if err := stream.RecvMsg(m); err != nil {
					if errors.Is(err, io.EOF) {
						return nil
					}
					return err
				}
				if err := stream.SendMsg(m); err != nil {
					return err
				}
			}
		},
	}},
}

type rawEchoPlugin struct {
	goplugin.NetRPCUnsupportedPlugin
}

func (rawEchoPlugin) GRPCServer(_ *goplugin.GRPCBroker, s *grpc.Server) error {
	s.RegisterService(&rawEchoDesc, struct{}{})
	return nil
}

func (rawEchoPlugin) GRPCClient(_ context.Context, _ *goplugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return c, nil
}

// ServeRawEcho serves the raw echo baseline; the main of
// bench/cmd/rawecho-plugin calls it. It does not return.
func ServeRawEcho() {
	goplugin.Serve(&goplugin.ServeConfig{
		HandshakeConfig: rawEchoHandshake,
		VersionedPlugins: map[int]goplugin.PluginSet{
			1: {rawEchoKey: rawEchoPlugin{}},
		},
		GRPCServer: pluginproto.NewGRPCServer,
	})
}
