// Package concurrency bounds how many messages of one name are processed
// at once, so that a slow kind of message cannot take every worker of the
// bus ([bus.WithConcurrency]) while the other kinds wait behind it.
//
//	bus.WithConcurrency(16),
//	bus.WithMiddleware(concurrency.New(4, concurrency.WithLimit(3, ExportReport{}))),
//
// At the bus level each message name has its own limit, taken in the
// incoming stage, before the message is decoded: a message over its limit
// does not hold a worker while it waits. It waits at most [WithMaxWait]
// (by default not at all) for a slot, and is then returned to the
// transport with a delay ([WithRetryDelay]; [bus.RetryAfter]), to be
// tried again while the worker takes other messages. The wait ends at
// once when the bus begins to stop: the message is returned that way,
// and Stop does not wait for a slot. Given to one handler
// ([bus.HandlerMiddleware]), it bounds the runs of that handler, in its
// handler stage.
//
// Each return counts as a delivery of the message (see bus.RetryAfter):
// size the retry delay so that a message waits its turn with few returns.
// On a transport that cannot delay messages (no bus.Delayer) a return is
// an ordinary failure.
//
// The slots live in the process that runs the middleware, and its delayed
// return does not cross the plugin boundary: it is meant to run in
// process.
package concurrency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/plugbus/plugbus/bus"
)

// ErrFull is matched by every [*FullError].
var ErrFull = errors.New("concurrency: limit reached")

// FullError is the cause of a message returned because as many messages
// of its name (or runs of its handler) as its limit allows were running.
type FullError struct {
	// Message is the message's name; Handler the handler's, given to one.
	Message, Handler string
	// Limit is the limit that was reached.
	Limit int
	// Stopping is true when the bus began to stop while the message
	// waited for a slot ([WithMaxWait]).
	Stopping bool
}

// Error says which limit was reached.
func (e *FullError) Error() string {
	why := ""
	if e.Stopping {
		why = " (the bus is stopping)"
	}
	if e.Handler != "" {
		return fmt.Sprintf("concurrency: handler %s already runs %d message(s) of %s at once, its limit; message returned to be tried later%s", e.Handler, e.Limit, e.Message, why)
	}
	return fmt.Sprintf("concurrency: %d message(s) of %s already processed at once, the limit; message returned to be tried later%s", e.Limit, e.Message, why)
}

// Is reports whether target is ErrFull.
func (e *FullError) Is(target error) bool { return target == ErrFull }

// Option configures [New].
type Option func(*config)

type config struct {
	limits     map[string]int // by message name
	maxWait    time.Duration
	retryDelay time.Duration
	err        error
}

// WithLimit gives the messages of msgs' names a limit of their own.
func WithLimit(n int, msgs ...bus.Message) Option {
	return func(c *config) {
		if c.limits == nil {
			c.limits = make(map[string]int)
		}
		for _, m := range msgs {
			if m == nil {
				c.err = errors.New("concurrency.WithLimit: nil message; pass a value of the message type, such as ExportReport{}")
				return
			}
			c.limits[m.MessageName()] = n
		}
	}
}

// WithMaxWait lets a message over its limit wait up to d for a slot,
// holding its worker, before it is returned (default 0: returned at once).
// A wait under way when the bus begins to stop ends then, and the message
// is returned ([FullError].Stopping).
func WithMaxWait(d time.Duration) Option { return func(c *config) { c.maxWait = d } }

// WithRetryDelay sets how long a message over its limit waits in the
// transport before it is delivered again (default 1 s).
func WithRetryDelay(d time.Duration) Option { return func(c *config) { c.retryDelay = d } }

// limiter is one bus's (or handler's) slots; fixed at Instantiate, so
// that taking a slot needs no lock beyond the channel's.
type limiter struct {
	config
	slots    map[string]chan struct{} // by message name, at the bus level
	one      chan struct{}            // given to one handler
	handler  string
	stopping <-chan struct{} // the bus's Stopping: ends a wait for a slot
}

// New returns a plugin that lets at most n messages of each name (or, for
// one handler, n runs of it) be processed at once; [WithLimit] sets other
// limits for some names.
func New(n int, opts ...Option) bus.Plugin {
	return bus.PluginFunc(func(info bus.PluginInfo) (bus.Middleware, error) {
		l := &limiter{config: config{retryDelay: time.Second}, handler: info.Handler}
		for _, o := range opts {
			o(&l.config)
		}
		if l.err != nil {
			return bus.Middleware{}, l.err
		}
		for name, k := range l.limits {
			if k < 1 {
				return bus.Middleware{}, fmt.Errorf("concurrency.WithLimit(%d) for %s: must be at least 1", k, name)
			}
		}
		switch {
		case n < 1:
			return bus.Middleware{}, fmt.Errorf("concurrency.New(%d): must be at least 1", n)
		case l.maxWait < 0 || l.retryDelay <= 0:
			return bus.Middleware{}, fmt.Errorf("concurrency: WithMaxWait(%v) must not be negative and WithRetryDelay(%v) must be positive", l.maxWait, l.retryDelay)
		}
		if info.Bus != nil {
			l.stopping = info.Bus.Stopping()
		}
		if info.Handler != "" {
			k, ok := l.limits[info.Handles[0]]
			if !ok {
				k = n
			}
			l.one = make(chan struct{}, k)
			return bus.Middleware{Name: "concurrency", Handling: l.handling}, nil
		}
		l.slots = make(map[string]chan struct{}, len(info.Handles))
		for _, name := range info.Handles {
			k, ok := l.limits[name]
			if !ok {
				k = n
			}
			l.slots[name] = make(chan struct{}, k)
		}
		return bus.Middleware{Name: "concurrency", Incoming: l.incoming}, nil
	})
}

func (l *limiter) incoming(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
	slots, ok := l.slots[in.Name()]
	if !ok {
		return next.Call(ctx) // no handler handles it: nothing to bound
	}
	if err := l.acquire(ctx, slots, in.Name()); err != nil {
		return err
	}
	defer func() { <-slots }()
	return next.Call(ctx)
}

func (l *limiter) handling(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
	if err := l.acquire(ctx, l.one, h.MessageName()); err != nil {
		return err
	}
	defer func() { <-l.one }()
	return next.Call(ctx)
}

// acquire takes a slot, waiting up to maxWait, and not once the bus
// begins to stop: Stop then need not wait for the slot, and the message
// is returned for later rather than interrupted.
func (l *limiter) acquire(ctx context.Context, slots chan struct{}, name string) error {
	select {
	case slots <- struct{}{}:
		return nil
	default:
	}
	stopping := false
	if l.maxWait > 0 {
		t := time.NewTimer(l.maxWait)
		defer t.Stop()
		select {
		case slots <- struct{}{}:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-l.stopping:
			stopping = true
		case <-t.C:
		}
	}
	return bus.RetryAfter(&FullError{Message: name, Handler: l.handler, Limit: cap(slots), Stopping: stopping}, l.retryDelay)
}
