package plugin

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/pluginproto"
	"google.golang.org/grpc"
)

// fakeInvokeStream is the host end of an Invoke stream. Until open is
// closed, each SendMsg announces itself on entered and returns when gate
// gives it a token (a plugin that is slow to read); RecvMsg hands out the
// batches given to recv (unbuffered: a second send returns once the
// reader is done with the first batch).
type fakeInvokeStream struct {
	grpc.ClientStream
	ctx           context.Context
	entered, gate chan struct{}
	open          chan struct{}
	recv          chan []*pluginproto.PluginFrame
}

func (f *fakeInvokeStream) SendMsg(any) error {
	select {
	case f.entered <- struct{}{}:
	case <-f.open:
		return nil
	case <-f.ctx.Done():
		return f.ctx.Err()
	}
	select {
	case <-f.gate:
		return nil
	case <-f.open:
		return nil
	case <-f.ctx.Done():
		return f.ctx.Err()
	}
}

func (f *fakeInvokeStream) RecvMsg(m any) error {
	select {
	case fr := <-f.recv:
		m.(*pluginproto.BatchInto[pluginproto.PluginFrame]).Frames = fr
		return nil
	case <-f.ctx.Done():
		return io.EOF
	}
}

// give hands the reader a batch; it fails the test when the process
// failed instead.
func give(t *testing.T, fs *fakeInvokeStream, proc *process, frames []*pluginproto.PluginFrame) {
	t.Helper()
	select {
	case fs.recv <- frames:
	case <-proc.dead:
		t.Fatalf("the process failed: %v", proc.cause)
	}
}

// fakeSession gives a fake process a session on a fakeInvokeStream that
// every invocation takes.
func fakeSession(p *Plugin, proc *process) *fakeInvokeStream {
	p.cfg.sessionFrom = 1
	ctx, cancel := context.WithCancel(proc.streamsCtx)
	fs := &fakeInvokeStream{ctx: ctx, entered: make(chan struct{}), gate: make(chan struct{}), open: make(chan struct{}), recv: make(chan []*pluginproto.PluginFrame)}
	ss := newSession(proc, fs, cancel)
	proc.session = ss
	proc.wg.Go(ss.read)
	proc.wg.Go(func() { ss.out.Flush(ss.dead) })
	return fs
}

// TestSessionLateAnswerAfterTimeout: a call that times out while its
// goroutine is still sending (not yet waiting for its answer), and whose
// answer then comes, ends with the timeout or the answer; the late frame
// is no protocol violation, and the process lives on.
func TestSessionLateAnswerAfterTimeout(t *testing.T) {
	p, proc := fakeProcess(t, nil)
	fs := fakeSession(p, proc)
	inst := &instance{p: p, id: 1}
	res := make(chan error, 1)
	go func() {
		res <- inst.invoke(context.Background(), bus.StageIncoming, nil, incomingInvoke(), nil, bus.NewIncomingNext(func(context.Context) error { return nil }))
	}()
	<-fs.entered                                          // the call's goroutine sends its batch
	proc.session.timeOut(int64(proc.clock() + time.Hour)) // the watcher's tick
	give(t, fs, proc, []*pluginproto.PluginFrame{{Call: 1, Kind: &pluginproto.PluginFrame_Done{Done: &pluginproto.Done{Continue: true}}}})
	give(t, fs, proc, nil) // the reader is done with the late answer
	close(fs.open)
	err := <-res
	var te *TimeoutError
	if err != nil && !errors.As(err, &te) {
		t.Fatalf("got %v, want nil (the answer) or a *TimeoutError", err)
	}
	select {
	case <-proc.dead:
		t.Fatalf("the late answer failed the process: %v", proc.cause)
	default:
	}
}

// TestSessionBackToBackFramesKept: as TestBackToBackFramesKept on a Call
// stream, a plugin's Next and Done back to back, before the host waits
// for them, are both handled.
func TestSessionBackToBackFramesKept(t *testing.T) {
	p, proc := fakeProcess(t, nil)
	fs := fakeSession(p, proc)
	inst := &instance{p: p, id: 1}
	for i := range 3 { // the calls are reused
		nexts := 0
		res := make(chan error, 1)
		go func() {
			res <- inst.invoke(context.Background(), bus.StageIncoming, nil, incomingInvoke(), nil, bus.NewIncomingNext(func(context.Context) error { nexts++; return nil }))
		}()
		<-fs.entered // the invocation's frame
		id := inst.p.lastCallID.Load()
		give(t, fs, proc, []*pluginproto.PluginFrame{
			{Call: id, Kind: &pluginproto.PluginFrame_Next{Next: &pluginproto.NextCall{}}},
			{Call: id, Kind: &pluginproto.PluginFrame_Done{Done: &pluginproto.Done{}}},
		})
		give(t, fs, proc, nil)
		fs.gate <- struct{}{}
		<-fs.entered // the result of next
		fs.gate <- struct{}{}
		if err := <-res; err != nil || nexts != 1 {
			t.Fatalf("invocation %d: got %v with next called %d times, want nil and once", i+1, err, nexts)
		}
	}
	select {
	case <-proc.dead:
		t.Fatalf("process failed: %v", proc.cause)
	default:
	}
}
