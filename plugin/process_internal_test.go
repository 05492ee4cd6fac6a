package plugin

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/pluginproto"
	"google.golang.org/grpc"
)

// fakeInvoke is the host end of an Invoke stream whose plugin answers each
// invocation with the frames reply returns, in one batch.
type fakeInvoke struct {
	grpc.ClientStream // unused
	ctx               context.Context
	dead              <-chan struct{}               // the reader gave up (no watcher stops the fake)
	recv              chan *pluginproto.PluginBatch // unbuffered
	reply             func(call uint64) []*pluginproto.PluginFrame
}

// Send answers Invoke frames, and returns only once the host's reader has
// handled the whole answer: the invoking goroutine does not read its
// frames meanwhile.
func (f *fakeInvoke) Send(b *pluginproto.HostBatch) error {
	for _, fr := range b.Frames {
		if _, ok := fr.Kind.(*pluginproto.HostFrame_Invoke); ok {
			for _, batch := range []*pluginproto.PluginBatch{{Frames: f.reply(fr.Call)}, {}} {
				select {
				case f.recv <- batch: // the empty batch is taken once the answer was handled
				case <-f.ctx.Done():
					return io.EOF
				case <-f.dead:
					return nil
				}
			}
		}
	}
	return nil
}

func (f *fakeInvoke) Recv() (*pluginproto.PluginBatch, error) {
	select {
	case b := <-f.recv:
		return b, nil
	case <-f.ctx.Done():
		return nil, io.EOF
	}
}

// fakeProcess returns a plugin whose live process is one fake stream.
func fakeProcess(t *testing.T, reply func(call uint64) []*pluginproto.PluginFrame) (*Plugin, *process) {
	p := &Plugin{cfg: defaults(), instances: make(map[uint32]*instance), closing: context.Background()}
	p.cfg.callTimeout = 2 * time.Second
	p.initLog("fake", slog.New(slog.DiscardHandler))
	proc := newProcess(p, nil, nil)
	st := &stream{proc: proc, rpcStream: &fakeInvoke{ctx: proc.streamsCtx, dead: proc.dead, recv: make(chan *pluginproto.PluginBatch), reply: reply}, calls: make(map[uint64]*pendingCall)}
	proc.streams = append(proc.streams, st)
	proc.wg.Go(st.readLoop)
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
// (its next returned before the host's result) has both frames handled.
func TestBackToBackFramesKept(t *testing.T) {
	p, proc := fakeProcess(t, func(call uint64) []*pluginproto.PluginFrame {
		return []*pluginproto.PluginFrame{
			{Call: call, Kind: &pluginproto.PluginFrame_Next{Next: &pluginproto.NextCall{}}},
			{Call: call, Kind: &pluginproto.PluginFrame_Done{Done: &pluginproto.Done{}}},
		}
	})
	inst := &instance{p: p, id: 1}
	for i := range 3 { // calls reuse their channel
		nexts := 0
		err := inst.invoke(context.Background(), bus.StageIncoming, incomingInvoke(), nil, func(context.Context) error { nexts++; return nil })
		if err != nil || nexts != 1 {
			t.Fatalf("invocation %d: got %v with next called %d times, want nil and once", i+1, err, nexts)
		}
	}
	select {
	case <-proc.dead:
		t.Fatalf("process failed: %v", proc.cause)
	default:
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
	err := inst.invoke(context.Background(), bus.StageIncoming, incomingInvoke(), nil, func(context.Context) error { return nil })
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
