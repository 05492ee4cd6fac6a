package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/pluginproto"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// instance is one bus's middleware inside the plugin process.
type instance struct {
	p                 *Plugin
	id                uint32
	info              bus.PluginInfo
	name              string
	hasStart, hasStop bool
	started, released bool
}

func (inst *instance) request() *pluginproto.InstantiateRequest {
	return &pluginproto.InstantiateRequest{Instance: inst.id, Config: inst.p.cfg.pluginConfig,
		BusName: inst.info.Name, Endpoint: inst.info.Endpoint, Handles: inst.info.Handles}
}

// Instantiate makes the middleware of one bus: the plugin instantiates its
// own middleware in its process, and the returned middleware forwards the
// stages it implements (and only those) to it. Instantiate starts the
// process again if the last bus using it stopped.
func (p *Plugin) Instantiate(info bus.PluginInfo) (bus.Middleware, error) {
	if p.cfg.logger == nil && info.Logger != nil {
		p.setLogScope("", info.Logger)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	proc, err := p.ensure()
	if err != nil {
		return bus.Middleware{}, err
	}
	if proc == nil {
		return bus.Middleware{}, &UnavailableError{Plugin: p.Name(), Err: errors.New("the plugin is restarting; try again")}
	}
	p.lastInstanceID++
	inst := &instance{p: p, id: p.lastInstanceID, info: info}
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.startTimeout)
	defer cancel()
	resp, err := proc.rpc.Instantiate(ctx, inst.request())
	if err != nil {
		if len(p.instances) == 0 {
			p.idle()
		}
		return bus.Middleware{}, fmt.Errorf("plugin %q: instantiating for bus %q: %w", p.Name(), info.Name, err)
	}
	inst.name, inst.hasStart, inst.hasStop = resp.Name, resp.HasStart, resp.HasStop
	p.instances[inst.id] = inst
	// Unique crosses, so that the bus refuses the plugin twice as it does
	// an in-process one; TxSource does not (see docs/plugins/authoring.md).
	m := bus.Middleware{Name: resp.Name, Unique: resp.Unique, Start: inst.start, Stop: inst.stop}
	for _, s := range resp.Stages {
		switch pluginproto.BusStage(s.Stage) {
		case bus.StageIncoming:
			m.Incoming = inst.incoming
		case bus.StageHandler:
			m.Handling = inst.handling
		case bus.StageOutgoing:
			m.Outgoing = inst.outgoing
		}
	}
	return m, nil
}

// idle stops the process when no bus uses it. During a restart, the
// watcher stops the process it starts instead of installing it. p.mu is
// held.
func (p *Plugin) idle() {
	proc := p.proc
	if proc == nil {
		return
	}
	p.proc = nil
	p.live.Store(nil)
	if p.restarting {
		return // the watcher stops the dead process and the new one
	}
	proc.stop()
	p.log.Info("plugin process stopped: no bus uses it", slog.Int("pid", proc.pid))
}

func (inst *instance) lifecycle(ctx context.Context, op pluginproto.LifecycleRequest_Op) error {
	proc := inst.p.live.Load()
	if proc == nil {
		return &UnavailableError{Plugin: inst.p.Name(), Err: errors.New("the plugin process is down")}
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, inst.p.cfg.startTimeout)
		defer cancel()
	}
	r, err := proc.rpc.Lifecycle(ctx, &pluginproto.LifecycleRequest{Instance: inst.id, Op: op, DeadlineUnixNano: pluginproto.Deadline(ctx)})
	if err != nil {
		return &UnavailableError{Plugin: inst.p.Name(), Err: err}
	}
	if r.Error != nil {
		err := &Error{Plugin: inst.p.Name(), Message: r.Error.Message, Err: pluginproto.Sentinel(r.Error.Code)}
		if r.Error.Code == pluginproto.ErrorCode_ERROR_CODE_PANIC {
			err.Err = &bus.PanicError{Value: "in plugin " + inst.p.Name() + ": " + r.Error.Message}
		}
		return err
	}
	return nil
}

