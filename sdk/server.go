package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/pluginproto"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// newGRPCServer is the plugin's gRPC server: pluginproto's, with the
// codec of the Call and Invoke streams, which decodes the frames every message makes by
// hand (the other services' messages decode as with gRPC's own codec).
func newGRPCServer(opts []grpc.ServerOption) *grpc.Server {
	return pluginproto.NewGRPCServer(append(opts[:len(opts):len(opts)], grpc.ForceServerCodecV2(pluginproto.Codec{})))
}

// server is the plugin side of the wire protocol.
type server struct {
	pluginproto.UnimplementedPluginServer
	p          bus.Plugin
	beforeOnly [4]bool // the stages p declared before-only
	declared   []error // the sentinel errors p declared (ErrorDeclarer)
	version    string
	logger     *slog.Logger

	// held maps the id of a call whose middleware gave next a context of
	// its own to that context, while the host's next runs: invocations
	// made meanwhile (sends while handling) take their values from it.
	held sync.Map // uint64 → context.Context

	mu sync.Mutex // serialises Configure+Instantiate and changes of instances
	// instances is replaced whole under mu, so that every invocation reads
	// it without a lock.
	instances atomic.Pointer[map[uint32]*instance]
}

type instance struct {
	mw     bus.Middleware
	logger *slog.Logger
	stages *bus.StageMaker // the instance's stage contexts share their name and scoped loggers
}

func newServer(p bus.Plugin, version string, logger *slog.Logger) *server {
	s := &server{p: p, beforeOnly: beforeOnlyStages(p), declared: declaredErrors(p), version: version, logger: logger}
	s.instances.Store(&map[uint32]*instance{})
	return s
}

func (s *server) instantiate(config []byte, info bus.PluginInfo) (bus.Middleware, error) {
	if len(config) > 0 {
		if c, ok := s.p.(Configurer); ok {
			if err := c.Configure(json.RawMessage(config)); err != nil {
				return bus.Middleware{}, fmt.Errorf("configuring plugin: %w", err)
			}
		}
	}
	m, err := s.p.Instantiate(info)
	if err != nil {
		return bus.Middleware{}, fmt.Errorf("instantiating plugin: %w", err)
	}
	if m.Name == "" {
		return bus.Middleware{}, errors.New("the plugin returned a middleware without a name; set bus.Middleware.Name")
	}
	return m, nil
}

// Describe instantiates a throwaway middleware to report name and stages.
func (s *server) Describe(_ context.Context, req *pluginproto.DescribeRequest) (*pluginproto.DescribeResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, err := s.instantiate(req.Config, bus.PluginInfo{Logger: s.logger})
	if err != nil {
		return nil, err
	}
	sdkVersion := "(devel)"
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/plugbus/plugbus" {
				sdkVersion = d.Version
			}
		}
	}
	codes := make([]string, len(s.declared))
	for i, e := range s.declared {
		codes[i] = e.Error()
	}
	return &pluginproto.DescribeResponse{Name: m.Name, Version: s.version, Stages: implementedStages(m, s.beforeOnly), Sdk: sdkVersion, Errors: codes}, nil
}

// Instantiate makes one bus's middleware.
func (s *server) Instantiate(_ context.Context, req *pluginproto.InstantiateRequest) (*pluginproto.InstantiateResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	info := bus.PluginInfo{Name: req.BusName, Endpoint: req.Endpoint, Logger: s.logger, Handles: req.Handles}
	m, err := s.instantiate(req.Config, info)
	if err != nil {
		return nil, err
	}
	s.setInstance(req.Instance, &instance{mw: m, logger: s.logger,
		stages: bus.NewStageMaker(bus.StageInfo{Middleware: m.Name, Endpoint: req.Endpoint, Logger: s.logger})})
	return &pluginproto.InstantiateResponse{Name: m.Name, Stages: implementedStages(m, s.beforeOnly), HasStart: m.Start != nil, HasStop: m.Stop != nil, Unique: m.Unique}, nil
}

