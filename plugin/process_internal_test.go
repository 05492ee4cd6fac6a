package plugin

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/pluginproto"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// fakeCall is the host end of a Call stream whose plugin answers each
// invocation with the frames reply returns, back to back.
type fakeCall struct {
	grpc.ClientStream // unused
	ctx               context.Context
	recv              chan *pluginproto.PluginFrame
	reply             func(call uint64) []*pluginproto.PluginFrame
}

func (f *fakeCall) Send(fr *pluginproto.HostFrame) error {
	if _, ok := fr.Kind.(*pluginproto.HostFrame_Invoke); ok {
		for _, r := range f.reply(fr.Call) {
			f.recv <- r
		}
	}
	return nil
}

func (f *fakeCall) Recv() (*pluginproto.PluginFrame, error) {
	select {
	case fr := <-f.recv:
		return fr, nil
	case <-f.ctx.Done():
		return nil, io.EOF
	}
}

func (f *fakeCall) RecvMsg(m any) error {
	fr, err := f.Recv()
	if err != nil {
		return err
	}
	proto.Reset(m.(proto.Message))
	proto.Merge(m.(proto.Message), fr)
	return nil
}

// fakeProcess returns a plugin whose live process opens fake streams.
func fakeProcess(t *testing.T, reply func(call uint64) []*pluginproto.PluginFrame) (*Plugin, *process) {
	p := &Plugin{cfg: defaults(), instances: make(map[uint32]*instance), closing: context.Background()}
	p.cfg.callTimeout = 2 * time.Second
	p.initLog("fake", slog.New(slog.DiscardHandler))
	proc := newProcess(p, nil, nil)
	proc.newCall = func(ctx context.Context) (pluginproto.Plugin_CallClient, error) {
		return &fakeCall{ctx: ctx, recv: make(chan *pluginproto.PluginFrame, 8), reply: reply}, nil
	}
	p.live.Store(proc)
	t.Cleanup(func() {
		proc.endStreams()
		proc.wg.Wait()
	})
	return p, proc
}

func incomingInvoke() *pluginproto.Invoke {
	return &pluginproto.Invoke{Subject: &pluginproto.Invoke_Incoming{Incoming: &pluginproto.IncomingMessage{Name: "test.ping"}}}
}

// TestBackToBackFramesKept: a plugin that sends Next and Done back to back
// (its next returned before the host's result) has both frames handled,
// and the stream goes back to the pool.
func TestBackToBackFramesKept(t *testing.T) {
	p, proc := fakeProcess(t, func(call uint64) []*pluginproto.PluginFrame {
		return []*pluginproto.PluginFrame{
			{Call: call, Kind: &pluginproto.PluginFrame_Next{Next: &pluginproto.NextCall{}}},
			{Call: call, Kind: &pluginproto.PluginFrame_Done{Done: &pluginproto.Done{}}},
		}
	})
	inst := &instance{p: p, id: 1}
	for i := range 3 { // calls reuse their stream
		nexts := 0
		err := inst.invoke(context.Background(), bus.StageIncoming, nil, incomingInvoke(), nil, bus.NewIncomingNext(func(context.Context) error { nexts++; return nil }))
		if err != nil || nexts != 1 {
			t.Fatalf("invocation %d: got %v with next called %d times, want nil and once", i+1, err, nexts)
		}
	}
	select {
	case <-proc.dead:
		t.Fatalf("process failed: %v", proc.cause)
	default:
	}
	if len(proc.idle) != 1 {
		t.Fatalf("%d idle streams, want the one stream reused", len(proc.idle))
	}
	if s := p.Stats(); s.Timeouts != 0 {
		t.Fatalf("stats %+v, want no timeout", s)
	}
}

// TestTooManyFramesFailProcess: a plugin that sends a call more frames
// than the protocol allows is failed, not silently truncated.
func TestTooManyFramesFailProcess(t *testing.T) {
	p, proc := fakeProcess(t, func(call uint64) []*pluginproto.PluginFrame {
		next := &pluginproto.PluginFrame{Call: call, Kind: &pluginproto.PluginFrame_Next{Next: &pluginproto.NextCall{}}}
		return []*pluginproto.PluginFrame{next, next, next}
	})
	inst := &instance{p: p, id: 1}
	err := inst.invoke(context.Background(), bus.StageIncoming, nil, incomingInvoke(), nil, bus.NewIncomingNext(func(context.Context) error { return nil }))
	select {
	case <-proc.dead:
	default:
		t.Fatalf("process not failed (invoke returned %v)", err)
	}
	if !errorsIsUnavailable(err) {
		t.Fatalf("got %v, want an *UnavailableError", err)
	}
}

