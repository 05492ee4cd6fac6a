package bus

import (
	"context"
	"log/slog"
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

type hop uint8

const (
	hopIdle hop = iota
	hopRunning
	hopNext
	hopDone
)

// run is the reusable state of one invocation of a stage. It is pooled:
// every closure and stage context in it is made once, so running a chain
// allocates nothing per layer.
type run[C any] struct {
	p        *pipe[C]
	ctxs     []C
	nexts    []Next
	state    []hop
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
	r.state = make([]hop, n)
	r.loggers = make([]*slog.Logger, n)
	r.terminal = terminal
	r.describe = describe
	r.short = short
	for i := range n {
		r.ctxs[i] = mk(i)
	}
	fns := p.fns
	for i := range n {
		// next of layer i runs layer i+1 itself: one frame per hop besides
		// the middleware's own, so deep chains stay cheap.
		j := i + 1
		if j >= len(fns) {
			r.nexts[i] = func(ctx context.Context) error {
				if r.state[i] != hopRunning {
					return r.badNext(i)
				}
				r.state[i] = hopNext
				return r.terminal(ctx)
			}
			continue
		}
		fn, sc := fns[j], &r.ctxs[j]
		r.nexts[i] = func(ctx context.Context) error {
			if r.state[i] != hopRunning {
				return r.badNext(i)
			}
			r.state[i] = hopNext
			r.state[j] = hopRunning
			err := fn(ctx, sc, r.nexts[j])
			if r.state[j] == hopRunning && err == nil {
				r.shortCircuited(ctx, j)
			}
			r.state[j] = hopDone
			return err
		}
	}
}

func (r *run[C]) start(ctx context.Context) error {
	if len(r.p.fns) == 0 {
		return r.terminal(ctx)
	}
	clear(r.state)
	clear(r.loggers)
	return r.enter(ctx, 0)
}

func (r *run[C]) enter(ctx context.Context, i int) error {
	r.state[i] = hopRunning
	err := r.p.fns[i](ctx, &r.ctxs[i], r.nexts[i])
	if r.state[i] == hopRunning && err == nil {
		r.shortCircuited(ctx, i)
	}
	r.state[i] = hopDone
	return err
}

// badNext is the error of a next called while layer i is not running:
// a second call, or a call after layer i returned.
func (r *run[C]) badNext(i int) error {
	return &NextCalledTwiceError{Stage: r.p.stage, Middleware: r.p.names[i], AfterReturn: r.state[i] != hopNext}
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
