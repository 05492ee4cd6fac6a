package bus

import (
	"errors"
	"fmt"
	"time"
)

// ErrRetryAfter is matched by every [*RetryAfterError].
var ErrRetryAfter = errors.New("bus: returned for a later attempt")

// RetryAfterError asks the bus to hand a message back to the transport,
// to be delivered again after Delay, instead of counting a failure. Build
// it with [RetryAfter]. Its text is the cause's; errors.Unwrap returns
// the cause.
type RetryAfterError struct {
	Err   error
	Delay time.Duration
}

// Error returns the cause's text and the delay.
func (e *RetryAfterError) Error() string {
	return fmt.Sprintf("%v (returned to be tried again after %v)", e.Err, e.Delay)
}

// Is reports whether target is ErrRetryAfter.
func (e *RetryAfterError) Is(target error) bool { return target == ErrRetryAfter }

// Unwrap returns the cause.
func (e *RetryAfterError) Unwrap() error { return e.Err }

// RetryAfter marks err as a reason to try the message again later rather
// than a failure of it: the handler did not run, or could not have
// succeeded now whatever the message held (a circuit breaker is open, a
// concurrency limit is full, the bus stops while a rate limit waits).
// Returned by a handler, an incoming or handler middleware (also wrapped),
// it makes the bus return the message to the transport with delay
// ([Delayer.ReturnAfter], capped at the transport's MaxDelay), outside
// the retry policy:
//
//   - the retry history records no failure, and no immediate or delayed
//     round is used up;
//   - the message is returned even on its last attempt, never
//     dead-lettered for it (an error that is also permanent,
//     [IsPermanent], still dead-letters it at once);
//   - the delivery still counts as one: transports count deliveries, so
//     a message returned more times than its policy's MaxAttempts is
//     dead-lettered at its next real failure, with its history.
//
// When several handlers of a message fail, the message is returned this
// way only when every failure asks for it (after the longest delay);
// otherwise the policy decides. On a transport that cannot delay (no
// [Delayer]) the error is an ordinary failure, since returning at once
// would only spin. A delay of zero or less returns the message at once.
// RetryAfter(nil, d) is nil.
func RetryAfter(err error, delay time.Duration) error {
	if err == nil {
		return nil
	}
	return &RetryAfterError{Err: err, Delay: delay}
}

// RetryAfterDelay reports whether err, the error a message's incoming
// chain ended with, makes a bus whose transport can delay ([Delayer])
// return the message for later outside its retry policy, and after which
// delay: a [*RetryAfterError] in its chain, or, when handlers failed
// ([*HandlerDispatchRejectedError]), one in every failed handler's error
// (the longest delay). An error that is also permanent ([IsPermanent])
// is dead-lettered instead. Middleware that reports what became of a
// message (an audit) reads the bus's decision here.
func RetryAfterDelay(err error) (time.Duration, bool) { return retryAfter(err) }

// retryAfter returns the delay after which err, a failure of the
// incoming chain, asks for the message to be returned, and whether it
// does: a *RetryAfterError in its chain, or, inside a
// *HandlerDispatchRejectedError, one in every handler's failure.
func retryAfter(err error) (time.Duration, bool) {
	for err != nil {
		switch e := err.(type) {
		case *RetryAfterError:
			return e.Delay, true
		case *HandlerDispatchRejectedError:
			var longest time.Duration
			for _, f := range e.Failures {
				var ra *RetryAfterError
				if !errors.As(f.Err, &ra) {
					return 0, false
				}
				longest = max(longest, ra.Delay)
			}
			return longest, len(e.Failures) > 0
		}
		if multi, ok := err.(interface{ Unwrap() []error }); ok {
			for _, inner := range multi.Unwrap() {
				if d, ok := retryAfter(inner); ok {
					return d, true
				}
			}
			return 0, false
		}
		err = errors.Unwrap(err)
	}
	return 0, false
}
