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
}

func (p *pipe[C, N]) add(name string, fn func(context.Context, *C, *N) error, logger *slog.Logger) {
	p.names = append(p.names, name)
	p.funcs = append(p.funcs, fn)
	p.base = append(p.base, logger.With(slog.String("stage", p.stage.String()), slog.String("middleware", name)))
	p.twice = append(p.twice, &NextMisuseError{Stage: p.stage, Middleware: name})
}

// hop is what a next points to: the following layer's middleware, stage
// context and next, so that a next's Call, inlined into the middleware
// that calls it, calls the following middleware directly. A layer then
// costs the middleware's own call.
//
// ret is errFresh until Call is called in the invocation; Call then runs
// fn and records what it returned in ret. A Call that finds ret other
// than errFresh is a second call. What ret holds at the end tells the
// pipeline, once the chain returned nil, a clean invocation from one in
// which a middleware caught the error of a next that may still run
// elsewhere (a timeout that returned while its next runs on another
// goroutine). A flag and the record would not fit the compiler's inlining
// budget together; the record alone does.
type hop[C, N any] struct {
	fn    func(context.Context, *C, *N) error // the following layer's middleware, or the terminal step
	c     *C                                  // the following layer's stage context
	next  *N                                  // the following layer's next
	ret   error                               // errFresh, then what fn returned in this invocation
	twice error                               // what a second Call returns
	f     func(context.Context) error         // a standalone next's function
}

// freshError is the type of errFresh, a pointer so that Call compares ret
// with it without a call.
type freshError struct{}

func (*freshError) Error() string { return "bus: next not called yet" }

// errFresh is a hop's ret until its Call is called in the invocation.
var errFresh = &freshError{}

// hopper is a next type: *IncomingNext, *HandlingNext or *OutgoingNext.
type hopper[C, N any] interface {
	*N
	hop() *hop[C, N]
}

func (n *IncomingNext) hop() *hop[Incoming, IncomingNext] { return (*hop[Incoming, IncomingNext])(n) }
func (n *HandlingNext) hop() *hop[Handling, HandlingNext] { return (*hop[Handling, HandlingNext])(n) }
func (n *OutgoingNext) hop() *hop[Outgoing, OutgoingNext] { return (*hop[Outgoing, OutgoingNext])(n) }

// standaloneHop returns a next's state that calls fn on the first Call;
// a second returns twice.
func standaloneHop[C, N any, P hopper[C, N]](fn func(context.Context) error, twice error) *hop[C, N] {
	n := new(N)
	h := P(n).hop()
	h.fn, h.next, h.f, h.ret, h.twice = callStandalone[C, N, P], n, fn, errFresh, twice
	return h
}

// callStandalone is a standalone next's step: it calls its function.
func callStandalone[C, N any, P hopper[C, N]](ctx context.Context, _ *C, n *N) error {
	return P(n).hop().f(ctx)
}