func (s *server) instance(id uint32) *instance { return (*s.instances.Load())[id] }

// setInstance adds, replaces or (nil) removes instance id. s.mu is held.
func (s *server) setInstance(id uint32, inst *instance) {
	m := maps.Clone(*s.instances.Load())
	if inst == nil {
		delete(m, id)
	} else {
		m[id] = inst
	}
	s.instances.Store(&m)
}

// Lifecycle runs Start or Stop, or forgets an instance.
func (s *server) Lifecycle(ctx context.Context, req *pluginproto.LifecycleRequest) (*pluginproto.LifecycleResponse, error) {
	inst := s.instance(req.Instance)
	if inst == nil {
		return nil, fmt.Errorf("unknown instance %d", req.Instance)
	}
	if req.DeadlineUnixNano != 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, time.Unix(0, req.DeadlineUnixNano))
		defer cancel()
	}
	var err error
	switch req.Op {
	case pluginproto.LifecycleRequest_OP_START:
		if inst.mw.Start != nil {
			err = inst.runHook(ctx, "start", inst.mw.Start)
		}
	case pluginproto.LifecycleRequest_OP_STOP:
		if inst.mw.Stop != nil {
			err = inst.runHook(ctx, "stop", inst.mw.Stop)
		}
	case pluginproto.LifecycleRequest_OP_RELEASE:
		s.mu.Lock()
		s.setInstance(req.Instance, nil)
		s.mu.Unlock()
	}
	return &pluginproto.LifecycleResponse{Error: pluginproto.EncodeError(err)}, nil
}

// runHook runs the middleware's Start or Stop hook. A panic is its error,
// as a stage's is: the host gets a *plugin.Error matching bus.ErrPanic,
// and the process, which serves other buses too, goes on.
func (inst *instance) runHook(ctx context.Context, hook string, f func(context.Context) error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			stack := debug.Stack()
			err = &bus.PanicError{Value: p, Stack: stack}
			inst.logger.Error("middleware panicked", slog.String("hook", hook), slog.String("middleware", inst.mw.Name), slog.Any("panic", p), slog.String("stack", string(stack)))
		}
	}()
	return f(ctx)
}

// session is one Invoke stream.
type session struct {
	server       *server
	stream       pluginproto.Plugin_InvokeServer
	ctx          context.Context
	toIdleWorker chan *stageCall
	cancel       context.CancelFunc

	// freeCalls and freeFrames are the stageCalls and the
	// invocation frames of the invocations that ended clean, reused.
	freeCalls  pluginproto.Reuse[stageCall]
	freeFrames pluginproto.Reuse[pluginproto.HostFrame]

	out *pluginproto.BatchSender

	mu    sync.Mutex // guards calls
	calls map[uint64]*stageCall
	wg    sync.WaitGroup
}

// Invoke serves one long-lived stream of multiplexed stage invocations.
func (s *server) Invoke(stream pluginproto.Plugin_InvokeServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	ss := &session{server: s, stream: stream, ctx: ctx, cancel: cancel, toIdleWorker: make(chan *stageCall), calls: make(map[uint64]*stageCall)}
	ss.out = pluginproto.NewBatchSender(stream, func(error) { cancel() })
	ss.wg.Go(func() { ss.out.Flush(ctx.Done()) })
	err := ss.readLoop()
	cancel()
	ss.mu.Lock()
	for _, c := range ss.calls {
		c.cancel()
	}
	ss.mu.Unlock()
	ss.wg.Wait()
	if err == nil {
		err = ss.out.Err()
	}
	return err
}

// send queues f for the host, encoded before send returns (see
// pluginproto.BatchSender). Its encoding cannot fail: a frame carrying
// strings of the middleware's making (changes, an error) was checked
// with encodable.
func (ss *session) send(f *pluginproto.PluginFrame) { _ = ss.out.Queue(f) }