func (inst *instance) start(ctx context.Context) error {
	p := inst.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if inst.released {
		if err := inst.reacquire(); err != nil {
			return err
		}
	}
	if !inst.hasStart || p.live.Load() == nil {
		inst.started = true // a restart in progress runs the hook
		return nil
	}
	if err := inst.lifecycle(ctx, pluginproto.LifecycleRequest_OP_START); err != nil {
		// Not started: the bus runs no Stop hook for it, and a restart
		// must not run the hook that failed again.
		return err
	}
	inst.started = true
	return nil
}

// reacquire instantiates again, in a process started when the plugin is
// idle, an instance its Stop hook released: when a later middleware's
// Start hook fails, the bus runs the Stop hooks of those it started, and
// Start may be called again. p.mu is held.
func (inst *instance) reacquire() error {
	p := inst.p
	proc, err := p.ensure()
	if err != nil {
		return err
	}
	if proc == nil {
		return &UnavailableError{Plugin: p.Name(), Err: errors.New("the plugin is restarting; try again")}
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.startTimeout)
	defer cancel()
	if _, err := proc.rpc.Instantiate(ctx, inst.request()); err != nil {
		if len(p.instances) == 0 {
			p.idle()
		}
		return fmt.Errorf("plugin %q: instantiating for bus %q again: %w", p.Name(), inst.info.Name, err)
	}
	p.instances[inst.id] = inst
	inst.released = false
	return nil
}

// stop runs the plugin's Stop hook and releases the instance; the last
// instance released stops the process.
func (inst *instance) stop(ctx context.Context) error {
	p := inst.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if inst.released {
		return nil
	}
	inst.released = true
	var err error
	if inst.started && inst.hasStop && p.live.Load() != nil {
		err = inst.lifecycle(ctx, pluginproto.LifecycleRequest_OP_STOP)
	}
	delete(p.instances, inst.id)
	if len(p.instances) == 0 {
		p.idle()
	} else if p.live.Load() != nil {
		_ = inst.lifecycle(ctx, pluginproto.LifecycleRequest_OP_RELEASE)
	}
	return err
}

func (inst *instance) incoming(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
	return inst.invoke(ctx, bus.StageIncoming, in, nil, nil, next)
}

func (inst *instance) handling(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
	body, err := json.Marshal(h.Message())
	if err != nil {
		return fmt.Errorf("plugin %q: encoding %s for the plugin: %w", inst.p.Name(), h.MessageName(), err)
	}
	m := &pluginproto.HandlingMessage{Handler: h.HandlerName(), MessageName: h.MessageName(), Body: body,
		Attributes: pluginproto.FromAttributes(h.Attributes()), Attempt: int32(h.Attempt())}
	for k, v := range h.Headers() {
		if m.Headers == nil {
			m.Headers = make(map[string]string)
		}
		m.Headers[k] = v
	}
	return inst.invoke(ctx, bus.StageHandler, nil, &pluginproto.Invoke{Subject: &pluginproto.Invoke_Handling{Handling: m}}, nil, next)
}

func (inst *instance) outgoing(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
	body, err := json.Marshal(out.Message())
	if err != nil {
		return fmt.Errorf("plugin %q: encoding %s for the plugin: %w", inst.p.Name(), out.Name(), err)
	}
	m := &pluginproto.OutgoingMessage{Kind: int32(out.Kind()), Name: out.Name(), Body: body, Destination: out.Destination(),
		Attributes: pluginproto.FromAttributes(out.Attributes()), InHandler: out.InHandler()}
	if due := out.Due(); !due.IsZero() {
		m.DueUnixNano = due.UnixNano()
	}
	if h := out.Headers(); len(h) > 0 {
		m.Headers = maps.Clone(h)
	}
	return inst.invoke(ctx, bus.StageOutgoing, nil, &pluginproto.Invoke{Subject: &pluginproto.Invoke_Outgoing{Outgoing: m}}, out, next)
}

