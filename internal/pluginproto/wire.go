package pluginproto

import (
	"context"
	"errors"
	"math"
	"strings"
	"time"

	goplugin "github.com/hashicorp/go-plugin"
	"github.com/plugbus/plugbus/bus"
	"google.golang.org/grpc"
)

// ProtocolVersion is the current major of the wire protocol, negotiated
// through go-plugin's versioned plugin sets.
const ProtocolVersion = 1

// PluginKey is the name the middleware service is dispensed under.
const PluginKey = "middleware"

// LogLevelEnv carries the host's minimum log level to the plugin process
// ("debug", "info", "warn", "error").
const LogLevelEnv = "PLUGBUS_PLUGIN_LOG_LEVEL"

// Handshake is the go-plugin handshake of plugbus plugins. The magic cookie
// only stops a plugin binary from being run by hand by mistake; it is not a
// security measure (the checksum and mutual TLS are).
var Handshake = goplugin.HandshakeConfig{
	ProtocolVersion:  ProtocolVersion,
	MagicCookieKey:   "PLUGBUS_PLUGIN",
	MagicCookieValue: "5b0c6f1e-middleware",
}

// GRPCPlugin adapts the Plugin service to go-plugin. The plugin process
// sets Impl; the host uses GRPCClient.
type GRPCPlugin struct {
	goplugin.NetRPCUnsupportedPlugin
	Impl PluginServer
}

// GRPCServer registers the Plugin service.
func (p *GRPCPlugin) GRPCServer(_ *goplugin.GRPCBroker, s *grpc.Server) error {
	RegisterPluginServer(s, p.Impl)
	return nil
}

// GRPCClient returns a PluginClient on conn.
func (p *GRPCPlugin) GRPCClient(_ context.Context, _ *goplugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return NewPluginClient(c), nil
}

var _ goplugin.GRPCPlugin = (*GRPCPlugin)(nil)

// streamWindow is the static HTTP/2 flow-control window of the connection
// and of each stream, in both directions.
const streamWindow = 1 << 20

// StreamOptions are the call options of the host's streams to a plugin:
// frames are encoded with [Codec], and nothing sent is kept for a
// transparent retry. gRPC keeps what a stream sent, for a replay, until
// the stream first receives (or 256 KiB of it, counted by frame size): a
// stream that only sends (the Release frames of a pool stream no
// invocation used since) kept every frame's pooled buffer, several KiB
// for a frame of a few bytes. A stream to a plugin's process fails with
// the process, and the host's own failure handling applies.
func StreamOptions() []grpc.CallOption {
	return []grpc.CallOption{grpc.ForceCodecV2(Codec{}), grpc.MaxRetryRPCBufferSize(0)}
}

// DialOptions are the gRPC settings of the host's connection to a plugin.
//
// Static flow-control windows turn off grpc-go's bandwidth-delay-product
// estimator. Its probe (a window update and a PING, answered by a PING ack)
// goes out whenever a data frame arrives and no probe is outstanding: in a
// request-response exchange that is every round trip, tripling the frames
// each side writes and wakes up for. On a local socket the estimator has
// nothing to learn; a fixed 1 MiB window never throttles invocations.
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithStaticStreamWindowSize(streamWindow), grpc.WithStaticConnWindowSize(streamWindow)}
}

// NewGRPCServer is the gRPC server of a plugin process: go-plugin's options
// (transport credentials) plus the same static windows as [DialOptions],
// and no limit on the size of a message received, as go-plugin sets none
// on the host's side: gRPC's default of 4 MiB would refuse a message's
// invocation that size, or a batch of invocations adding up to it, and
// end the stream.
func NewGRPCServer(opts []grpc.ServerOption) *grpc.Server {
	opts = append(opts[:len(opts):len(opts)], grpc.StaticStreamWindowSize(streamWindow), grpc.StaticConnWindowSize(streamWindow),
		grpc.MaxRecvMsgSize(math.MaxInt32))
	return grpc.NewServer(opts...)
}

// ValidText is s with U+FFFD in place of bytes that are not valid UTF-8:
// an error's text may hold any bytes, a protobuf string may not.
func ValidText(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }

// StageOf converts a bus stage.
func StageOf(s bus.Stage) Stage {
	switch s {
	case bus.StageIncoming:
		return Stage_STAGE_INCOMING
	case bus.StageHandler:
		return Stage_STAGE_HANDLER
	case bus.StageOutgoing:
		return Stage_STAGE_OUTGOING
	}
	return Stage_STAGE_UNSPECIFIED
}

// BusStage converts a wire stage.
func BusStage(s Stage) bus.Stage {
	switch s {
	case Stage_STAGE_INCOMING:
		return bus.StageIncoming
	case Stage_STAGE_HANDLER:
		return bus.StageHandler
	case Stage_STAGE_OUTGOING:
		return bus.StageOutgoing
	}
	return 0
}

// FromAttributes encodes bus attributes.
func FromAttributes(a bus.Attributes) *Attributes {
	p := new(Attributes)
	SetAttributes(p, a)
	return p
}