func (ss *session) readLoop() error {
	b := &pluginproto.BatchInto[pluginproto.HostFrame]{Get: ss.freeFrames.Get}
	for {
		err := ss.stream.RecvMsg(b)
		if err != nil {
			if ss.ctx.Err() != nil {
				return nil
			}
			return err
		}
		for _, f := range b.Frames {
			switch k := f.Kind.(type) {
			case *pluginproto.HostFrame_Invoke:
				c := ss.newCall(f, k.Invoke)
				select { // hand to an idle worker, else start one
				case ss.toIdleWorker <- c:
				default:
					ss.wg.Go(func() { ss.worker(c) })
				}
			case *pluginproto.HostFrame_NextResult:
				if c := ss.call(f.Call); c != nil {
					select {
					case c.results <- k.NextResult.Error: // a message of its own, never decoded into again
					default:
					}
				}
				ss.freeFrames.Put(f)
			case *pluginproto.HostFrame_Cancel:
				if c := ss.call(f.Call); c != nil {
					c.cancel()
				}
				ss.freeFrames.Put(f)
			case *pluginproto.HostFrame_Release:
				ss.server.held.Delete(f.Call)
				ss.freeFrames.Put(f)
			}
		}
	}
}

// worker runs invocations. Workers live as long as the stream, so that
// their stacks, grown once, are reused; there are as many as invocations
// ever ran at once.
func (ss *session) worker(c *stageCall) {
	for {
		c.run(c.inv)
		select {
		case c = <-ss.toIdleWorker:
		case <-ss.ctx.Done():
			return
		}
	}
}

func (ss *session) call(id uint64) *stageCall {
	ss.mu.Lock()
	c := ss.calls[id]
	ss.mu.Unlock()
	return c
}

// newCall makes the invocation of frame f: a stageCall whose last
// invocation ended clean, or a new one.
func (ss *session) newCall(f *pluginproto.HostFrame, inv *pluginproto.Invoke) *stageCall {
	c := ss.freeCalls.Pop()
	if c == nil {
		c = &stageCall{server: ss.server, session: ss, results: make(chan *pluginproto.Error, 1), nextReturned: make(chan struct{}, 1)}
	}
	select { // a result sent as the call's last invocation ended (only this goroutine sends)
	case <-c.results:
	default:
	}
	c.reset(f.Call, inv)
	c.frame = f
	id := f.Call
	c.stop, c.cancel = context.WithCancel(ss.ctx)
	c.setContext(inv)
	ss.mu.Lock()
	ss.calls[id] = c
	ss.mu.Unlock()
	return c
}

// setContext makes the middleware's ctx from c.stop: the host's deadline,
// and the values of the parent invocation's context.
func (c *stageCall) setContext(inv *pluginproto.Invoke) {
	c.ctx = c.stop
	if inv.DeadlineUnixNano != 0 {
		c.ctx, c.cancelDeadline = context.WithDeadline(c.stop, time.Unix(0, inv.DeadlineUnixNano))
	}
	if inv.Parent != 0 {
		// A parent that ended meanwhile (a send from a goroutine that
		// outlived its handler) leaves no values to take.
		if held, ok := c.server.held.Load(inv.Parent); ok {
			c.ctx = &valuesFrom{Context: c.ctx, values: held.(context.Context)}
		}
	}
}

const (
	callRunning  int32 = iota
	callNext           // in next
	callNextDone       // next returned
	callReturned       // the middleware returned (next may still run: see run)
)

