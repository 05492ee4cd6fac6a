package bus

import (
	"context"
	"errors"
	"log/slog"
)

// ErrPermanent is matched by every error that marks a permanent failure:
// one no retry can fix, so that the message goes to the dead-letter queue
// at once, on its first failed attempt. [Permanent] marks an error so; an
// error type of your own may match it too, with
// Is(target error) bool { return target == bus.ErrPermanent }.
var ErrPermanent = errors.New("bus: permanent failure")

// PermanentError marks its cause as a permanent failure: the message is
// dead-lettered at once instead of being retried. Build it with
// [Permanent]. Its text is the cause's text; errors.Unwrap returns the
// cause, and errors.Is(err, [ErrPermanent]) holds for it and for any error
// wrapping it.
type PermanentError struct {
	Err error
}

// Error returns the cause's text.
func (e *PermanentError) Error() string { return e.Err.Error() }

// Is reports whether target is ErrPermanent.
func (e *PermanentError) Is(target error) bool { return target == ErrPermanent }

// Unwrap returns the cause.
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent marks err as a permanent failure (a validation error, a
// message that refers to something that does not exist): returned by a
// handler, by an incoming or handler middleware (also wrapped, or inside
// a [*HandlerDispatchRejectedError]), or by an out-of-process plugin, it
// sends the message to the dead-letter queue at once, without retries,
// with a reason that says the failure was permanent. Permanent(nil) is
// nil.
//
//	if order.Total < 0 {
//		return bus.Permanent(fmt.Errorf("order %s: negative total", order.ID))
//	}
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// IsPermanent reports whether err is a permanent failure, so that the
// message is dead-lettered at once rather than retried: an error marked
// with [Permanent] (or matching [ErrPermanent]) anywhere in err's chain,
// including a handler's error inside a [*HandlerDispatchRejectedError]; or
// an error of the bus itself, possibly wrapped by middleware, saying the
// message can never be processed: it cannot be decoded ([*DecodeError]),
// or no handler handles its name ([*NoHandlerError]). A *DecodeError or
// *NoHandlerError that a handler returned is a failure of that handler,
// retried like any other unless marked.
//
// The bus also treats as permanent what its classifiers
// ([WithPermanentErrors]) mark; IsPermanent, which knows no bus, does not
// ask them, but [Bus.Deliver] returns such an error marked with
// Permanent.
func IsPermanent(err error) bool { return permanentCause(err) != nil }

// WithPermanentErrors adds a classifier: an error for which classify
// returns true is a permanent failure, and the message is dead-lettered at
// once (see [Permanent]). classify gets the error the incoming chain
// returned, with its whole chain (errors.As finds a handler's error inside
// a [*HandlerDispatchRejectedError]); it runs only for failed messages,
// and not for an attempt that [Bus.Stop] interrupted. With several
// classifiers, an error is permanent when any of them says so.
//
//	bus.WithPermanentErrors(func(err error) bool {
//		var invalid *ValidationError
//		return errors.As(err, &invalid)
//	})
func WithPermanentErrors(classify func(err error) bool) Option {
	return func(c *config) error {
		if classify == nil {
			return errors.New("bus: WithPermanentErrors: nil classifier; pass a func(error) bool")
		}
		c.permanent = append(c.permanent, classify)
		return nil
	}
}

// permanentReason is added to the reason of a message dead-lettered for a
// permanent failure.
const permanentReason = " (permanent failure: dead-lettered at once, not retried)"

// permanentCause returns what makes err, a failure of the bus's incoming
// chain, permanent, or nil: err itself when a classifier of the bus marks
// it.
func (b *Bus) permanentCause(ctx context.Context, err error) error {
	if cause := permanentCause(err); cause != nil {
		return cause
	}
	if b.classifiedPermanent(ctx, err) {
		return err
	}
	return nil
}

// classifiedPermanent reports whether a classifier of the bus marks err
// permanent. ctx is the attempt's: the classifiers are not asked about an
// attempt whose context ended (Stop interrupted it).
func (b *Bus) classifiedPermanent(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	for i, classify := range b.permanent {
		if b.classifySafely(ctx, i, classify, err) {
			return true
		}
	}
	return false
}

// classifySafely runs classifier i on err; a classifier that panics
// marks nothing, and is reported at error level.
func (b *Bus) classifySafely(ctx context.Context, i int, classify func(error) bool, err error) (permanent bool) {
	defer func() {
		if p := recover(); p != nil {
			b.logger.ErrorContext(ctx, "a permanent-error classifier panicked; the error counts as transient", slog.Int("classifier", i), slog.Any("panic", p), slog.Any("error", err))
			permanent = false
		}
	}()
	return classify(err)
}

// permanentCause returns the *DecodeError or *NoHandlerError of the bus,
// or the error matching ErrPermanent, that makes err permanent, or nil.
func permanentCause(err error) error {
	for err != nil {
		if err == ErrPermanent {
			return err
		}
		switch e := err.(type) {
		case *DecodeError, *NoHandlerError:
			return e
		case *HandlerDispatchRejectedError:
			// The handlers' own errors count only when marked.
			for _, f := range e.Failures {
				if errors.Is(f.Err, ErrPermanent) {
					return f.Err
				}
			}
			return nil
		case interface{ Is(error) bool }:
			if e.Is(ErrPermanent) {
				return err
			}
		}
		if multi, ok := err.(interface{ Unwrap() []error }); ok {
			for _, inner := range multi.Unwrap() {
				if cause := permanentCause(inner); cause != nil {
					return cause
				}
			}
			return nil
		}
		err = errors.Unwrap(err)
	}
	return nil
}
