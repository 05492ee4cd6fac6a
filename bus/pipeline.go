package bus

import (
	"context"
	"log/slog"
	"sync/atomic"
)

// pipe is one stage's chain, composed once when the bus is built.
type pipe[C any] struct {
	stage Stage
	names []string
	fns   []func(context.Context, *C, Next) error
	base  []*slog.Logger // bus logger scoped with stage and middleware
}

func (p *pipe[C]) add(name string, fn func(context.Context, *C, Next) error, logger *slog.Logger) {
	p.names = append(p.names, name)
	p.fns = append(p.fns, fn)
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
	p        *pipe[C]
	ctxs     []C
	nexts    []Next
	state    []atomic.Uint64 // phase of each layer in the current epoch
	term     atomic.Uint64   // the last epoch whose terminal step returned
	epoch    atomic.Uint64   // the current invocation
	unclean  atomic.Bool     // a layer returned without calling next first
	loggers  []*slog.Logger
	terminal func(context.Context) error
	describe func() []any // message fields for scoped loggers
	short    string       // debug message when a layer does not call next
}

func (r *run[C]) init(p *pipe[C], mk func(i int) C, terminal func(context.Context) error, describe func() []any, short string) {
	n := len(p.fns)
	if n == 0 && len(p.names) > 0 { // standalone stage context for tests
		n = len(p.names)
	}
	r.p = p
	r.ctxs = make([]C, n)
	r.nexts = make([]Next, n)
	r.state = make([]atomic.Uint64, n)
	r.loggers = make([]*slog.Logger, n)
	r.terminal = terminal
	r.describe = describe
	r.short = short
	for i := range n {
		r.ctxs[i] = mk(i)
		r.state[i].Store(phase(0, phaseDone))
	}
	fns := p.fns
	// Built from the innermost layer out, so that each next holds the next
	// layer's function, context, state and next directly.
	for i := n - 1; i >= 0; i-- {
		si := &r.state[i]
		// next of layer i runs layer i+1 itself: one frame per hop besides
		// the middleware's own, so deep chains stay cheap.
		j := i + 1
		if j >= len(fns) {
			// The innermost next runs the terminal step. No layer inside
			// it records when it returns, so it records that itself: an
			// innermost middleware that hands next to another goroutine
			// and returns must not leave the run reusable while the
			// terminal step still runs there.
			r.nexts[i] = func(ctx context.Context) error {
				e := r.epoch.Load()
				if !si.CompareAndSwap(phase(e-1, phaseDone), phase(e, phaseNext)) {
					return r.badNext(i)
				}
				err := r.terminal(ctx)
				r.term.Store(e)
				if err != nil {
					r.unclean.Store(true) // see below
				}
				return err
			}
			continue
		}
		fn, sc, sj, nj := fns[j], &r.ctxs[j], &r.state[j], r.nexts[j]
		r.nexts[i] = func(ctx context.Context) error {
			e := r.epoch.Load()
			if !si.CompareAndSwap(phase(e-1, phaseDone), phase(e, phaseNext)) {
				return r.badNext(i)
			}
			err := fn(ctx, sc, nj)
			// leave, written out: the generic method is too big to be
			// inlined here, and a call per hop shows in deep chains.
			if prev := sj.Swap(phase(e, phaseDone)); prev != phase(e, phaseNext) {
				r.leftEarly(ctx, j, err)
			}
			if err != nil {
				// A next that failed is what a middleware retrying in the
				// background keeps: its run is not reused, so that the
				// kept next gets a NextCalledTwiceError rather than
				// running a later message's chain.
				r.unclean.Store(true)
			}
			return err
		}
	}
}

// start runs the chain as a new epoch.
func (r *run[C]) start(ctx context.Context) error {
	if len(r.p.fns) == 0 {
		return r.terminal(ctx) // on this goroutine: reusable needs no record
	}
	clear(r.loggers)
	e := r.epoch.Load() + 1
	r.epoch.Store(e)
	err := r.p.fns[0](ctx, &r.ctxs[0], r.nexts[0])
	r.leave(ctx, e, 0, err)
	return err
}

// leave marks layer i returned in epoch e.
func (r *run[C]) leave(ctx context.Context, e uint64, i int, err error) {
	if prev := r.state[i].Swap(phase(e, phaseDone)); prev != phase(e, phaseNext) {
		r.leftEarly(ctx, i, err)
	}
}

// leftEarly handles layer i returning without having called next: it
// short-circuited — or handed next to another goroutine that has not
// called it yet. Either way the run is not reused.
func (r *run[C]) leftEarly(ctx context.Context, i int, err error) {
	r.unclean.Store(true)
	if err == nil {
		r.shortCircuited(ctx, i)
	}
}

// reusable reports whether the run may go back to its pool: every layer
// called next and returned after it, the terminal step returned, and no
// next is still running.
func (r *run[C]) reusable() bool {
	if r.unclean.Load() {
		return false
	}
	e := r.epoch.Load()
	if len(r.state) > 0 && r.term.Load() != e {
		return false // the terminal step has not returned (or never ran)
	}
	done := phase(e, phaseDone)
	for i := range r.state {
		if r.state[i].Load() != done {
			return false
		}
	}
	return true
}

// badNext is the error of a next called while layer i is not running:
// a second call, or a call after layer i returned.
func (r *run[C]) badNext(i int) error {
	twice := r.state[i].Load() == phase(r.epoch.Load(), phaseNext)
	return &NextCalledTwiceError{Stage: r.p.stage, Middleware: r.p.names[i], AfterReturn: !twice}
}

// shortCircuited logs that layer i returned without calling next.
func (r *run[C]) shortCircuited(ctx context.Context, i int) {
	if r.p.base[i].Enabled(ctx, slog.LevelDebug) {
		r.logger(i).DebugContext(ctx, r.short)
	}
}

// logger returns the logger of layer i scoped with the message, made on
// first use within this invocation.
func (r *run[C]) logger(i int) *slog.Logger {
	if l := r.loggers[i]; l != nil {
		return l
	}
	l := r.p.base[i].With(r.describe()...)
	r.loggers[i] = l
	return l
}

func (r *run[C]) mwName(i int) string { return r.p.names[i] }