// invoke runs one stage invocation in the plugin, on a stream of its own:
// an incoming one for in, else inv. When the plugin calls next, the host
// runs the rest of the chain here, on the caller's goroutine, and sends
// back the outcome.
func (inst *instance) invoke(ctx context.Context, stage bus.Stage, in *bus.Incoming, inv *pluginproto.Invoke, out *bus.Outgoing, next bus.Next) error {
	p := inst.p
	p.invocations.Add(1)
	proc := p.live.Load()
	if proc == nil {
		return p.down(ctx, stage, next, false, nil, errors.New("the plugin process is down"))
	}
	var parent uint64
	if held, ok := ctx.Value(heldKey{inst}).(uint64); ok {
		parent = held
	}
	n := proc.inflight.Add(1)
	defer proc.inflight.Add(-1)
	if ss := proc.session; ss != nil && n >= p.cfg.sessionFrom {
		return inst.invokeSession(ctx, proc, ss, stage, in, inv, out, parent, next)
	}
	cs, stopWatch, err := proc.acquireFor(ctx)
	if err != nil {
		return p.down(ctx, stage, next, false, nil, err)
	}
	id := p.lastCallID.Add(1)
	cs.startTimeout(p.cfg.callTimeout)
	if in != nil {
		// Encoded from in, with no message built (pluginproto.Codec).
		f := &cs.incoming
		f.Call, f.Parent, f.Instance, f.Deadline, f.In = id, parent, inst.id, pluginproto.Deadline(ctx), in
		err = cs.rpc.SendMsg(f)
		cs.incoming.In = nil
	} else {
		inv.Instance, inv.Stage, inv.DeadlineUnixNano, inv.Parent = inst.id, pluginproto.StageOf(stage), pluginproto.Deadline(ctx), parent
		cs.invoke.Invoke = inv
		cs.out = pluginproto.HostFrame{Call: id, Kind: &cs.invoke}
		err = cs.rpc.Send(&cs.out)
		cs.invoke.Invoke = nil
	}
	if err != nil && err != io.EOF && status.Code(err) == codes.Internal {
		// The frame could not be encoded (gRPC reports the transport's
		// errors as io.EOF, and its codec's as codes.Internal). gRPC
		// ended this stream alone; the process is fine.
		cs.abandon()
		if stopWatch != nil {
			stopWatch()
		}
		return p.notEncodable(stage, err)
	}
	var (
		nextCalled bool
		nextErr    error
	)
	for err == nil {
		if err = cs.rpc.RecvMsg(&cs.in); err != nil {
			break
		}
		if cs.in.Call != id {
			// A frame of an earlier invocation on this stream, sent after
			// its Done: taken for this one's, a Next would run this
			// invocation's rest of the chain without its middleware
			// calling next.
			err = fmt.Errorf("plugin protocol violation: a frame for call %d on the stream of call %d", cs.in.Call, id)
			break
		}
		switch k := cs.in.Kind.(type) {
		case *pluginproto.PluginFrame_Next:
			if nextCalled { // the protocol allows one Next per call
				if stopWatch != nil {
					stopWatch()
				}
				cs.abandon()
				proc.fail(fmt.Errorf("plugin protocol violation: a second Next frame for call %d", id))
				return p.down(ctx, stage, next, nextCalled, nextErr, proc.cause)
			}
			apply(out, k.Next.Mutation)
			nextCalled = true
			cs.stopTimeout() // the time the host spends in next does not count
			nctx := ctx
			if k.Next.HoldsContext {
				nctx = context.WithValue(ctx, heldKey{inst}, id)
			}
			nextErr = callNext(nctx, cs, k.Next.DeadlineUnixNano, next)
			cs.startTimeout(p.cfg.callTimeout)
			cs.nextResult = pluginproto.NextResult{Error: pluginproto.EncodeError(nextErr)}
			cs.nextResultKind.NextResult = &cs.nextResult
			cs.out = pluginproto.HostFrame{Call: id, Kind: &cs.nextResultKind}
			err = cs.rpc.Send(&cs.out)
		case *pluginproto.PluginFrame_Done:
			// Copied out: the stream's next frame, once it is back in the
			// pool, is decoded into the same Done (pluginproto.Codec).
			d := doneOf(k.Done)
			reusable := cs.stopTimeout()
			if stopWatch != nil && !stopWatch() {
				reusable = false
			}
			if reusable && !cs.watchFired.Load() {
				proc.release(cs)
			} else {
				cs.abandon() // cancelled meanwhile: the plugin may have seen it
			}
			return inst.done(ctx, proc, stage, id, out, d, nextErr, next)
		default:
			err = fmt.Errorf("plugin protocol violation: an empty frame for call %d", id)
		}
	}
	cs.abandon()
	if stopWatch != nil {
		stopWatch()
	}
	switch {
	case ctx.Err() != nil:
		releaseAbandoned(proc, id, nextCalled)
		return &Error{Plugin: p.Name(), Stage: stage, Message: ctx.Err().Error(), Err: ctx.Err()}
	case cs.timedOut.Load():
		releaseAbandoned(proc, id, nextCalled)
		p.timeouts.Add(1)
		go proc.checkHung()
		return p.down(ctx, stage, next, nextCalled, nextErr, &TimeoutError{Plugin: p.Name(), Stage: stage, Timeout: p.cfg.callTimeout})
	}
	proc.fail(err)
	return p.down(ctx, stage, next, nextCalled, nextErr, proc.cause)
}

