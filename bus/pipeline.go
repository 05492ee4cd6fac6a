package bus

import (
	"context"
	"log/slog"
	"sync/atomic"
)

// pipe is one stage's chain, composed once when the bus is built: the
// middleware's names, stage functions and base loggers, outermost first.
type pipe[C, N any] struct {
	stage Stage
	names []string
	funcs []func(context.Context, *C, *N) error
	base  []*slog.Logger // the bus logger scoped with the stage and the middleware
	twice []error        // what layer i's next returns when called a second time
	after []error        // what a next returns that reaches the terminal step after the invocation ended (the innermost layer's)
}

func (p *pipe[C, N]) add(name string, fn func(context.Context, *C, *N) error, logger *slog.Logger) {
	p.names = append(p.names, name)
	p.funcs = append(p.funcs, fn)
	p.base = append(p.base, logger.With(slog.String("stage", p.stage.String()), slog.String("middleware", name)))
	p.twice = append(p.twice, &NextMisuseError{Stage: p.stage, Middleware: name})
	p.after = append(p.after, &NextMisuseError{Stage: p.stage, Middleware: name, AfterReturn: true})
}

// hop is what a next points to: the following layer's middleware, stage
// context and next, so that a next's Call, inlined into the middleware
// that calls it, calls the following middleware directly. A layer then
// costs the middleware's own call, and a plain flag tells a second call.
type hop[C, N any] struct {
	fn      func(context.Context, *C, *N) error // the following layer's middleware, or the terminal step
	c       *C                                  // the following layer's stage context
	next    *N                                  // the following layer's next
	entered bool                                // Call ran in this invocation
	twice   error                               // what a second Call returns
	f       func(context.Context) error         // a standalone next's function
}

// hopper is a next type: *IncomingNext, *HandlingNext or *OutgoingNext.
type hopper[C, N any] interface {
	*N
	hop() *hop[C, N]
}

func (n *IncomingNext) hop() *hop[Incoming, IncomingNext] { return (*hop[Incoming, IncomingNext])(n) }
func (n *HandlingNext) hop() *hop[Handling, HandlingNext] { return (*hop[Handling, HandlingNext])(n) }
func (n *OutgoingNext) hop() *hop[Outgoing, OutgoingNext] { return (*hop[Outgoing, OutgoingNext])(n) }

// standaloneHop returns a next's state that calls fn on every Call.
func standaloneHop[C, N any, P hopper[C, N]](stage Stage, fn func(context.Context) error) *hop[C, N] {
	n := new(N)
	h := P(n).hop()
	h.fn, h.next, h.f = callStandalone[C, N, P], n, fn
	h.twice = &NextMisuseError{Stage: stage} // never returned: callStandalone re-arms the next
	return h
}

// callStandalone is a standalone next's step: it re-arms the next, then
// calls its function.
func callStandalone[C, N any, P hopper[C, N]](ctx context.Context, _ *C, n *N) error {
	h := P(n).hop()
	h.entered = false
	return h.f(ctx)
}

// run is the reusable state of one invocation of a stage. It is pooled:
// every next and stage context in it is made once, so running a chain
// allocates nothing per layer. Nothing runs between two layers (a next
// calls the following middleware itself), so the run knows only how the
// invocation ended: it goes back to its pool only when the chain returned
// nil and the terminal step returned nil in this invocation — every layer
// called its next then. Otherwise a next may still run on another
// goroutine, or be kept for later: the run is retired, never reused, and
// its terminal step refuses to run again.
type run[C, N any, P hopper[C, N]] struct {
	chain            *pipe[C, N]
	contexts         []C            // the stage context given to each layer
	nexts            []N            // the next given to each layer
	hops             []*hop[C, N]   // each next's state (P(&nexts[i]).hop(), which generic code cannot inline)
	terminalReturned atomic.Uint64  // the last epoch whose terminal step returned
	epoch            atomic.Uint64  // the current invocation
	ended            atomic.Uint64  // the epoch that ended without the run going back to its pool
	retired          atomic.Bool    // never back to the pool
	messageLoggers   []*slog.Logger // each layer's logger scoped with the message, made on first use
	loggersMade      bool           // some messageLoggers are set
	terminal         func(context.Context) error
	messageFields    func() []any // what scopes a logger to the message
	shortCircuitLog  string       // the debug message when a layer does not call next

	// single holds the per-layer slices of a one-layer chain (a stage
	// context made by a StageMaker, for one), which then cost no
	// allocation of their own.
	single struct {
		contexts       [1]C
		nexts          [1]N
		hops           [1]*hop[C, N]
		messageLoggers [1]*slog.Logger
	}
}

