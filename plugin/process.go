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
	newCall func(ctx context.Context) (pluginproto.Plugin_CallClient, error)
	poolMu  sync.Mutex
	idle    []*callStream            // the pool's idle streams, the last used last
	open    map[*callStream]struct{} // every stream not abandoned, for watchTimeouts
	// session carries the invocations made while others are in flight
	// (nil in the tests' fake processes); inflight counts the
	// invocations running.
	session  *session
	inflight atomic.Int32

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
			return rpc.Call(ctx, pluginproto.StreamOptions()...)
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
		proc.poolMu.Lock()
		proc.stopping.Store(true) // under poolMu: release abandons from now on
		idle := proc.idle
		proc.idle = nil
		proc.poolMu.Unlock()
		for _, cs := range idle {
			cs.abandon() // ends its standing watch's goroutine
		}
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
		if proc.client != nil { // nil in the tests' fake processes
			proc.client.Kill()
		}
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

	// A standing watch: while invocations come with the same Done channel
	// (the bus's handler context's, in a running bus), one watch of it
	// cancels the stream for all of them, instead of a context.AfterFunc
	// registered and stopped on every invocation. It waits on the channel
	// alone, so that it keeps no invocation's context (nor its values).
	// Owned by the goroutine that holds the stream, and by stop for an
	// idle one.
	lastDone   <-chan struct{} // the previous invocation's ctx.Done()
	watched    <-chan struct{} // the standing watch's channel; nil: none
	unwatch    func() bool     // stops the standing watch
	watchFired atomic.Bool     // the watched channel closed: the stream is cancelled

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
			if proc.session != nil {
				proc.session.timeOut(now)
			}
		}
	})
}

// acquire returns an idle stream of the pool, or a new one. An idle
// stream whose standing watch fired (its context ended while it waited in
// the pool) is cancelled and not returned.
func (proc *process) acquire() (*callStream, error) {
	for {
		proc.poolMu.Lock()
		n := len(proc.idle)
		if n == 0 {
			proc.poolMu.Unlock()
			return proc.openCall()
		}
		cs := proc.idle[n-1]
		proc.idle[n-1] = nil
		proc.idle = proc.idle[:n-1]
		proc.poolMu.Unlock()
		if !cs.watchFired.Load() {
			return cs, nil
		}
		cs.abandon()
	}
}

// acquireFor returns a stream that ctx's end cancels, and the function
// that stops the watch of this invocation alone (nil when none was
// registered for it).
func (proc *process) acquireFor(ctx context.Context) (*callStream, func() bool, error) {
	for {
		cs, err := proc.acquire()
		if err != nil {
			return nil, nil, err
		}
		if stop, ok := cs.watch(ctx); ok {
			return cs, stop, nil
		}
		cs.abandon() // its standing watch fired meanwhile
	}
}

// watch makes ctx's end cancel the stream for the invocation about to
// run. With the Done channel of the stream's standing watch nothing is
// registered. With another channel the standing watch ends (ok is false
// when it already fired: the stream is cancelled), and the invocation
// registers a context.AfterFunc of its own, whose stop function watch
// returns; the second invocation in a row with one channel starts a
// standing watch of it instead. (Invocations that alternate between two
// channels, A A B A A B, start and end a watch every third invocation:
// its goroutine then costs more than the registrations it saves.)
func (cs *callStream) watch(ctx context.Context) (stop func() bool, ok bool) {
	done := ctx.Done()
	if cs.watched != nil {
		if done == cs.watched {
			return nil, true
		}
		if !cs.endWatch() {
			return nil, false
		}
	}
	switch {
	case done == nil:
		cs.lastDone = nil
		return nil, true
	case done == cs.lastDone:
		// One goroutine waits on the channel (the context package's, for
		// a context that is not its own) until it closes or unwatch.
		cs.watched, cs.unwatch = done, context.AfterFunc(doneOnly(done), cs.watchedDone)
		return nil, true
	}
	cs.lastDone = done
	return context.AfterFunc(ctx, cs.cancel), true
}

// endWatch ends the standing watch, if any; it reports false when the
// watch had fired (the stream is cancelled).
func (cs *callStream) endWatch() bool {
	if cs.unwatch == nil {
		return true
	}
	stopped := cs.unwatch()
	cs.watched, cs.unwatch = nil, nil
	return stopped
}

// watchedDone runs when the standing watch's channel closes.
func (cs *callStream) watchedDone() {
	cs.watchFired.Store(true)
	cs.cancel()
}

// doneOnly is a context that ends when its channel closes and carries
// nothing else.
type doneOnly <-chan struct{}

func (doneOnly) Deadline() (time.Time, bool) { return time.Time{}, false }
func (d doneOnly) Done() <-chan struct{}     { return d }
func (doneOnly) Value(any) any               { return nil }
func (d doneOnly) Err() error {
	select {
	case <-d:
		return context.Canceled
	default:
		return nil
	}
}

// release puts an idle stream back into the pool; during stop, whose
// sweep of the idle streams it may come after, it abandons it instead.
func (proc *process) release(cs *callStream) {
	proc.poolMu.Lock()
	if !proc.stopping.Load() {
		proc.idle = append(proc.idle, cs)
		proc.poolMu.Unlock()
		return
	}
	proc.poolMu.Unlock()
	cs.abandon()
}

// abandon cancels the stream, which is not used again, and ends its
// standing watch.
func (cs *callStream) abandon() {
	cs.stopTimeout()
	cs.cancel()
	cs.endWatch()
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
	// With no Done channel: a standing watch of another invocation's
	// channel ends first, so that its end cannot cancel the stream while
	// it carries the Release (which the plugin would then never see).
	cs, _, err := proc.acquireFor(context.Background())
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