// invokeSession runs one stage invocation over the process's batching
// session: as invoke does on a stream of its own, except that the call
// waits for its frames from the session's reader, and that it tells the
// plugin to cancel it with a Cancel frame.
func (inst *instance) invokeSession(ctx context.Context, proc *process, ss *session, stage bus.Stage, in *bus.Incoming, inv *pluginproto.Invoke, out *bus.Outgoing, parent uint64, next bus.Next) error {
	p := inst.p
	id := p.lastCallID.Add(1)
	c := ss.begin(id)
	c.startTimeout(proc, p.cfg.callTimeout)
	var err error
	if in != nil {
		f := &c.incoming
		f.Call, f.Parent, f.Instance, f.Deadline, f.In = id, parent, inst.id, pluginproto.Deadline(ctx), in
		err = ss.send(f)
		f.In = nil
	} else {
		inv.Instance, inv.Stage, inv.DeadlineUnixNano, inv.Parent = inst.id, pluginproto.StageOf(stage), pluginproto.Deadline(ctx), parent
		c.invoke.Invoke = inv
		c.frame = pluginproto.HostFrame{Call: id, Kind: &c.invoke}
		err = ss.send(&c.frame)
		c.invoke.Invoke = nil
	}
	if ue, ok := err.(*pluginproto.UnencodableError); ok { // nothing was sent
		ss.finish(c)
		return p.notEncodable(stage, ue.Err)
	}
	var (
		nextCalled bool
		nextErr    error
		timedOut   bool
	)
	for err == nil {
		var f *pluginproto.PluginFrame
		select {
		case f = <-c.answers:
		case <-c.expired:
		case <-ctx.Done():
			ss.abandon(c)
			releaseAbandoned(proc, id, nextCalled)
			return &Error{Plugin: p.Name(), Stage: stage, Message: ctx.Err().Error(), Err: ctx.Err()}
		case <-ss.dead:
			err = ss.err
			continue
		}
		if f == nil {
			timedOut = true
			break
		}
		switch k := f.Kind.(type) {
		case *pluginproto.PluginFrame_Next:
			if nextCalled { // the protocol allows one Next per call
				ss.abandon(c)
				proc.fail(fmt.Errorf("plugin protocol violation: a second Next frame for call %d", id))
				return p.down(ctx, stage, next, nextCalled, nextErr, proc.cause)
			}
			mutation, holds, deadline := k.Next.Mutation, k.Next.HoldsContext, k.Next.DeadlineUnixNano
			ss.freeFrames.Put(f)
			apply(out, mutation)
			nextCalled = true
			c.stopTimeout() // the time the host spends in next does not count
			nctx := ctx
			if holds {
				nctx = context.WithValue(ctx, heldKey{inst}, id)
			}
			nextErr = nextInSession(nctx, ss, c, deadline, next)
			c.startTimeout(proc, p.cfg.callTimeout)
			c.nextResult = pluginproto.NextResult{Error: pluginproto.EncodeError(nextErr)}
			c.nextResultKind.NextResult = &c.nextResult
			c.frame = pluginproto.HostFrame{Call: id, Kind: &c.nextResultKind}
			err = ss.send(&c.frame)
		case *pluginproto.PluginFrame_Done:
			d := doneOf(k.Done)
			ss.freeFrames.Put(f) // decoded into again
			ss.finish(c)
			return inst.done(ctx, proc, stage, id, out, d, nextErr, next)
		default:
			err = fmt.Errorf("plugin protocol violation: an empty frame for call %d", id)
		}
	}
	ss.abandon(c)
	switch { // in the order invoke checks them
	case ctx.Err() != nil:
		releaseAbandoned(proc, id, nextCalled)
		return &Error{Plugin: p.Name(), Stage: stage, Message: ctx.Err().Error(), Err: ctx.Err()}
	case timedOut:
		releaseAbandoned(proc, id, nextCalled)
		p.timeouts.Add(1)
		go proc.checkHung()
		return p.down(ctx, stage, next, nextCalled, nextErr, &TimeoutError{Plugin: p.Name(), Stage: stage, Timeout: p.cfg.callTimeout})
	}
	proc.fail(err)
	return p.down(ctx, stage, next, nextCalled, nextErr, proc.cause)
}