func (r *run[C, N, P]) init(chain *pipe[C, N], stageContext func(i int) C, terminal func(context.Context) error, messageFields func() []any, shortCircuitLog string) {
	n := len(chain.funcs)
	if n == 0 && len(chain.names) > 0 { // standalone stage context for tests
		n = len(chain.names)
	}
	r.chain = chain
	if n == 1 {
		r.contexts, r.nexts, r.hops, r.messageLoggers = r.single.contexts[:], r.single.nexts[:], r.single.hops[:], r.single.messageLoggers[:]
	} else {
		r.contexts = make([]C, n)
		r.nexts = make([]N, n)
		r.hops = make([]*hop[C, N], n)
		r.messageLoggers = make([]*slog.Logger, n)
	}
	r.terminal = terminal
	r.messageFields = messageFields
	r.shortCircuitLog = shortCircuitLog
	for i := range n {
		r.contexts[i] = stageContext(i)
	}
	funcs := chain.funcs
	if len(funcs) == 0 {
		r.nexts, r.hops = nil, nil // a standalone context: its middleware is given a next made by NewIncomingNext or a sibling
		return
	}
	// The innermost next's step: the terminal step, unless the invocation
	// already ended (a next kept, or left running on another goroutine,
	// by a middleware that returned). Written out here rather than in a
	// method: a frame less under every chain.
	last := func(ctx context.Context, _ *C, _ *N) error {
		e := r.epoch.Load()
		if r.ended.Load() == e {
			return r.chain.after[len(r.chain.after)-1]
		}
		err := r.terminal(ctx)
		if err != nil {
			// A next that failed is what a middleware retrying in the
			// background keeps: its run is not reused, so that the kept
			// next never runs a later message's chain.
			r.retired.Store(true)
		}
		r.terminalReturned.Store(e)
		return err
	}
	for i := range n {
		h := P(&r.nexts[i]).hop()
		r.hops[i] = h
		h.twice = chain.twice[i]
		if i+1 < n {
			h.fn, h.c, h.next = funcs[i+1], &r.contexts[i+1], &r.nexts[i+1]
		} else {
			h.fn = last
		}
	}
}

// start runs the chain as a new epoch.
func (r *run[C, N, P]) start(ctx context.Context) error {
	funcs := r.chain.funcs
	if len(funcs) == 0 {
		return r.terminal(ctx) // on this goroutine: reusable needs no record
	}
	if r.loggersMade {
		clear(r.messageLoggers)
		r.loggersMade = false
	}
	for _, h := range r.hops {
		h.entered = false
	}
	e := r.epoch.Load() + 1
	r.epoch.Store(e)
	err := funcs[0](ctx, &r.contexts[0], &r.nexts[0])
	if err != nil || r.terminalReturned.Load() != e {
		r.endUnclean(ctx, e, err)
	}
	return err
}

// endUnclean retires the run of invocation e, which returned err without
// its terminal step having returned in it, or failed.
func (r *run[C, N, P]) endUnclean(ctx context.Context, e uint64, err error) {
	r.retired.Store(true)
	r.ended.Store(e)
	if err != nil {
		return
	}
	// A layer returned nil without calling next: the first whose next was
	// not called. (If every next was called, the terminal step has not
	// returned: a middleware returned while its next runs elsewhere.)
	for i, h := range r.hops {
		if !h.entered {
			r.shortCircuited(ctx, i)
			return
		}
	}
}

// reusable reports whether the run may go back to its pool: the chain
// returned nil, the terminal step returned nil in this invocation, and
// no layer panicked.
func (r *run[C, N, P]) reusable() bool {
	if r.retired.Load() {
		return false
	}
	return len(r.chain.funcs) == 0 || r.terminalReturned.Load() == r.epoch.Load()
}

// shortCircuited logs that layer i returned without calling next.
func (r *run[C, N, P]) shortCircuited(ctx context.Context, i int) {
	if r.chain.base[i].Enabled(ctx, slog.LevelDebug) {
		r.logger(i).DebugContext(ctx, r.shortCircuitLog)
	}
}

// logger returns the logger of layer i scoped with the message, made on
// first use within this invocation.
func (r *run[C, N, P]) logger(i int) *slog.Logger {
	if l := r.messageLoggers[i]; l != nil {
		return l
	}
	l := r.chain.base[i].With(r.messageFields()...)
	r.messageLoggers[i] = l
	r.loggersMade = true
	return l
}

func (r *run[C, N, P]) middlewareName(i int) string { return r.chain.names[i] }
