package plugin

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	goplugin "github.com/hashicorp/go-plugin"
	"github.com/plugbus/plugbus/internal/pluginproto"
	"google.golang.org/grpc/health/grpc_health_v1"
)

// process is one running plugin process and its streams.
type process struct {
	p       *Plugin
	client  *goplugin.Client
	conn    *goplugin.GRPCClient
	rpc     pluginproto.PluginClient
	pid     int
	started time.Time
	// attached: served by Attach's serve function; Kill leaves such a
	// plugin alone, closing the connection stops it.
	attached bool

	streamsCtx context.Context
	endStreams context.CancelFunc
	wg         sync.WaitGroup

	streams    []*stream
	nextStream atomic.Uint32 // round robin over streams
	lastCallID atomic.Uint64

	dead                chan struct{}
	deadOnce            sync.Once
	cause               error
	stopping            atomic.Bool
	stopOnce            sync.Once
	consecutiveTimeouts atomic.Int32
	pinging             atomic.Bool
}

func newProcess(p *Plugin, client *goplugin.Client, rpc pluginproto.PluginClient) *process {
	streamsCtx, endStreams := context.WithCancel(context.Background())
	return &process{p: p, client: client, rpc: rpc, started: time.Now(), streamsCtx: streamsCtx, endStreams: endStreams, dead: make(chan struct{})}
}

// fail marks the process dead; the plugin's watcher restarts it.
func (proc *process) fail(err error) {
	proc.deadOnce.Do(func() {
		proc.cause = err
		close(proc.dead)
	})
}

// stop ends the streams and the process and waits for their goroutines.
func (proc *process) stop() {
	proc.stopOnce.Do(func() {
		proc.stopping.Store(true)
		proc.fail(errors.New("plugin stopped"))
		proc.endStreams()
		if proc.attached && proc.conn != nil {
			_ = proc.conn.Close()
		}
		proc.client.Kill()
		proc.wg.Wait()
	})
}

func (proc *process) pick() *stream {
	if len(proc.streams) == 1 {
		return proc.streams[0]
	}
	return proc.streams[int(proc.nextStream.Add(1))%len(proc.streams)]
}

// checkHung pings the process after a timeout and declares it hung when it
// does not answer, or after too many consecutive timeouts.
func (proc *process) checkHung() {
	if proc.consecutiveTimeouts.Add(1) >= int32(proc.p.cfg.hungTimeouts) {
		proc.fail(errors.New("plugin hung: consecutive invocation timeouts"))
		return
	}
	if proc.conn == nil || !proc.pinging.CompareAndSwap(false, true) {
		return
	}
	defer proc.pinging.Store(false)
	ctx, cancel := context.WithTimeout(proc.streamsCtx, time.Second)
	defer cancel()
	_, err := grpc_health_v1.NewHealthClient(proc.conn.Conn).Check(ctx, &grpc_health_v1.HealthCheckRequest{Service: goplugin.GRPCServiceName})
	if err != nil && proc.streamsCtx.Err() == nil {
		proc.fail(errors.New("plugin hung: health check failed after an invocation timeout: " + err.Error()))
	}
}

// stream is one long-lived Invoke stream; frames for many calls are
// multiplexed over it, correlated by call id.
type stream struct {
	proc      *process
	rpcStream pluginproto.Plugin_InvokeClient

	sendMu  sync.Mutex // guards sending, pending, batch and sendErr
	sending bool
	pending []*pluginproto.HostFrame
	batch   pluginproto.HostBatch
	sendErr error

	mu       sync.Mutex // guards calls
	calls    map[uint64]*pendingCall
	callPool sync.Pool // of *pendingCall, reused with their channel and timer
}

// callFrames is how many frames of one call can wait for the host to read
// them: a plugin sends a call at most a Next (the middleware called next)
// and a Done. The SDK sends the Done after the host answered the Next, but
// a plugin whose next returned early sends both back to back.
const callFrames = 2

// pendingCall is one stage invocation awaiting the plugin.
type pendingCall struct {
	id    uint64
	ch    chan *pluginproto.PluginFrame
	timer *time.Timer // per-invocation timeout, reused with the call
}

func (proc *process) openStream() error {
	s, err := proc.rpc.Invoke(proc.streamsCtx)
	if err != nil {
		return err
	}
	st := &stream{proc: proc, rpcStream: s, calls: make(map[uint64]*pendingCall)}
	proc.streams = append(proc.streams, st)
	proc.wg.Go(st.readLoop)
	return nil
}

func (st *stream) readLoop() {
	for {
		b, err := st.rpcStream.Recv()
		if err != nil {
			st.proc.fail(err)
			return
		}
		for _, f := range b.Frames {
			st.mu.Lock() // held while sending: drop cannot recycle c meanwhile
			ok := true
			if c := st.calls[f.Call]; c != nil {
				select {
				case c.ch <- f:
				default: // more than the protocol allows: never drop one silently
					ok = false
				}
			}
			st.mu.Unlock()
			if !ok {
				st.proc.fail(fmt.Errorf("plugin protocol violation: more than %d unanswered frames for call %d", callFrames, f.Call))
				return
			}
		}
	}
}

// send queues f for the plugin and reports false when the process is
// dead. The first caller to find no send in progress becomes the sender
// and writes everything queued meanwhile in one gRPC message per round, so
// frames batch under load without a writer goroutine hop. Only the sender
// can block (on flow control, if the plugin stops reading); hang detection
// then kills the process, which ends the send.
func (st *stream) send(f *pluginproto.HostFrame) bool {
	st.sendMu.Lock()
	if st.sendErr != nil {
		st.sendMu.Unlock()
		return false
	}
	st.pending = append(st.pending, f)
	if st.sending {
		st.sendMu.Unlock()
		return true
	}
	st.sending = true
	for len(st.pending) > 0 {
		st.batch.Frames, st.pending = st.pending, st.batch.Frames[:0]
		st.sendMu.Unlock()
		err := st.rpcStream.Send(&st.batch)
		clear(st.batch.Frames)
		st.sendMu.Lock()
		if err != nil {
			st.sendErr = err
			st.pending = nil
			st.proc.fail(err)
		}
	}
	st.sending = false
	ok := st.sendErr == nil
	st.sendMu.Unlock()
	return ok
}

func (st *stream) newCall() *pendingCall {
	c, _ := st.callPool.Get().(*pendingCall)
	if c == nil {
		c = &pendingCall{ch: make(chan *pluginproto.PluginFrame, callFrames), timer: time.NewTimer(time.Hour)}
		c.timer.Stop()
	}
	c.id = st.proc.lastCallID.Add(1)
	st.mu.Lock()
	st.calls[c.id] = c
	st.mu.Unlock()
	return c
}

func (st *stream) drop(c *pendingCall) {
	st.mu.Lock()
	delete(st.calls, c.id)
	st.mu.Unlock()
	for len(c.ch) > 0 { // frames that arrived after we stopped listening
		<-c.ch
	}
	st.callPool.Put(c)
}
