package plugin

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/plugbus/plugbus/internal/pluginproto"
	"google.golang.org/grpc"
)

// session is a process's Invoke stream, which carries the invocations made
// while others are in flight: their frames go to the plugin batched, as
// many as are ready, in one gRPC message, and the plugin answers in
// batches too, so that gRPC's work per message (framing, flow control, a
// wake of the reading goroutine on either side) is paid once per batch
// instead of once per invocation. A lone invocation takes a Call stream of
// the pool instead, which costs one hand-off less on either side.
//
// A goroutine reads the plugin's batches and hands each frame to its call.
// The invoking goroutines send (pluginproto.BatchSender): the first to find
// no send in progress yields once, so that the invocations about to be
// made join its batch, and sends everything queued for a few rounds; a
// flusher goroutine sends what keeps coming after that.
type session struct {
	proc   *process
	stream grpc.ClientStream
	cancel context.CancelFunc
	dead   chan struct{} // closed when the stream ended; err says why
	err    error

	mu    sync.Mutex // guards calls; frames are handed to calls under it
	calls map[uint64]*sessionCall
	// free and freeFrames are the calls that ended and the frames the
	// calls are done with, reused.
	free       pluginproto.Reuse[sessionCall]
	freeFrames pluginproto.Reuse[pluginproto.PluginFrame]

	out     *pluginproto.BatchSender
	endOnce sync.Once
}

// sessionCall is one invocation in flight on a session.
type sessionCall struct {
	id uint64
	// answers gets the plugin's frames for the call: a Next and a Done
	// may come back to back, as on a Call stream. expired gets a token
	// when the invocation timed out.
	answers  chan *pluginproto.PluginFrame
	expired  chan struct{}
	deadline atomic.Int64 // on the process's clock; 0: no timeout runs

	// The call's frames, reused: each is encoded before send returns.
	incoming       pluginproto.IncomingInvoke
	frame          pluginproto.HostFrame
	invoke         pluginproto.HostFrame_Invoke
	nextResultKind pluginproto.HostFrame_NextResult
	nextResult     pluginproto.NextResult
}

// openSession opens the process's Invoke stream and its reader.
func (proc *process) openSession() error {
	ctx, cancel := context.WithCancel(proc.streamsCtx)
	stream, err := proc.rpc.Invoke(ctx, pluginproto.StreamOptions()...)
	if err != nil {
		cancel()
		return err
	}
	ss := newSession(proc, stream, cancel)
	proc.session = ss
	proc.wg.Go(ss.read)
	proc.wg.Go(func() { ss.out.Flush(ss.dead) })
	return nil
}

// newSession makes the session of stream, whose context cancel ends; the
// caller starts its reader and its sender's flusher.
func newSession(proc *process, stream grpc.ClientStream, cancel context.CancelFunc) *session {
	ss := &session{proc: proc, stream: stream, cancel: cancel, dead: make(chan struct{}), calls: make(map[uint64]*sessionCall)}
	ss.out = pluginproto.NewBatchSender(stream, func(err error) { ss.end(fmt.Errorf("plugin connection ended: %w", err)) })
	return ss
}

// read hands the plugin's frames to their calls until the stream ends.
func (ss *session) read() {
	b := &pluginproto.BatchInto[pluginproto.PluginFrame]{Get: ss.freeFrames.Get}
	for {
		if err := ss.stream.RecvMsg(b); err != nil {
			ss.end(fmt.Errorf("plugin connection ended: %w", err))
			return
		}
		ss.mu.Lock()
		for _, f := range b.Frames {
			c := ss.calls[f.Call]
			if c == nil { // cancelled or timed out: the host stopped waiting
				ss.freeFrames.Put(f)
				continue
			}
			select {
			case c.answers <- f:
			default:
				ss.mu.Unlock()
				ss.end(fmt.Errorf("plugin protocol violation: a frame for call %d before the host answered the last", f.Call))
				return
			}
		}
		ss.mu.Unlock()
	}
}

// end ends the session: the process is failed, every call waiting wakes.
func (ss *session) end(err error) {
	ss.endOnce.Do(func() {
		ss.err = err
		ss.cancel()
		close(ss.dead)
		ss.proc.fail(err)
	})
}

// begin registers a new call.
func (ss *session) begin(id uint64) *sessionCall {
	c := ss.free.Pop()
	if c == nil {
		c = &sessionCall{answers: make(chan *pluginproto.PluginFrame, 2), expired: make(chan struct{}, 1)}
	}
	c.id = id
	ss.mu.Lock()
	ss.calls[id] = c
	ss.mu.Unlock()
	return c
}

// finish unregisters the call: no frame reaches it after, and it is
// reused.
func (ss *session) finish(c *sessionCall) {
	c.deadline.Store(0)
	ss.mu.Lock()
	delete(ss.calls, c.id)
	for len(c.answers) > 0 { // frames the call no longer waits for
		ss.freeFrames.Put(<-c.answers)
	}
	select { // a timeout's token
	case <-c.expired:
	default:
	}
	ss.mu.Unlock()
	ss.free.Put(c) // no frame nor token reaches it once out of calls
}

// abandon unregisters the call and tells the plugin to cancel it.
func (ss *session) abandon(c *sessionCall) {
	id := c.id
	ss.finish(c)
	f := pluginproto.HostFrame{Call: id, Kind: &pluginproto.HostFrame_Cancel{Cancel: &pluginproto.Cancel{}}}
	_ = ss.send(&f)
}

// send queues a frame (an *IncomingInvoke or a *HostFrame, encoded before
// send returns) for the plugin; see pluginproto.BatchSender.
func (ss *session) send(f any) error { return ss.out.Queue(f) }

// timeOut times out the session's calls past their deadline at now.
func (ss *session) timeOut(now int64) {
	ss.mu.Lock()
	for _, c := range ss.calls {
		if d := c.deadline.Load(); d != 0 && d <= now && c.deadline.CompareAndSwap(d, 0) && len(c.answers) == 0 { // else its answer came first
			select {
			case c.expired <- struct{}{}:
			default:
			}
		}
	}
	ss.mu.Unlock()
}

func (c *sessionCall) startTimeout(proc *process, d time.Duration) {
	c.deadline.Store(int64(proc.clock() + d))
}

// stopTimeout stops the invocation timeout; it reports false when the
// timeout expired first.
func (c *sessionCall) stopTimeout() bool { return c.deadline.Swap(0) != 0 }