// SetAttributes encodes bus attributes into p, which it resets first,
// keeping (cleared) the maps p already has, so that a pooled p allocates
// no maps once they exist.
func SetAttributes(p *Attributes, a bus.Attributes) {
	values, sticky := p.Values, p.Sticky
	clear(values)
	clear(sticky)
	*p = Attributes{MessageId: a.MessageID, CorrelationId: a.CorrelationID, Values: values, Sticky: sticky}
	if !a.SentAt.IsZero() {
		p.SentAtUnixNano = a.SentAt.UnixNano()
	}
	if n, s := a.Len(); n > 0 || s > 0 {
		if n > 0 {
			if p.Values == nil {
				p.Values = make(map[string]string, n)
			}
			for k, v := range a.Values() {
				p.Values[k] = v
			}
		}
		if s > 0 {
			if p.Sticky == nil {
				p.Sticky = make(map[string]string, s)
			}
			for k, v := range a.StickyValues() {
				p.Sticky[k] = v
			}
		}
	}
}

// ToAttributes decodes attributes. It takes ownership of p's maps.
func ToAttributes(p *Attributes) bus.Attributes {
	if p == nil {
		return bus.Attributes{}
	}
	var sent time.Time
	if p.SentAtUnixNano != 0 {
		sent = time.Unix(0, p.SentAtUnixNano).UTC()
	}
	return bus.NewAttributes(p.MessageId, p.CorrelationId, sent, p.Values, p.Sticky)
}

// NoDeadline is the deadline a plugin reports for the context its
// middleware gave next when that context has none but the invocation's
// had one: the middleware detached the rest of the chain from the host's
// deadline (context.WithoutCancel), and the host runs the rest without
// one. A host that only shortens deadlines takes it for a deadline later
// than its own, and keeps its own.
const NoDeadline int64 = math.MaxInt64

// Deadline encodes ctx's deadline, 0 when it has none.
func Deadline(ctx context.Context) int64 {
	if d, ok := ctx.Deadline(); ok {
		return d.UnixNano()
	}
	return 0
}

// EncodeError encodes err's kind, message, whether it is marked permanent
// (errors.Is(err, bus.ErrPermanent)) and, for a [*bus.NextMisuseError],
// the stage and middleware it names. It returns nil for a nil error.
func EncodeError(err error) *Error {
	if err == nil {
		return nil
	}
	e := &Error{Message: ValidText(err.Error()), Permanent: errors.Is(err, bus.ErrPermanent)}
	var misuse *bus.NextMisuseError
	switch {
	case errors.As(err, &misuse):
		e.Code = ErrorCode_ERROR_CODE_NEXT_CALLED_TWICE
		e.Stage, e.Middleware, e.AfterReturn = StageOf(misuse.Stage), misuse.Middleware, misuse.AfterReturn
	case errors.Is(err, context.Canceled):
		e.Code = ErrorCode_ERROR_CODE_CANCELED
	case errors.Is(err, context.DeadlineExceeded):
		e.Code = ErrorCode_ERROR_CODE_DEADLINE_EXCEEDED
	case errors.Is(err, bus.ErrPanic):
		e.Code = ErrorCode_ERROR_CODE_PANIC
	case errors.Is(err, bus.ErrHandlerDispatchRejected):
		e.Code = ErrorCode_ERROR_CODE_HANDLER_DISPATCH_REJECTED
	case errors.Is(err, bus.ErrDecode):
		e.Code = ErrorCode_ERROR_CODE_DECODE
	case errors.Is(err, bus.ErrHeaderReserved):
		e.Code = ErrorCode_ERROR_CODE_HEADER_RESERVED
	case errors.Is(err, bus.ErrClosed):
		e.Code = ErrorCode_ERROR_CODE_CLOSED
	case errors.Is(err, bus.ErrNoRoute):
		e.Code = ErrorCode_ERROR_CODE_NO_ROUTE
	}
	return e
}

// Sentinel returns the error that errors.Is should match for code: a bus
// sentinel or a context error; nil for an unspecified code.
func Sentinel(code ErrorCode) error {
	switch code {
	case ErrorCode_ERROR_CODE_NEXT_CALLED_TWICE:
		return bus.ErrNextMisused
	case ErrorCode_ERROR_CODE_CANCELED:
		return context.Canceled
	case ErrorCode_ERROR_CODE_DEADLINE_EXCEEDED:
		return context.DeadlineExceeded
	case ErrorCode_ERROR_CODE_PANIC:
		return bus.ErrPanic
	case ErrorCode_ERROR_CODE_HANDLER_DISPATCH_REJECTED:
		return bus.ErrHandlerDispatchRejected
	case ErrorCode_ERROR_CODE_DECODE:
		return bus.ErrDecode
	case ErrorCode_ERROR_CODE_HEADER_RESERVED:
		return bus.ErrHeaderReserved
	case ErrorCode_ERROR_CODE_CLOSED:
		return bus.ErrClosed
	case ErrorCode_ERROR_CODE_NO_ROUTE:
		return bus.ErrNoRoute
	}
	return nil
}

// NextCalledTwice rebuilds the typed error that an error of code
// ERROR_CODE_NEXT_CALLED_TWICE (either misuse of next) describes, or
// returns nil.
func NextCalledTwice(e *Error) *bus.NextMisuseError {
	if e.GetCode() != ErrorCode_ERROR_CODE_NEXT_CALLED_TWICE {
		return nil
	}
	return &bus.NextMisuseError{Stage: BusStage(e.Stage), Middleware: e.Middleware, AfterReturn: e.AfterReturn}
}

// FromDue returns a due time on the wire: 0 for the zero time (now).
func FromDue(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// ToDue reads a due time from the wire: the zero time for 0.
func ToDue(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}
