// Package breaker puts a circuit breaker (github.com/sony/gobreaker/v2)
// around handlers: after enough failures in a row the breaker opens, and
// while it is open the handler does not run; its messages are returned to
// the transport with a delay ([bus.RetryAfter]) instead of failing, so
// that an outage of the handler's dependency fills no dead-letter queue
// and uses up no message's retries. After the breaker's Timeout it lets a
// few messages through (half-open): their success closes it, a failure
// opens it again.
//
//	bus.WithMiddleware(breaker.New()),                                     // a breaker per handler
//	bus.WithHandler(chargeCard, bus.HandlerMiddleware(breaker.New(breaker.WithSettings(gobreaker.Settings{
//		Timeout:     30 * time.Second,
//		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= 3 },
//	})))),
//
// At the bus level each handler gets a breaker of its own (a handler
// usually stands for one dependency), two handlers of different messages
// that share a name included; given to one handler, that handler
// has one. A permanent failure ([bus.IsPermanent]) counts as a success:
// it says the message is wrong, not the dependency. A handler run
// interrupted by Stop, or returned by a middleware inside with
// bus.RetryAfter, counts as neither.
//
// A returned message comes back after the retry delay ([WithRetryDelay],
// by default the breaker's Timeout), drawn with jitter between half and
// all of it, so that the messages held back do not all arrive at once
// when the breaker half-opens. Each return counts as a delivery of the
// message (see bus.RetryAfter). On a transport that cannot delay
// messages (no bus.Delayer) a return is an ordinary failure.
//
// The breaker's state lives in the process that runs it: it is meant to
// run in process. Out of process, its delayed return would not cross the
// plugin boundary (the bus would see an ordinary failure).
package breaker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/sony/gobreaker/v2"
)

// ErrOpen is matched by every [*OpenError].
var ErrOpen = errors.New("breaker: circuit open")

// OpenError is the cause of a message returned because its handler's
// breaker was open (or half-open and already trying as many messages as
// it allows).
type OpenError struct {
	Handler, Message string
	// State is the breaker's state: gobreaker.StateOpen or StateHalfOpen.
	State gobreaker.State
	// Err is gobreaker.ErrOpenState or gobreaker.ErrTooManyRequests.
	Err error
}

// Error says which handler's breaker held the message back.
func (e *OpenError) Error() string {
	return fmt.Sprintf("breaker: circuit of handler %s is %s; message %s held back: %v", e.Handler, e.State, e.Message, e.Err)
}

// Is reports whether target is ErrOpen.
func (e *OpenError) Is(target error) bool { return target == ErrOpen }

// Unwrap returns gobreaker's error.
func (e *OpenError) Unwrap() error { return e.Err }

// Option configures [New].
type Option func(*config)

type config struct {
	settings   gobreaker.Settings
	retryDelay time.Duration
}

// WithSettings sets the breaker's settings (see gobreaker.Settings; zero
// fields keep gobreaker's defaults: open after more than 5 failures in a
// row, half-open after 60 s, 1 message through while half-open). Name is
// set to the handler's name. IsSuccessful and IsExcluded, when set, are
// asked after the package's own rules (permanent failures succeed,
// interrupted runs are excluded). OnStateChange is called after the
// package logs the change.
func WithSettings(s gobreaker.Settings) Option { return func(c *config) { c.settings = s } }

// WithRetryDelay sets how long a message held back waits before it is
// delivered again (with jitter, between d/2 and d): at least 1 ms. The
// default is the breaker's Timeout.
func WithRetryDelay(d time.Duration) Option { return func(c *config) { c.retryDelay = d } }

type breakers struct {
	config
	logger *slog.Logger
	one    *gobreaker.TwoStepCircuitBreaker[struct{}] // given to one handler
	each   sync.Map                                   // handler name → *gobreaker.TwoStepCircuitBreaker[struct{}], at the bus level
}

// New returns a plugin with a circuit breaker per handler.
func New(opts ...Option) bus.Plugin {
	return bus.PluginFunc(func(info bus.PluginInfo) (bus.Middleware, error) {
		b := &breakers{logger: info.Logger}
		for _, o := range opts {
			o(&b.config)
		}
		if b.logger == nil {
			b.logger = slog.Default()
		}
		if b.settings.Timeout <= 0 {
			b.settings.Timeout = 60 * time.Second // gobreaker's default, needed for the retry delay
		}
		if b.retryDelay < 0 {
			return bus.Middleware{}, fmt.Errorf("breaker.WithRetryDelay(%v): must not be negative", b.retryDelay)
		}
		if b.retryDelay > 0 && b.retryDelay < time.Millisecond {
			return bus.Middleware{}, fmt.Errorf("breaker.WithRetryDelay(%v): at least 1ms, or a message held back comes straight back while the breaker is open", b.retryDelay)
		}
		if b.retryDelay == 0 {
			b.retryDelay = b.settings.Timeout
		}
		if info.Handler != "" {
			b.one = b.newBreaker(info.Handler)
		}
		return bus.Middleware{Name: "breaker", Handling: b.handle}, nil
	})
}

func (b *breakers) newBreaker(handler string) *gobreaker.TwoStepCircuitBreaker[struct{}] {
	s := b.settings
	s.Name = handler
	isSuccessful, isExcluded, onStateChange := s.IsSuccessful, s.IsExcluded, s.OnStateChange
	s.IsSuccessful = func(err error) bool {
		if err == nil || bus.IsPermanent(err) {
			return true
		}
		return isSuccessful != nil && isSuccessful(err)
	}
	s.IsExcluded = func(err error) bool {
		if errors.Is(err, context.Canceled) || errors.Is(err, bus.ErrRetryAfter) {
			return true
		}
		return isExcluded != nil && isExcluded(err)
	}
	s.OnStateChange = func(name string, from, to gobreaker.State) {
		level := slog.LevelInfo
		if to == gobreaker.StateOpen {
			level = slog.LevelWarn
		}
		b.logger.Log(context.Background(), level, "circuit breaker "+to.String(), slog.String("handler", name), slog.String("from", from.String()))
		if onStateChange != nil {
			onStateChange(name, from, to)
		}
	}
	return gobreaker.NewTwoStepCircuitBreaker[struct{}](s)
}

type breakerKey struct{ message, handler string }

// breaker returns the breaker of handler h, made on first use.
func (b *breakers) breaker(h *bus.Handling) *gobreaker.TwoStepCircuitBreaker[struct{}] {
	if b.one != nil {
		return b.one
	}
	key := breakerKey{h.MessageName(), h.HandlerName()} // names are unique per message only
	if cb, ok := b.each.Load(key); ok {
		return cb.(*gobreaker.TwoStepCircuitBreaker[struct{}])
	}
	cb, _ := b.each.LoadOrStore(key, b.newBreaker(key.handler))
	return cb.(*gobreaker.TwoStepCircuitBreaker[struct{}])
}

func (b *breakers) handle(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) (err error) {
	cb := b.breaker(h)
	done, err := cb.Allow()
	if err != nil {
		delay := b.retryDelay/2 + rand.N(b.retryDelay/2+1)
		return bus.RetryAfter(&OpenError{Handler: h.HandlerName(), Message: h.MessageName(), State: cb.State(), Err: err}, delay)
	}
	defer func() {
		if p := recover(); p != nil {
			done(fmt.Errorf("panic: %v", p))
			panic(p)
		}
		done(err)
	}()
	return next.Call(ctx)
}