func errorsIsUnavailable(err error) bool {
	_, ok := err.(*UnavailableError)
	return ok
}

// releaseRecorder passes a Call stream's frames on and reports the calls
// it carries a Release of.
type releaseRecorder struct {
	pluginproto.Plugin_CallClient
	released chan<- uint64
}

func (r *releaseRecorder) Send(fr *pluginproto.HostFrame) error {
	if _, ok := fr.Kind.(*pluginproto.HostFrame_Release); ok {
		r.released <- fr.Call
	}
	return r.Plugin_CallClient.Send(fr)
}

// TestAbandonedCallIsReleased: a call the host gives up before the
// plugin's answer gets a Release, so that a before-only middleware's
// context kept for a next the host never runs is dropped.
func TestAbandonedCallIsReleased(t *testing.T) {
	invoked := make(chan uint64, 1)
	p, proc := fakeProcess(t, func(call uint64) []*pluginproto.PluginFrame {
		invoked <- call
		return nil // the plugin is slow: no answer yet
	})
	released := make(chan uint64, 4)
	newCall := proc.newCall
	proc.newCall = func(ctx context.Context) (pluginproto.Plugin_CallClient, error) {
		c, err := newCall(ctx)
		return &releaseRecorder{Plugin_CallClient: c, released: released}, err
	}
	inst := &instance{p: p, id: 1}
	ctx, cancel := context.WithCancel(context.Background())
	res := make(chan error, 1)
	go func() {
		res <- inst.invoke(ctx, bus.StageIncoming, nil, incomingInvoke(), nil, bus.NewIncomingNext(func(context.Context) error { return nil }))
	}()
	call := <-invoked
	cancel()
	if err := <-res; err == nil {
		t.Fatal("the abandoned invocation returned nil")
	}
	select {
	case got := <-released:
		if got != call {
			t.Fatalf("released call %d, want %d", got, call)
		}
	default:
		t.Fatal("no Release for the abandoned call")
	}
}

// TestFrameOfAnotherCallFailsProcess: a Next frame that comes on a stream
// after its call's Done (a plugin whose middleware returned while its
// next ran elsewhere, with an SDK that sent them in that order) is not
// taken by the stream's next invocation for its own: that invocation's
// rest of the chain does not run without its middleware calling next,
// and the process, which broke the protocol, is failed.
func TestFrameOfAnotherCallFailsProcess(t *testing.T) {
	p, proc := fakeProcess(t, func(call uint64) []*pluginproto.PluginFrame {
		done := &pluginproto.PluginFrame{Call: call, Kind: &pluginproto.PluginFrame_Done{Done: &pluginproto.Done{Error: &pluginproto.Error{Message: "refused"}}}}
		if call == 1 { // the first call's Next comes after its Done
			return []*pluginproto.PluginFrame{done, {Call: call, Kind: &pluginproto.PluginFrame_Next{Next: &pluginproto.NextCall{}}}}
		}
		return []*pluginproto.PluginFrame{done}
	})
	inst := &instance{p: p, id: 1}
	for i := range 2 {
		nexts := 0
		err := inst.invoke(context.Background(), bus.StageIncoming, nil, incomingInvoke(), nil, bus.NewIncomingNext(func(context.Context) error { nexts++; return nil }))
		if nexts != 0 {
			t.Fatalf("invocation %d: the rest of the chain ran, though its middleware refused the message", i+1)
		}
		if i == 0 {
			var pe *Error
			if !errors.As(err, &pe) || pe.Message != "refused" {
				t.Fatalf("invocation 1: got %v, want the plugin's refusal", err)
			}
			continue
		}
		if !errorsIsUnavailable(err) {
			t.Fatalf("invocation 2: got %v, want an *UnavailableError", err)
		}
	}
	select {
	case <-proc.dead:
	default:
		t.Fatal("process not failed")
	}
}
