package bus

import (
	"context"
	"log/slog"
	"sync/atomic"
)

// pipe is one stage's chain, composed once when the bus is built: the
// middleware's names, stage functions and base loggers, outermost first.
type pipe[C any] struct {
	stage Stage
	names []string
	funcs []func(context.Context, *C, Next) error
	base  []*slog.Logger // the bus logger scoped with the stage and the middleware
}

func (p *pipe[C]) add(name string, fn func(context.Context, *C, Next) error, logger *slog.Logger) {
	p.names = append(p.names, name)
	p.funcs = append(p.funcs, fn)
	p.base = append(p.base, logger.With(slog.String("stage", p.stage.String()), slog.String("middleware", name)))
}

// Each layer's state is an epoch (the invocation's number) and a phase.
// A layer is set to (epoch, next) by a compare-and-swap when it calls next,
// and to (epoch, done) when it returns, so that one hop costs two atomic
// operations and works when next runs on another goroutine.
const (
	phaseNext uint64 = 1
	phaseDone uint64 = 2
)

func phase(epoch, p uint64) uint64 { return epoch<<2 | p }

// run is the reusable state of one invocation of a stage. It is pooled:
// every closure and stage context in it is made once, so running a chain
// allocates nothing per layer. A run goes back to its pool only when it
// ended clean (every layer called next once and returned after it), so a
// next still running on another goroutine never sees its run reused.
type run[C any] struct {
	chain            *pipe[C]
	contexts         []C             // the stage context given to each layer
	nexts            []Next          // the next given to each layer
	phases           []atomic.Uint64 // each layer's phase in the current epoch
	terminalReturned atomic.Uint64   // the last epoch whose terminal step returned
	epoch            atomic.Uint64   // the current invocation
	retired          atomic.Bool     // never back to the pool: a layer returned without calling next first, or a next failed
	messageLoggers   []*slog.Logger  // each layer's logger scoped with the message, made on first use
	terminal         func(context.Context) error
	messageFields    func() []any // what scopes a logger to the message
	shortCircuitLog  string       // the debug message when a layer does not call next

	// single holds the per-layer slices of a one-layer chain (a stage
	// context made by a StageMaker, for one), which then cost no
	// allocation of their own.
	single struct {
		contexts       [1]C
		nexts          [1]Next
		phases         [1]atomic.Uint64
		messageLoggers [1]*slog.Logger
	}
}

func (r *run[C]) init(chain *pipe[C], stageContext func(i int) C, terminal func(context.Context) error, messageFields func() []any, shortCircuitLog string) {
	n := len(chain.funcs)
	if n == 0 && len(chain.names) > 0 { // standalone stage context for tests
		n = len(chain.names)
	}
	r.chain = chain
	if n == 1 {
		r.contexts, r.nexts = r.single.contexts[:], r.single.nexts[:]
		r.phases, r.messageLoggers = r.single.phases[:], r.single.messageLoggers[:]
	} else {
		r.contexts = make([]C, n)
		r.nexts = make([]Next, n)
		r.phases = make([]atomic.Uint64, n)
		r.messageLoggers = make([]*slog.Logger, n)
	}
	r.terminal = terminal
	r.messageFields = messageFields
	r.shortCircuitLog = shortCircuitLog
	for i := range n {
		r.contexts[i] = stageContext(i)
		r.phases[i].Store(phase(0, phaseDone))
	}
	funcs := chain.funcs
	// Built from the innermost layer out, so that each next holds the next
	// layer's function, context, phase and next directly.
	for i := n - 1; i >= 0; i-- {
		phaseI := &r.phases[i]
		// next of layer i runs layer i+1 itself: one frame per hop besides
		// the middleware's own, so deep chains stay cheap.
		j := i + 1
		if j >= len(funcs) {
			// The innermost next runs the terminal step. No layer inside
			// it records when it returns, so it records that itself: an
			// innermost middleware that hands next to another goroutine
			// and returns must not leave the run reusable while the
			// terminal step still runs there.
			r.nexts[i] = func(ctx context.Context) error {
				e := r.epoch.Load()
				if !phaseI.CompareAndSwap(phase(e-1, phaseDone), phase(e, phaseNext)) {
					return r.misusedNext(i)
				}
				err := r.terminal(ctx)
				r.terminalReturned.Store(e)
				if err != nil {
					r.retired.Store(true) // see below
				}
				return err
			}
			continue
		}
		fnJ, contextJ, phaseJ, nextJ := funcs[j], &r.contexts[j], &r.phases[j], r.nexts[j]
		r.nexts[i] = func(ctx context.Context) error {
			e := r.epoch.Load()
			if !phaseI.CompareAndSwap(phase(e-1, phaseDone), phase(e, phaseNext)) {
				return r.misusedNext(i)
			}
			err := fnJ(ctx, contextJ, nextJ)
			// leave, written out: the generic method is too big to be
			// inlined here, and a call per hop shows in deep chains.
			if prev := phaseJ.Swap(phase(e, phaseDone)); prev != phase(e, phaseNext) {
				r.leftEarly(ctx, j, err)
			}
			if err != nil {
				// A next that failed is what a middleware retrying in the
				// background keeps: its run is not reused, so that the
				// kept next gets a NextMisuseError rather than
				// running a later message's chain.
				r.retired.Store(true)
			}
			return err
		}
	}
}