// releaseAbandoned tells the plugin to drop what it may keep of call id,
// which the host gave up (cancelled, or timed out) before the plugin's
// answer: a before-only middleware that gave next a context of its own
// when the host no longer listened would have it kept, waiting for a
// Release that the host sends only after running next (nextHolding).
// The plugin also drops it when it sees the call cancelled; this covers
// an answer sent before the cancellation reached it. A call that sent
// Next keeps nothing past its end.
func releaseAbandoned(proc *process, id uint64, nextCalled bool) {
	if !nextCalled {
		proc.sendRelease(id) // nothing when the process is gone
	}
}

// nextInSession runs the rest of the chain for a session's call. When the
// rest panics (the bus recovers it above this layer), it cancels the call:
// the plugin's next, waiting for an answer, returns context.Canceled.
func nextInSession(ctx context.Context, ss *session, c *sessionCall, deadline int64, next bus.Next) error {
	returned := false
	defer func() {
		if !returned {
			ss.abandon(c)
		}
	}()
	err := nextWithin(ctx, deadline, next)
	returned = true
	return err
}

// doneFrame is what the host needs of a Done frame, copied out: the frame
// is decoded into again.
type doneFrame struct {
	Continue, HoldsContext bool
	Deadline               int64 // of the context the middleware gave next, 0: none
	Mutation               *pluginproto.Mutation
	Error                  *pluginproto.Error
}

func doneOf(d *pluginproto.Done) doneFrame {
	return doneFrame{d.Continue, d.HoldsContext, d.DeadlineUnixNano, d.Mutation, d.Error}
}

// done completes call id of the plugin's Done: it runs the rest of the
// chain when the middleware continued, else returns its error.
func (inst *instance) done(ctx context.Context, proc *process, stage bus.Stage, id uint64, out *bus.Outgoing, d doneFrame, nextErr error, next bus.Next) error {
	if proc.consecutiveTimeouts.Load() != 0 { // a store per invocation would bounce the line between cores
		proc.consecutiveTimeouts.Store(0)
	}
	if d.Continue {
		apply(out, d.Mutation)
		if d.HoldsContext {
			return inst.nextHolding(ctx, proc, id, d.Deadline, next)
		}
		return nextWithin(ctx, d.Deadline, next)
	}
	return inst.decodeError(stage, d.Error, nextErr)
}

// heldKey is the host context key under which the id of the instance's
// call whose context the plugin holds travels down the chain: the
// instance's invocations made meanwhile name it as their parent, and the
// plugin gives them that context's values.
type heldKey struct{ inst *instance }

// nextHolding runs the rest of the chain after a before-only call whose
// context the plugin holds, then tells the plugin to drop it.
func (inst *instance) nextHolding(ctx context.Context, proc *process, call uint64, deadline int64, next bus.Next) error {
	defer proc.sendRelease(call)
	return nextWithin(context.WithValue(ctx, heldKey{inst}, call), deadline, next)
}

// callNext runs the rest of the chain for the call on cs. When the rest
// panics (the bus recovers it above this layer), it cancels the stream:
// the plugin's next, waiting for an answer, returns context.Canceled.
func callNext(ctx context.Context, cs *callStream, deadline int64, next bus.Next) error {
	returned := false
	defer func() {
		if !returned {
			cs.abandon()
		}
	}()
	err := nextWithin(ctx, deadline, next)
	returned = true
	return err
}