// stageCall is one stage invocation inside the plugin, of an Invoke
// session or on a Call stream of its own.
type stageCall struct {
	id      uint64
	server  *server
	session *session                      // nil on a Call stream
	stream  pluginproto.Plugin_CallServer // nil in a session
	frames  *streamFrames                 // the stream's; nil in a session
	frame   *pluginproto.HostFrame        // the invocation's frame, in a session
	// The Done frame of an invocation in a session, reused.
	sessionFrame   pluginproto.PluginFrame
	sessionKind    pluginproto.PluginFrame_Done
	sessionDone    pluginproto.Done
	inv            *pluginproto.Invoke
	ctx            context.Context         // the middleware's: stop, with the host's deadline
	stop           context.Context         // ends when the host cancels the call or the stream ends
	cancel         context.CancelFunc      // ends stop
	cancelDeadline context.CancelFunc      // releases ctx's timer; nil without a deadline
	results        chan *pluginproto.Error // the host's answers to next, in a session
	stage          bus.Stage
	mw             string

	state atomic.Int32
	// nextReturned gets a token when a next returns after the middleware
	// did (its state was callReturned then), for run, which waits for it.
	nextReturned chan struct{}
	// c.next as each stage's next, made once per stageCall.
	nextIncoming *bus.IncomingNext
	nextHandling *bus.HandlingNext
	nextOutgoing *bus.OutgoingNext
	nextsOf      *instance // the instance the nexts name in their errors
	beforeOnly   bool
	continued    bool
	nextCtx      context.Context // what the middleware gave next
	nextErr      error
	// changes are an outgoing before-only middleware's changes when it
	// called next: what the host applies before it runs the rest. Those
	// it makes after next are not sent, as in process.
	changes *pluginproto.Mutation

	out     *bus.Outgoing
	outBase *pluginproto.OutgoingMessage

	delivery bus.Delivery // the message of an incoming or handler invocation
	// The stage context the middleware was given, handed back to its
	// StageMaker when the invocation ended clean.
	inst     *instance
	incoming *bus.Incoming
	handling *bus.Handling
}

// reset readies a stageCall whose last invocation ended clean (on a
// Call stream, or in a session) for another.
func (c *stageCall) reset(id uint64, inv *pluginproto.Invoke) {
	c.id, c.inv, c.stage = id, inv, pluginproto.BusStage(inv.Stage)
	c.ctx, c.cancelDeadline, c.mw = nil, nil, ""
	c.state.Store(callRunning)
	c.beforeOnly, c.continued, c.nextCtx, c.nextErr, c.changes = false, false, nil, nil, nil
	c.out, c.outBase, c.inst, c.incoming, c.handling = nil, nil, nil, nil, nil
}