// start runs the chain as a new epoch.
func (r *run[C]) start(ctx context.Context) error {
	if len(r.chain.funcs) == 0 {
		return r.terminal(ctx) // on this goroutine: reusable needs no record
	}
	clear(r.messageLoggers)
	e := r.epoch.Load() + 1
	r.epoch.Store(e)
	err := r.chain.funcs[0](ctx, &r.contexts[0], r.nexts[0])
	r.leave(ctx, e, 0, err)
	return err
}

// leave marks layer i returned in epoch e.
func (r *run[C]) leave(ctx context.Context, e uint64, i int, err error) {
	if prev := r.phases[i].Swap(phase(e, phaseDone)); prev != phase(e, phaseNext) {
		r.leftEarly(ctx, i, err)
	}
}

// leftEarly handles layer i returning without having called next: it
// short-circuited — or handed next to another goroutine that has not
// called it yet. Either way the run is not reused.
func (r *run[C]) leftEarly(ctx context.Context, i int, err error) {
	r.retired.Store(true)
	if err == nil {
		r.shortCircuited(ctx, i)
	}
}

// reusable reports whether the run may go back to its pool: every layer
// called next and returned after it, the terminal step returned, and no
// next is still running.
func (r *run[C]) reusable() bool {
	if r.retired.Load() {
		return false
	}
	e := r.epoch.Load()
	if len(r.phases) > 0 && r.terminalReturned.Load() != e {
		return false // the terminal step has not returned (or never ran)
	}
	done := phase(e, phaseDone)
	for i := range r.phases {
		if r.phases[i].Load() != done {
			return false
		}
	}
	return true
}

// misusedNext is the error of a next called while layer i is not running:
// a second call, or a call after layer i returned.
func (r *run[C]) misusedNext(i int) error {
	twice := r.phases[i].Load() == phase(r.epoch.Load(), phaseNext)
	return &NextMisuseError{Stage: r.chain.stage, Middleware: r.chain.names[i], AfterReturn: !twice}
}

// shortCircuited logs that layer i returned without calling next.
func (r *run[C]) shortCircuited(ctx context.Context, i int) {
	if r.chain.base[i].Enabled(ctx, slog.LevelDebug) {
		r.logger(i).DebugContext(ctx, r.shortCircuitLog)
	}
}

// logger returns the logger of layer i scoped with the message, made on
// first use within this invocation.
func (r *run[C]) logger(i int) *slog.Logger {
	if l := r.messageLoggers[i]; l != nil {
		return l
	}
	l := r.chain.base[i].With(r.messageFields()...)
	r.messageLoggers[i] = l
	return l
}

func (r *run[C]) middlewareName(i int) string { return r.chain.names[i] }