// nextWithin runs the rest of the chain under the deadline of the context
// the plugin's middleware gave next (0: ctx's own), as in process: an
// earlier one shortens ctx's; a later one, or none
// (pluginproto.NoDeadline) where ctx has one, means that the middleware
// detached the rest from its context (context.WithoutCancel, the only way
// to lengthen or drop a deadline), and the rest runs detached from ctx's
// deadline and cancellation too, with ctx's values.
func nextWithin(ctx context.Context, deadline int64, next bus.Next) error {
	if deadline == 0 {
		return next.Call(ctx)
	}
	cur, ok := ctx.Deadline()
	switch {
	case !ok && deadline == pluginproto.NoDeadline, ok && deadline == cur.UnixNano():
		return next.Call(ctx)
	case ok && deadline > cur.UnixNano():
		ctx = context.WithoutCancel(ctx)
		if deadline == pluginproto.NoDeadline {
			return next.Call(ctx)
		}
	}
	nctx, cancel := context.WithDeadline(ctx, time.Unix(0, deadline))
	defer cancel()
	return next.Call(nctx)
}

// down applies the failure policy to an invocation the plugin could not
// complete.
func (p *Plugin) down(ctx context.Context, stage bus.Stage, next bus.Next, nextCalled bool, nextErr, cause error) error {
	if p.cfg.policy == FailOpen {
		n := p.skipped.Add(1)
		now := time.Now().UnixNano()
		if last := p.lastSkipLog.Load(); now-last > int64(time.Second) && p.lastSkipLog.CompareAndSwap(last, now) {
			p.log.Warn("plugin skipped (fail-open)", slog.String("stage", stage.String()), slog.Any("error", cause), slog.Uint64("skipped_total", n))
		}
		if nextCalled {
			return nextErr
		}
		return next.Call(ctx)
	}
	p.unavailable.Add(1)
	// An outgoing message its next handed on was sent: saying otherwise
	// would have the caller send it twice.
	handedOn := stage == bus.StageOutgoing && nextCalled && nextErr == nil
	var te *TimeoutError
	if errors.As(cause, &te) {
		if handedOn {
			c := *te
			c.HandedOn = true
			return &c
		}
		return te
	}
	return &UnavailableError{Plugin: p.Name(), Stage: stage, Err: cause, HandedOn: handedOn}
}

// decodeError rebuilds the error the plugin returned: next's own error
// when it returned that, else an *Error, marked with bus.Permanent when
// the plugin's error was permanent and what it wraps is not already.
func (inst *instance) decodeError(stage bus.Stage, e *pluginproto.Error, nextErr error) error {
	if e == nil {
		return nil
	}
	if e.IsNextError && nextErr != nil {
		return nextErr
	}
	err := inst.pluginError(stage, e, nextErr)
	if e.Permanent && !errors.Is(err, bus.ErrPermanent) {
		return bus.Permanent(err)
	}
	return err
}

// pluginError is the *Error the plugin returned, with its typed cause.
func (inst *instance) pluginError(stage bus.Stage, e *pluginproto.Error, nextErr error) error {
	err := &Error{Plugin: inst.p.Name(), Stage: stage, Message: e.Message, Codes: e.Codes}
	switch {
	case e.WrapsNextError && nextErr != nil:
		err.Err = nextErr
	case e.Code == pluginproto.ErrorCode_ERROR_CODE_NEXT_CALLED_TWICE:
		err.Err = pluginproto.NextCalledTwice(e)
	case e.Code == pluginproto.ErrorCode_ERROR_CODE_PANIC:
		err.Err = &bus.PanicError{Value: "in plugin " + inst.p.Name() + ": " + e.Message}
	default:
		err.Err = pluginproto.Sentinel(e.Code)
	}
	return err
}

// apply makes an outgoing middleware's changes on the host's message.
func apply(out *bus.Outgoing, m *pluginproto.Mutation) {
	if out == nil || m == nil {
		return
	}
	if m.CorrelationIdChanged {
		out.SetCorrelationID(m.CorrelationId)
	}
	if m.ValuesChanged {
		cur := out.Attributes()
		for k := range cur.Values() {
			if _, ok := m.Values[k]; !ok {
				out.DeleteValue(k)
			}
		}
		for k, v := range m.Values {
			if cv, ok := cur.Value(k); !ok || cv != v {
				out.SetValue(k, v)
			}
		}
	}
	for k, v := range m.Sticky {
		out.SetSticky(k, v)
	}
	if m.HeadersChanged {
		h := out.Headers()
		clear(h)
		maps.Copy(h, m.Headers)
	}
	if m.DueChanged {
		out.SetDue(pluginproto.ToDue(m.DueUnixNano))
	}
}