// run runs the invocation and sends its outcome. It reports whether the
// invocation ended clean: the middleware called next, its next returned
// nil before the middleware returned, it returned nil, and the plugin
// keeps no context of it. Nothing the middleware started can still use
// the call or its stage context then (next again is a misuse), which are
// reused.
func (c *stageCall) run(inv *pluginproto.Invoke) (clean bool) {
	defer func() {
		if c.cancelDeadline != nil {
			c.cancelDeadline()
		}
		c.cancel()
		if ss := c.session; ss != nil {
			ss.mu.Lock()
			delete(ss.calls, c.id)
			if clean { // nothing can use the call, its frame or its stage context any more
				ss.freeFrames.Put(c.frame)
				c.frame = nil
				ss.freeCalls.Put(c)
			}
			ss.mu.Unlock()
		}
	}()
	var done *pluginproto.Done
	switch {
	case c.frames != nil:
		done = &c.frames.done
		*done = pluginproto.Done{}
	case c.session != nil:
		done = &c.sessionDone
		*done = pluginproto.Done{}
	default:
		done = &pluginproto.Done{}
	}
	err := c.invoke(inv)
	state := c.state.Swap(callReturned)
	if state == callNext {
		// The middleware returned while its next ran on another goroutine
		// (a timeout that stopped waiting). That next finishes first, as
		// it would in process: its Next frame goes before the Done, and
		// it gets the host's answer, which comes before the host reads
		// the Done anyway. Else the two frames could reach the host in
		// either order (a Next after the Done would be taken by the
		// stream's next invocation), and on a Call stream the next's read
		// of the answer would run alongside the stream's own reads. Its
		// outcome (continued, nextCtx, nextErr) is read below.
		<-c.nextReturned
	}
	// A before-only call whose middleware gave next a context of its own
	// is not clean: the plugin keeps that context, which may hold the
	// stage context, until the host's next returned (Release).
	holds := c.continued && err == nil && c.nextCtx != c.ctx
	clean = state == callNextDone && err == nil && c.nextErr == nil && !holds
	if clean && c.inst != nil {
		if c.incoming != nil {
			c.inst.stages.ReleaseIncoming(c.incoming)
		} else if c.handling != nil {
			c.inst.stages.ReleaseHandling(c.handling)
		}
	}
	if c.continued && err == nil {
		done.Continue = true
		if c.nextCtx != c.ctx { // else the host's own deadline
			done.DeadlineUnixNano = c.nextDeadline(c.nextCtx)
		}
		done.Mutation = c.changes
		done.HoldsContext = holds
	} else if err != nil {
		done.Error = c.encodeError(err)
	}
	if done.Mutation != nil || done.Error != nil {
		if err := encodable(done); err != nil { // the host will not call next, nor Release
			*done = pluginproto.Done{Error: pluginproto.EncodeError(err)}
		}
	}
	if done.HoldsContext {
		// Kept until the host's Release, after its next returned — unless
		// the host gave the call up meanwhile: it will not run next, nor
		// send Release (or sent it already, on abandoning the call).
		c.server.held.Store(c.id, c.nextCtx)
		if c.stop.Err() != nil {
			c.server.held.Delete(c.id)
		}
	}
	if c.frames != nil { // sent before the stream's next invocation reuses them
		c.frames.kind.Done = done
		c.frames.frame = pluginproto.PluginFrame{Call: c.id, Kind: &c.frames.kind}
		c.send(&c.frames.frame)
		return clean
	}
	if c.session != nil { // encoded by send: reused by the call's next invocation
		c.sessionKind.Done = done
		c.sessionFrame = pluginproto.PluginFrame{Call: c.id, Kind: &c.sessionKind}
		c.send(&c.sessionFrame)
		return clean
	}
	c.send(&pluginproto.PluginFrame{Call: c.id, Kind: &pluginproto.PluginFrame_Done{Done: done}})
	return clean
}

// streamFrames are a Call stream's frames, reused by its invocations one
// after the other: the Next and Done frames (Send encodes them before
// returning), and
// the frames received, decoded into the previous ones' messages
// (pluginproto.Codec) once the invocation that read them ended.
type streamFrames struct {
	frame    pluginproto.PluginFrame
	kind     pluginproto.PluginFrame_Done
	done     pluginproto.Done
	nextKind pluginproto.PluginFrame_Next
	next     pluginproto.NextCall
	invoke   pluginproto.HostFrame // an invocation, or a Release
	answer   pluginproto.HostFrame // what the host answers to next
}

// send sends f to the host on the call's session or stream. A stream
// that fails is gone: the host sees the invocation fail.
func (c *stageCall) send(f *pluginproto.PluginFrame) {
	if c.session != nil {
		c.session.send(f)
		return
	}
	_ = c.stream.Send(f)
}

