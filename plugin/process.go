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
	"google.golang.org/grpc"
	"google.golang.org/grpc/health/grpc_health_v1"
)

// process is one running plugin process and its pool of streams.
type process struct {
	p       *Plugin
	client  *goplugin.Client
	conn    *goplugin.GRPCClient
	rpc     pluginproto.PluginClient
	pid     int
	started time.Time
	// attached: served by Attach's serve function; Kill leaves such a
	// plugin alone, closing the connection stops it.
	attached   bool
	stopServed func() // stops an attached plugin's serving; a no-op otherwise

	streamsCtx context.Context
	endStreams context.CancelFunc
	wg         sync.WaitGroup

	// newCall opens a Call stream (proc.rpc.Call; tests fake it).
	newCall    func(ctx context.Context) (pluginproto.Plugin_CallClient, error)
	poolMu     sync.Mutex
	idle       []*callStream            // the pool's idle streams, the last used last
	open       map[*callStream]struct{} // every stream not abandoned, for watchTimeouts
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
	proc := &process{p: p, client: client, rpc: rpc, started: time.Now(), streamsCtx: streamsCtx, endStreams: endStreams, dead: make(chan struct{}), stopServed: func() {},
		open: make(map[*callStream]struct{})}
	if rpc != nil {
		proc.newCall = func(ctx context.Context) (pluginproto.Plugin_CallClient, error) {
			return rpc.Call(ctx, grpc.ForceCodecV2(pluginproto.Codec{}))
		}
	}
	return proc
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
		if proc.attached {
			// Serving stops first: go-plugin's test-mode server must not
			// be stopped by its Shutdown RPC and its context at once.
			proc.stopServed()
			if proc.conn != nil {
				_ = proc.conn.Close()
			}
		}
		proc.client.Kill()
		proc.wg.Wait()
	})
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

// callStream is one Call stream of a process's pool: it carries one
// invocation at a time, read and written by the invoking goroutine itself,
// so that an invocation costs what a plain gRPC exchange costs: no reader
// goroutine, no hand-off, no call table. Cancelling the stream (the
// host's ctx ended, the invocation timed out, the rest of the chain
// panicked) cancels the invocation in the plugin; such a stream is
// dropped, an idle one goes back to the pool.
type callStream struct {
	proc   *process
	rpc    pluginproto.Plugin_CallClient
	cancel context.CancelFunc
	// deadline is when the invocation times out, on the process's clock;
	// 0 when no timeout runs. watchTimeouts sets timedOut and cancels.
	deadline atomic.Int64
	timedOut atomic.Bool

	// The frames of the stream's invocations, reused: each is encoded
	// before Send returns.
	in             pluginproto.PluginFrame // each Recv's frame
	out            pluginproto.HostFrame
	invoke         pluginproto.HostFrame_Invoke
	incoming       pluginproto.IncomingInvoke
	nextResultKind pluginproto.HostFrame_NextResult
	nextResult     pluginproto.NextResult
}

// openCall opens a Call stream.
func (proc *process) openCall() (*callStream, error) {
	ctx, cancel := context.WithCancel(proc.streamsCtx)
	rpc, err := proc.newCall(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	cs := &callStream{proc: proc, rpc: rpc, cancel: cancel}
	proc.poolMu.Lock()
	proc.open[cs] = struct{}{}
	proc.poolMu.Unlock()
	return cs, nil
}

// clock is the time since the process started, monotonic.
func (proc *process) clock() time.Duration { return time.Since(proc.started) }

// startTimeout starts the invocation timeout of the stream's invocation.
func (cs *callStream) startTimeout(d time.Duration) {
	cs.deadline.Store(int64(cs.proc.clock() + d))
}

// stopTimeout stops the invocation timeout; it reports false when the
// timeout expired first.
func (cs *callStream) stopTimeout() bool { return cs.deadline.Swap(0) != 0 }

// watchTimeouts times out the invocations that run past their deadline,
// checking the streams every interval, until the streams end. One
// watcher per process costs less than a timer per invocation: arming a
// timer adds it to the runtime's timer heap, which wakes an idle thread to
// poll for it, on every invocation.
func (proc *process) watchTimeouts(interval time.Duration) {
	proc.wg.Go(func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-proc.streamsCtx.Done():
				return
			case <-tick.C:
			}
			now := int64(proc.clock())
			proc.poolMu.Lock()
			for cs := range proc.open {
				if d := cs.deadline.Load(); d != 0 && d <= now && cs.deadline.CompareAndSwap(d, 0) {
					cs.timedOut.Store(true)
					cs.cancel()
				}
			}
			proc.poolMu.Unlock()
		}
	})
}

// acquire returns an idle stream of the pool, or a new one.
func (proc *process) acquire() (*callStream, error) {
	proc.poolMu.Lock()
	if n := len(proc.idle); n > 0 {
		cs := proc.idle[n-1]
		proc.idle[n-1] = nil
		proc.idle = proc.idle[:n-1]
		proc.poolMu.Unlock()
		return cs, nil
	}
	proc.poolMu.Unlock()
	return proc.openCall()
}

// release puts an idle stream back into the pool.
func (proc *process) release(cs *callStream) {
	proc.poolMu.Lock()
	proc.idle = append(proc.idle, cs)
	proc.poolMu.Unlock()
}

// abandon cancels the stream, which is not used again.
func (cs *callStream) abandon() {
	cs.stopTimeout()
	cs.cancel()
	cs.proc.poolMu.Lock()
	delete(cs.proc.open, cs)
	cs.proc.poolMu.Unlock()
}

// watchLiveness keeps one Call stream open without invocations: it fails
// only when the connection or the process ends, which it reports at once,
// as long before an invocation would notice.
func (proc *process) watchLiveness() error {
	cs, err := proc.openCall()
	if err != nil {
		return err
	}
	proc.wg.Go(func() {
		_, err := cs.rpc.Recv()
		cs.abandon()
		proc.fail(fmt.Errorf("plugin connection ended: %w", err))
	})
	return nil
}

// sendRelease tells the plugin, on an idle stream, that the host's next
// of a before-only call that held its context returned.
func (proc *process) sendRelease(call uint64) {
	cs, err := proc.acquire()
	if err != nil {
		return // the process is gone, and the context with it
	}
	cs.out = pluginproto.HostFrame{Call: call, Kind: &pluginproto.HostFrame_Release{Release: &pluginproto.Release{}}}
	if err := cs.rpc.Send(&cs.out); err != nil {
		cs.abandon()
		return
	}
	proc.release(cs)
}
