package sdk

import (
	"context"
	"log/slog"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/pluginproto"
)

// cancelledStream is a Call stream the host cancelled (its invocation
// timed out, or its ctx ended) while the middleware ran: sends fail.
type cancelledStream struct {
	callStream
	ctx context.Context
}

func (s *cancelledStream) Context() context.Context { return s.ctx }
func (s *cancelledStream) Send(*pluginproto.PluginFrame) error {
	return context.Canceled
}
func (s *cancelledStream) SendMsg(m any) error { return s.Send(m.(*pluginproto.PluginFrame)) }

// A before-only middleware that gives next a context of its own, in an
// invocation the host cancelled meanwhile: the host does not run next, so
// sends no Release after it; the plugin must not keep the context (and
// the stage context and message it holds) for ever.
func TestCancelledHoldingCallKeepsNoContext(t *testing.T) {
	mw := bus.Middleware{Name: "keeper", Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
		<-ctx.Done() // slow: the host gives up meanwhile
		return next.Call(context.WithValue(ctx, ctxKey{}, in))
	}}
	s := newServer(BeforeOnly(mw), "v", slog.New(slog.DiscardHandler))
	if _, err := s.Instantiate(context.Background(), &pluginproto.InstantiateRequest{Instance: 1}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the host cancelled the stream
	const call = 7
	stream := &cancelledStream{ctx: ctx, callStream: callStream{in: []*pluginproto.HostFrame{{Call: call, Kind: &pluginproto.HostFrame_Invoke{Invoke: &pluginproto.Invoke{Instance: 1, Stage: pluginproto.Stage_STAGE_INCOMING,
		Subject: &pluginproto.Invoke_Incoming{Incoming: &pluginproto.IncomingMessage{Name: "m", Body: []byte(`{}`)}}}}}}}}
	_ = s.Call(stream)
	if _, ok := s.held.Load(uint64(call)); ok {
		t.Fatal("the plugin keeps the cancelled call's context for a Release that will never come")
	}
}