func (c *stageCall) invoke(inv *pluginproto.Invoke) (err error) {
	inst := c.server.instance(inv.Instance)
	if inst == nil {
		return fmt.Errorf("sdk: unknown middleware instance %d; the host must instantiate it first", inv.Instance)
	}
	c.mw = inst.mw.Name
	c.beforeOnly = c.server.beforeOnly[c.stage]
	defer func() {
		if p := recover(); p != nil {
			stack := debug.Stack()
			err = &bus.PanicError{Value: p, Stack: stack}
			inst.logger.Error("middleware panicked", slog.String("stage", c.stage.String()), slog.String("middleware", c.mw), slog.Any("panic", p), slog.String("stack", string(stack)))
		}
	}()
	switch s := inv.Subject.(type) {
	case *pluginproto.Invoke_Incoming:
		m := s.Incoming
		if inst.mw.Incoming == nil {
			return c.skip()
		}
		d := &c.delivery
		*d = bus.Delivery{Envelope: bus.Envelope{Name: m.Name, ContentType: m.ContentType, Body: m.Body,
			Attributes: pluginproto.ToAttributes(m.Attributes), Headers: m.Headers}, Attempt: int(m.Attempt)}
		c.inst, c.incoming = inst, inst.stages.Incoming(d, m.Endpoint)
		return inst.mw.Incoming(c.ctx, c.incoming, c.incomingNext(inst))
	case *pluginproto.Invoke_Handling:
		m := s.Handling
		if inst.mw.Handling == nil {
			return c.skip()
		}
		d := &c.delivery
		*d = bus.Delivery{Envelope: bus.Envelope{Name: m.MessageName, ContentType: "application/json", Body: m.Body,
			Attributes: pluginproto.ToAttributes(m.Attributes), Headers: m.Headers}, Attempt: int(m.Attempt)}
		c.inst, c.handling = inst, inst.stages.Handling(m.Handler, RawMessage{Name: m.MessageName, Body: m.Body}, d)
		return inst.mw.Handling(c.ctx, c.handling, c.handlingNext(inst))
	case *pluginproto.Invoke_Outgoing:
		m := s.Outgoing
		if inst.mw.Outgoing == nil {
			return c.skip()
		}
		c.outBase = m
		c.out = inst.stages.Outgoing(bus.OutgoingMessage{Kind: bus.Kind(m.Kind), Name: m.Name, Message: RawMessage{Name: m.Name, Body: m.Body},
			Destination: m.Destination, Attributes: pluginproto.ToAttributes(m.Attributes), Headers: m.Headers, InHandler: m.InHandler,
			Due: pluginproto.ToDue(m.DueUnixNano)})
		return inst.mw.Outgoing(c.ctx, c.out, c.outgoingNext(inst))
	}
	return fmt.Errorf("sdk: invocation without a subject (host speaks a newer protocol?)")
}

// skip answers a stage the instance lacks (a host should never ask) by
// continuing.
func (c *stageCall) skip() error {
	c.beforeOnly = true
	return c.next(c.ctx)
}

// incomingNext, handlingNext and outgoingNext are c.next as the
// middleware's next, made once per stageCall and instance and re-armed
// for each invocation; a second call's error names inst's middleware.
func (c *stageCall) incomingNext(inst *instance) *bus.IncomingNext {
	if c.nextsOf != inst {
		c.nextIncoming, c.nextHandling, c.nextOutgoing, c.nextsOf = nil, nil, nil, inst
	}
	if c.nextIncoming == nil {
		c.nextIncoming = inst.stages.IncomingNext(c.next)
	}
	c.nextIncoming.Reset()
	return c.nextIncoming
}

func (c *stageCall) handlingNext(inst *instance) *bus.HandlingNext {
	if c.nextsOf != inst {
		c.nextIncoming, c.nextHandling, c.nextOutgoing, c.nextsOf = nil, nil, nil, inst
	}
	if c.nextHandling == nil {
		c.nextHandling = inst.stages.HandlingNext(c.next)
	}
	c.nextHandling.Reset()
	return c.nextHandling
}

func (c *stageCall) outgoingNext(inst *instance) *bus.OutgoingNext {
	if c.nextsOf != inst {
		c.nextIncoming, c.nextHandling, c.nextOutgoing, c.nextsOf = nil, nil, nil, inst
	}
	if c.nextOutgoing == nil {
		c.nextOutgoing = inst.stages.OutgoingNext(c.next)
	}
	c.nextOutgoing.Reset()
	return c.nextOutgoing
}

