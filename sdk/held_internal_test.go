package sdk

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/pluginproto"
	"google.golang.org/grpc"
)

// callStream is a Call stream's plugin end fed with frames.
type callStream struct {
	grpc.ServerStream
	in   []*pluginproto.HostFrame
	sent []*pluginproto.PluginFrame
}

func (s *callStream) Context() context.Context { return context.Background() }

func (s *callStream) RecvMsg(m any) error {
	if len(s.in) == 0 {
		return io.EOF
	}
	f := m.(*pluginproto.HostFrame)
	f.Call, f.Kind = s.in[0].Call, s.in[0].Kind
	s.in = s.in[1:]
	return nil
}

func (s *callStream) Send(f *pluginproto.PluginFrame) error {
	if _, err := pluginproto.AppendBatchFrame(nil, f); err != nil { // refused as gRPC would
		return err
	}
	s.sent = append(s.sent, f)
	return nil
}

func (s *callStream) Recv() (*pluginproto.HostFrame, error) {
	f := new(pluginproto.HostFrame)
	return f, s.RecvMsg(f)
}

func (s *callStream) SendMsg(m any) error { return s.Send(m.(*pluginproto.PluginFrame)) }

type ctxKey struct{}

// A before-only middleware whose changes cannot cross (a header that is
// not valid UTF-8) and that gave next a context of its own fails the
// invocation, and the plugin keeps no context for a Release the host will
// never send.
func TestUnencodableChangesKeepNoContext(t *testing.T) {
	mw := bus.Middleware{Name: "bad", Outgoing: func(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
		out.Headers()["x-bad"] = "\xff"
		return next.Call(context.WithValue(ctx, ctxKey{}, "kept"))
	}}
	s := newServer(BeforeOnly(mw, bus.StageOutgoing), "v", slog.New(slog.DiscardHandler))
	if _, err := s.Instantiate(context.Background(), &pluginproto.InstantiateRequest{Instance: 1}); err != nil {
		t.Fatal(err)
	}
	const call = 7
	stream := &callStream{in: []*pluginproto.HostFrame{{Call: call, Kind: &pluginproto.HostFrame_Invoke{Invoke: &pluginproto.Invoke{Instance: 1, Stage: pluginproto.Stage_STAGE_OUTGOING,
		Subject: &pluginproto.Invoke_Outgoing{Outgoing: &pluginproto.OutgoingMessage{Name: "m", Body: []byte(`{}`)}}}}}}}
	if err := s.Call(stream); err != nil {
		t.Fatal(err)
	}
	if len(stream.sent) != 1 {
		t.Fatalf("%d frames sent, want one Done", len(stream.sent))
	}
	d := stream.sent[0].GetDone()
	if d == nil || d.Error == nil || !d.Error.Permanent || d.Continue || d.HoldsContext {
		t.Fatalf("sent %v, want a Done with a permanent error, neither continuing nor holding a context", stream.sent[0])
	}
	if _, ok := s.held.Load(uint64(call)); ok {
		t.Fatal("the plugin keeps the call's context, for a Release that will never come")
	}
}
