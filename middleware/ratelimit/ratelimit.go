// Package ratelimit limits how many handler runs start per second, with
// a token bucket (golang.org/x/time/rate): for the whole endpoint (the
// default), per message name ([PerMessageName]) or per key taken from the
// message ([PerKey]: a customer, a tenant).
//
//	bus.WithMiddleware(ratelimit.New(100, 10)),                         // 100 handler runs/s on this endpoint, bursts of 10
//	bus.WithHandler(callPartner, bus.HandlerMiddleware(ratelimit.New(5, 1))), // this handler: 5/s
//
// It runs in the handler stage, where the decoded message is at hand for
// a key: each handler run takes a token, so a message with two limited
// handlers takes two. Give the limit to one handler to count each message
// once.
//
// A run over the limit waits for its token, holding its worker. The wait
// ends early when the handler's ctx ends (the run fails with the ctx's
// error) or when the bus begins to stop (the message is returned, with
// [bus.RetryAfter], to be tried when its token would have come, so that
// Stop does not wait for the limit). [WithMaxWait] bounds the wait: a run
// that would wait longer is returned that way at once, freeing its worker.
//
// Served from another process, the bucket lives in that process; a
// returned message's delay does not cross the process boundary (the bus
// sees an ordinary failure), so leave [WithMaxWait] unset there. Nor does
// the host's Stop: that process has no bus to watch, so a wait under way
// when the bus begins to stop goes on, and Stop waits for the token until
// its context ends; the run is then interrupted and its message returned
// for retry (TestOutOfProcessStopWaitsUntilItsContextEnds).
package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/plugbus/plugbus/bus"
	"golang.org/x/time/rate"
)

// ErrLimited is matched by every [*LimitedError].
var ErrLimited = errors.New("ratelimit: over the limit")

// LimitedError is the cause of a message returned, with [bus.RetryAfter],
// instead of waiting for its token: the wait was longer than
// [WithMaxWait], or the bus began to stop.
type LimitedError struct {
	Handler, Message string
	// Key is the limit's key: the message name with [PerMessageName], the
	// key with [PerKey], empty for the endpoint's limit.
	Key string
	// Wait is how long the run would have waited for its token.
	Wait time.Duration
	// Stopping is true when the bus began to stop during the wait.
	Stopping bool
}

// Error says which limit the handler ran into.
func (e *LimitedError) Error() string {
	why := "its wait is longer than the limit's maximum wait"
	if e.Stopping {
		why = "the bus is stopping"
	}
	key := ""
	if e.Key != "" {
		key = fmt.Sprintf(" (key %q)", e.Key)
	}
	return fmt.Sprintf("ratelimit: handler %s of %s over the rate limit%s: %s; returned to be tried in %v", e.Handler, e.Message, key, why, e.Wait)
}

// Is reports whether target is ErrLimited.
func (e *LimitedError) Is(target error) bool { return target == ErrLimited }

// Option configures [New].
type Option func(*limiter)

// PerMessageName gives each message name a bucket of its own.
func PerMessageName() Option {
	return func(l *limiter) {
		l.key = func(h *bus.Handling) string { return h.MessageName() }
	}
}

// PerKey gives each key a bucket of its own; key reads it from the
// message about to be handled and its attributes (an attribute, a field
// of the message). Buckets that are full again are forgotten once there
// are more than [WithMaxKeys] of them.
//
//	ratelimit.PerKey(func(m bus.Message, a bus.Attributes) string {
//		tenant, _ := a.StickyValue("tenant")
//		return tenant
//	})
func PerKey(key func(m bus.Message, attrs bus.Attributes) string) Option {
	return func(l *limiter) {
		if key == nil {
			l.err = errors.New("ratelimit.PerKey(nil): pass the function that reads the key")
			return
		}
		l.key = func(h *bus.Handling) string { return key(h.Message(), h.Attributes()) }
	}
}

// WithMaxKeys bounds how many buckets [PerKey] keeps (default 10,000):
// beyond it, buckets that are full again (their key is idle) are
// forgotten, which changes nothing for their keys.
func WithMaxKeys(n int) Option {
	return func(l *limiter) { l.maxKeys = n }
}