// next crosses back to the host, which runs the rest of the chain.
func (c *stageCall) next(ctx context.Context) error {
	if !c.state.CompareAndSwap(callRunning, callNext) {
		return &bus.NextMisuseError{Stage: c.stage, Middleware: c.mw, AfterReturn: c.state.Load() == callReturned}
	}
	defer c.nextEnded()
	c.nextCtx = ctx
	if c.beforeOnly {
		c.continued = true
		if c.out != nil {
			c.changes = mutation(c.out, c.outBase)
		}
		return nil
	}
	var nc *pluginproto.NextCall
	if c.frames != nil {
		nc = &c.frames.next
		*nc = pluginproto.NextCall{}
	} else {
		nc = new(pluginproto.NextCall)
	}
	nc.DeadlineUnixNano = c.nextDeadline(ctx)
	if c.out != nil {
		nc.Mutation = mutation(c.out, c.outBase)
	}
	if nc.Mutation != nil {
		if err := encodable(nc); err != nil { // nothing is sent: the middleware decides
			return err
		}
	}
	if ctx != c.ctx {
		c.server.held.Store(c.id, ctx)
		defer c.server.held.Delete(c.id)
		nc.HoldsContext = true
	}
	if c.frames != nil { // sent on the call's stream: its frames are reused
		c.frames.nextKind.Next = nc
		c.frames.frame = pluginproto.PluginFrame{Call: c.id, Kind: &c.frames.nextKind}
		c.send(&c.frames.frame)
		return c.awaitOnStream()
	}
	c.send(&pluginproto.PluginFrame{Call: c.id, Kind: &pluginproto.PluginFrame_Next{Next: nc}})
	// As in process, next returns what the rest of the chain returned: the
	// host runs it under ctx's deadline and answers even when ctx (or the
	// call's own deadline) expires meanwhile. Only the call's end (the
	// host cancelled it, or the stream is gone) stops waiting: no answer
	// can come then.
	select {
	case e := <-c.results:
		c.nextErr = decodeHostError(e)
		return c.nextErr
	case <-c.stop.Done():
		return c.stop.Err()
	}
}

// nextDeadline encodes the deadline of ctx, which the middleware gave
// next, for the host: pluginproto.NoDeadline when ctx has none but the
// invocation's context has one (the middleware detached the rest of the
// chain from it, with context.WithoutCancel), so that the host runs the
// rest without one too.
func (c *stageCall) nextDeadline(ctx context.Context) int64 {
	d := pluginproto.Deadline(ctx)
	if d == 0 && pluginproto.Deadline(c.ctx) != 0 {
		return pluginproto.NoDeadline
	}
	return d
}

// nextEnded ends a next: it tells run, when the middleware returned
// meanwhile, that run can go on.
func (c *stageCall) nextEnded() {
	if !c.state.CompareAndSwap(callNext, callNextDone) { // run swapped in callReturned
		c.nextReturned <- struct{}{}
	}
}

// awaitOnStream reads the host's answer to next from the call's stream.
// The host cancels the invocation by cancelling the stream.
func (c *stageCall) awaitOnStream() error {
	f := &c.frames.answer
	for {
		err := c.stream.RecvMsg(f)
		if err != nil {
			c.cancel()
			if c.stop.Err() != nil {
				return c.stop.Err()
			}
			return err
		}
		switch k := f.Kind.(type) {
		case *pluginproto.HostFrame_NextResult:
			c.nextErr = decodeHostError(k.NextResult.Error)
			return c.nextErr
		case *pluginproto.HostFrame_Cancel:
			c.cancel()
			return context.Canceled
		case *pluginproto.HostFrame_Release:
			c.server.held.Delete(f.Call)
		}
	}
}