// run is the reusable state of one invocation of a stage. It is pooled:
// every next and stage context in it is made once, so running a chain
// allocates nothing per layer. Nothing runs between two layers (a next
// calls the following middleware itself), so the run knows only how the
// invocation ended: it goes back to its pool only when the chain returned
// nil, and every next and the terminal step returned nil in this
// invocation — every layer called its next and returned after it then.
// Otherwise a next may still run on another goroutine, or be kept for
// later: the run is retired, never reused, and its terminal step refuses
// to run again.
type run[C, N any, P hopper[C, N]] struct {
	chain            *pipe[C, N]
	contexts         []C            // the stage context given to each layer
	nexts            []N            // the next given to each layer
	hops             []*hop[C, N]   // each next's state (P(&nexts[i]).hop(), which generic code cannot inline)
	terminalReturned atomic.Uint64  // the last epoch whose terminal step returned
	terminalEntered  atomic.Uint64  // the last epoch whose terminal step began
	epoch            atomic.Uint64  // the current invocation
	ended            atomic.Uint64  // the epoch that ended without the run going back to its pool
	retired          atomic.Bool    // never back to the pool
	messageLoggers   []*slog.Logger // each layer's logger scoped with the message, made on first use
	loggersMade      atomic.Bool    // some messageLoggers are set (atomic: layers on two goroutines may make theirs at once, a timed-out next's and the layer around it)
	messageFields    func() []any   // what scopes a logger to the message
	shortCircuitLog  string         // the debug message when a layer does not call next

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

// init builds the run of chain. last is the stage's terminal step, the
// innermost next's step itself (no frame of the pipeline's between the
// innermost layer and the handlers, or the transport): it is given the
// innermost layer's stage context, which leads to the run, and brackets
// its work with enterTerminal and leaveTerminal. A standalone stage
// context (no chain) has none.
func (r *run[C, N, P]) init(chain *pipe[C, N], stageContext func(i int) C, last func(context.Context, *C, *N) error, messageFields func() []any, shortCircuitLog string) {
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
	r.messageFields = messageFields
	r.shortCircuitLog = shortCircuitLog
	for i := range r.contexts {
		r.contexts[i] = stageContext(i)
	}
	funcs := chain.funcs
	if len(funcs) == 0 {
		r.nexts, r.hops = nil, nil // a standalone context: its middleware is given a next made by NewIncomingNext or a sibling
		return
	}
	for i := range n {
		h := P(&r.nexts[i]).hop()
		r.hops[i] = h
		h.twice, h.ret = chain.twice[i], errFresh
		if i+1 < n {
			h.fn, h.c, h.next = funcs[i+1], &r.contexts[i+1], &r.nexts[i+1]
		} else {
			h.fn, h.c = last, &r.contexts[i]
		}
	}
}

// enterTerminal begins the terminal step of the current invocation e,
// unless the invocation already ended (a next kept, or left running on
// another goroutine, by a middleware that returned): then it returns the
// innermost middleware's NextMisuseError (AfterReturn). The terminal step
// runs once per invocation: a next called again while its first call
// runs, from another goroutine (a next's own check sees the first call
// only once it returned), gets the innermost middleware's error for a
// second call instead of running the handlers, or the send, again.
func (r *run[C, N, P]) enterTerminal() (e uint64, err error) {
	e = r.epoch.Load()
	if r.ended.Load() == e { // a misuse: the error is made when it happens
		return e, &NextMisuseError{Stage: r.chain.stage, Middleware: r.chain.names[len(r.chain.names)-1], AfterReturn: true}
	}
	if r.terminalEntered.Swap(e) == e {
		return e, r.chain.twice[len(r.chain.twice)-1]
	}
	return e, nil
}

// leaveTerminal records that the terminal step of invocation e returned
// err.
func (r *run[C, N, P]) leaveTerminal(e uint64, err error) {
	if err != nil {
		// A next that failed is what a middleware retrying in the
		// background keeps: its run is not reused, so that the kept
		// next never runs a later message's chain.
		r.retired.Store(true)
	}
	r.terminalReturned.Store(e)
}

// enterStep is enterTerminal for a step that also runs with no chain
// (then e is 0: nothing is entered).
func (r *run[C, N, P]) enterStep() (e uint64, err error) {
	if len(r.hops) == 0 {
		return 0, nil
	}
	return r.enterTerminal()
}

// left ends the terminal step of invocation e with err, and returns err;
// e is 0 when the step ran with no chain (nothing entered it).
func (r *run[C, N, P]) left(e uint64, err error) error {
	if e != 0 {
		r.leaveTerminal(e, err)
	}
	return err
}

// begin starts a new invocation of a chain with layers and returns its
// epoch. A stage's caller runs the invocation itself, with no frame of
// the pipeline's above the outermost layer:
//
//	e := r.begin()
//	err := r.chain.funcs[0](ctx, &r.contexts[0], &r.nexts[0])
//	r.finish(ctx, e, err)
func (r *run[C, N, P]) begin() uint64 {
	if r.loggersMade.Load() {
		clear(r.messageLoggers)
		r.loggersMade.Store(false)
	}
	for _, h := range r.hops {
		h.ret = errFresh
	}
	e := r.epoch.Load() + 1
	r.epoch.Store(e)
	return e
}

// finish ends invocation e, whose outermost layer returned err.
func (r *run[C, N, P]) finish(ctx context.Context, e uint64, err error) {
	if err != nil || r.terminalReturned.Load() != e || !r.nextsReturnedNil() {
		r.endUnclean(ctx, e, err)
	}
}

// nextsReturnedNil reports whether every next of an invocation whose
// terminal step returned in it returned nil: every layer was on the way
// to the terminal step, so every next was called in the invocation, and
// its ret is this invocation's once its call returned. It reads them
// outermost first and stops at the first that did not return nil: its
// middleware caught the error, and a next inside may still run on
// another goroutine (a timeout that returned an error), whose state is not
// read. (A next still running inside one that returned nil is a
// middleware that returned nil before the next it called: a misuse.)
func (r *run[C, N, P]) nextsReturnedNil() bool {
	for _, h := range r.hops {
		if h.ret != nil {
			return false
		}
	}
	return true
}

// endUnclean retires the run of invocation e, which returned err without
// its terminal step having returned nil in it, or in which a next
// returned an error that a middleware caught.
func (r *run[C, N, P]) endUnclean(ctx context.Context, e uint64, err error) {
	r.retired.Store(true)
	r.ended.Store(e)
	if err != nil || r.terminalReturned.Load() == e {
		return
	}
	// A layer returned nil without calling next: the first whose next
	// was not called (or, a misuse, still runs elsewhere while the layer
	// returned nil). The search stops at a next that returned an error
	// its middleware caught: what is inside may still run elsewhere.
	for i, h := range r.hops {
		switch h.ret {
		case nil:
			continue
		case error(errFresh):
			r.shortCircuited(ctx, i)
		}
		return
	}
}

// abandon ends the current invocation, which panicked, as endUnclean
// does: a next of it may still run on another goroutine, or be kept.
func (r *run[C, N, P]) abandon() {
	r.retired.Store(true)
	r.ended.Store(r.epoch.Load())
}

// reusable reports whether the run may go back to its pool: nothing
// retired it (finish, abandon and a failed terminal step do).
func (r *run[C, N, P]) reusable() bool { return !r.retired.Load() }

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
	if !r.loggersMade.Load() {
		r.loggersMade.Store(true)
	}
	return l
}

func (r *run[C, N, P]) middlewareName(i int) string { return r.chain.names[i] }