// WithMaxWait makes a run that would wait longer than d for its token
// return its message at once, with [bus.RetryAfter] and a
// [*LimitedError], to be tried when the token would have come, instead
// of holding its worker. The default, 0, waits however long it takes; a
// negative d is refused by New.
// Each return counts as a delivery of the message (see bus.RetryAfter).
func WithMaxWait(d time.Duration) Option {
	return func(l *limiter) { l.maxWait = d }
}

type limiter struct {
	limit   rate.Limit
	burst   int
	key     func(h *bus.Handling) string // nil: one bucket
	maxKeys int
	maxWait time.Duration
	err     error

	one      *rate.Limiter
	mu       sync.Mutex
	buckets  map[string]*rate.Limiter
	stopping <-chan struct{} // the bus's Stopping; nil out of process
}

// New returns a plugin that lets at most limit handler runs start per
// second, in bursts of up to burst (at least 1); rate.Inf lets all
// through. Each bus (and each handler given it) gets buckets of its own.
func New(limit rate.Limit, burst int, opts ...Option) bus.Plugin {
	return bus.PluginFunc(func(info bus.PluginInfo) (bus.Middleware, error) {
		l := &limiter{limit: limit, burst: burst, maxKeys: 10_000}
		for _, o := range opts {
			o(l)
		}
		switch {
		case l.err != nil:
			return bus.Middleware{}, l.err
		case burst < 1:
			return bus.Middleware{}, fmt.Errorf("ratelimit.New(%v, %d): the burst must be at least 1", limit, burst)
		case limit <= 0:
			return bus.Middleware{}, fmt.Errorf("ratelimit.New(%v, %d): the limit must be positive (rate.Inf for none)", limit, burst)
		case l.maxKeys < 1:
			return bus.Middleware{}, fmt.Errorf("ratelimit.WithMaxKeys(%d): must be at least 1", l.maxKeys)
		case l.maxWait < 0:
			return bus.Middleware{}, fmt.Errorf("ratelimit.WithMaxWait(%v): must not be negative (0 waits however long it takes)", l.maxWait)
		}
		if info.Bus != nil {
			l.stopping = info.Bus.Stopping()
		}
		if l.key == nil {
			l.one = rate.NewLimiter(limit, burst)
		} else {
			l.buckets = make(map[string]*rate.Limiter)
		}
		return bus.Middleware{Name: "ratelimit", Handling: l.handle}, nil
	})
}

func (l *limiter) handle(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
	now := time.Now()
	var r *rate.Reservation
	key := ""
	if l.one != nil {
		r = l.one.ReserveN(now, 1)
	} else {
		key = l.key(h)
		r = l.reserve(key, now)
	}
	wait := r.DelayFrom(now)
	if wait == 0 {
		return next.Call(ctx)
	}
	if l.maxWait > 0 && wait > l.maxWait {
		r.CancelAt(now)
		return bus.RetryAfter(&LimitedError{Handler: h.HandlerName(), Message: h.MessageName(), Key: key, Wait: wait}, wait)
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return next.Call(ctx)
	case <-ctx.Done():
		r.Cancel()
		return ctx.Err()
	case <-l.stopping:
		left := r.Delay()
		r.Cancel()
		return bus.RetryAfter(&LimitedError{Handler: h.HandlerName(), Message: h.MessageName(), Key: key, Wait: left, Stopping: true}, left)
	}
}

// reserve takes a token from key's bucket, made on first use. It
// reserves under the lock that guards eviction: a bucket is evicted only
// when full, and a bucket handed out and reserved from after the lock is
// released could be evicted in between, its key then given a second full
// burst.
func (l *limiter) reserve(key string, now time.Time) *rate.Reservation {
	l.mu.Lock()
	defer l.mu.Unlock()
	if b, ok := l.buckets[key]; ok {
		return b.ReserveN(now, 1)
	}
	if len(l.buckets) >= l.maxKeys {
		for k, b := range l.buckets {
			if b.TokensAt(now) >= float64(l.burst) {
				delete(l.buckets, k) // full again: a new bucket is the same
			}
		}
	}
	b := rate.NewLimiter(l.limit, l.burst)
	l.buckets[key] = b
	return b.ReserveN(now, 1)
}