// Call serves one pool stream: its invocations one at a time, each on
// this goroutine, and Release frames.
func (s *server) Call(stream pluginproto.Plugin_CallServer) error {
	ctx := stream.Context()
	frames := new(streamFrames)
	f := &frames.invoke
	var idle *stageCall // the last invocation's, when it ended clean
	for {
		err := stream.RecvMsg(f)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		switch k := f.Kind.(type) {
		case *pluginproto.HostFrame_Invoke:
			// The host cancels the invocation by cancelling the stream:
			// the stream's context is the call's.
			c := idle
			if c == nil {
				c = &stageCall{server: s, stream: stream, frames: frames, stop: ctx, cancel: func() {}, nextReturned: make(chan struct{}, 1)}
			}
			c.reset(f.Call, k.Invoke)
			c.setContext(k.Invoke)
			idle = nil
			if c.run(k.Invoke) {
				idle = c
			}
		case *pluginproto.HostFrame_Release:
			s.held.Delete(f.Call)
		}
	}
}

// encodable returns, for a frame's message that carries strings of the
// middleware's making (changes, an error), the permanent failure that
// replaces it when it cannot be encoded (protobuf strings must be valid
// UTF-8), or nil. A frame that could not be encoded would end the stream,
// and the host would take the process for failed.
func encodable(m proto.Message) error {
	if _, err := proto.Marshal(m); err != nil {
		return bus.Permanent(fmt.Errorf("sdk: the middleware's changes or error cannot be sent to the host: %w", err))
	}
	return nil
}

func (c *stageCall) encodeError(err error) *pluginproto.Error {
	if c.nextErr != nil && err == c.nextErr {
		return &pluginproto.Error{IsNextError: true, Message: pluginproto.ValidText(err.Error())}
	}
	e := pluginproto.EncodeError(err)
	for _, d := range c.server.declared {
		if errors.Is(err, d) {
			e.Codes = append(e.Codes, pluginproto.ValidText(d.Error()))
		}
	}
	if e != nil && c.stage == bus.StageIncoming {
		// As in process: the bus's permanent failures, such as a
		// *bus.DecodeError an incoming middleware returns, count here; in
		// the handler stage only a handler's marked errors do.
		e.Permanent = e.Permanent || bus.IsPermanent(err)
	}
	if c.nextErr != nil && errors.Is(err, c.nextErr) {
		e.WrapsNextError = true
	}
	return e
}

// mutation reports what an outgoing middleware changed in out compared
// with what the host sent, or nil.
func mutation(out *bus.Outgoing, base *pluginproto.OutgoingMessage) *pluginproto.Mutation {
	a := out.Attributes()
	ba := base.Attributes
	if ba == nil {
		ba = &pluginproto.Attributes{}
	}
	var m pluginproto.Mutation
	changed := false
	if a.CorrelationID != ba.CorrelationId {
		m.CorrelationIdChanged, m.CorrelationId, changed = true, a.CorrelationID, true
	}
	n, _ := a.Len()
	valuesChanged := n != len(ba.Values)
	if !valuesChanged {
		for k, v := range a.Values() {
			if bv, ok := ba.Values[k]; !ok || bv != v {
				valuesChanged = true
				break
			}
		}
	}
	if valuesChanged {
		m.ValuesChanged, changed = true, true
		m.Values = maps.Collect(a.Values())
	}
	for k, v := range a.StickyValues() {
		if bv, ok := ba.Sticky[k]; !ok || bv != v {
			if m.Sticky == nil {
				m.Sticky = make(map[string]string, 2)
			}
			m.Sticky[k] = v
			changed = true
		}
	}
	if h := out.Headers(); !maps.Equal(h, base.Headers) {
		m.HeadersChanged, m.Headers, changed = true, maps.Clone(h), true
	}
	if due := pluginproto.FromDue(out.Due()); due != base.DueUnixNano {
		m.DueChanged, m.DueUnixNano, changed = true, due, true
	}
	if !changed {
		return nil
	}
	return &m
}

// valuesFrom is the context of an invocation made while a parent
// invocation's next runs: its own deadline and cancellation, the values of
// the context the parent's middleware gave next.
type valuesFrom struct {
	context.Context
	values context.Context
}

// Value returns the parent's value for key.
func (v *valuesFrom) Value(key any) any { return v.values.Value(key) }

var _ pluginproto.PluginServer = (*server)(nil)
