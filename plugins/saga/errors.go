package saga

import (
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"
)

// ErrNotFound is matched by [*NotFoundError].
var ErrNotFound = errors.New("saga: no instance")

// NotFoundError is the permanent failure of a message declared with
// WhenMissing(DeadLetter) for which no instance runs.
type NotFoundError struct {
	Saga, Message, Key string
}

// Error implements error.
func (e *NotFoundError) Error() string {
	return fmt.Sprintf("saga %s: no running instance %q for message %s", e.Saga, e.Key, e.Message)
}

// Is reports whether target is ErrNotFound.
func (e *NotFoundError) Is(target error) bool { return target == ErrNotFound }

// ErrCorrelation is matched by [*CorrelationError].
var ErrCorrelation = errors.New("saga: no correlation value")

// CorrelationError is the permanent failure of a message whose
// correlation value is empty, longer than [MaxKeyLength], or holds a NUL
// byte or invalid UTF-8 (which PostgreSQL's TEXT refuses): it cannot be
// matched to an instance.
type CorrelationError struct {
	Saga, Message string
	Attribute     string // the attribute of ByAttribute (AttrKey for a timeout); empty for By
	Value         string // the value refused; empty when there was none
	Limit         int    // the limit in bytes that Value is longer than; 0 when it is not too long
}

// Error implements error.
func (e *CorrelationError) Error() string {
	if e.Limit > 0 && len(e.Value) > e.Limit {
		return fmt.Sprintf("saga %s: the correlation value %s of message %s is %d bytes long, longer than the limit of %d bytes (saga.MaxKeyLength) that every store can index: correlate by a shorter value, such as a hash of it", e.Saga, quoteStart(e.Value), e.Message, len(e.Value), e.Limit)
	}
	if e.Value != "" {
		return fmt.Sprintf("saga %s: the correlation value %q of message %s contains a NUL byte or invalid UTF-8, which a store cannot keep", e.Saga, e.Value, e.Message)
	}
	if e.Attribute != "" {
		return fmt.Sprintf("saga %s: message %s has no attribute %q to find its instance by", e.Saga, e.Message, e.Attribute)
	}
	return fmt.Sprintf("saga %s: the correlation of message %s returned an empty value", e.Saga, e.Message)
}

// quoteStart quotes the first 32 bytes of v, cut at a rune boundary and
// followed by an ellipsis when v is longer: a value too long to quote whole.
func quoteStart(v string) string {
	const n = 32
	if len(v) <= n {
		return strconv.Quote(v)
	}
	i := n
	for i > 0 && !utf8.RuneStart(v[i]) {
		i--
	}
	return strconv.Quote(v[:i]) + "…"
}

// Is reports whether target is ErrCorrelation.
func (e *CorrelationError) Is(target error) bool { return target == ErrCorrelation }

// ErrConflict is matched by [*ConflictError].
var ErrConflict = errors.New("saga: concurrency conflict")

// ConflictError is returned when a handler lost an optimistic concurrency
// conflict more times than WithConflictRetries allows (or once, without the
// outbox on the saga's store): the message goes back to the bus's retry
// policy, which handles it again on the new state.
type ConflictError struct {
	Saga, Key string
	Attempts  int
}

// Error implements error.
func (e *ConflictError) Error() string {
	return fmt.Sprintf("saga %s: instance %q was changed concurrently %d time(s); the message is retried", e.Saga, e.Key, e.Attempts)
}

// Is reports whether target is ErrConflict.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

// StateError is the permanent failure of a message whose instance's
// stored state cannot be decoded into the saga's state type.
type StateError struct {
	Saga, Key string
	Err       error
}

// Error implements error.
func (e *StateError) Error() string {
	return fmt.Sprintf("saga %s: decoding the state of instance %q: %v", e.Saga, e.Key, e.Err)
}

// Unwrap returns the decoding error.
func (e *StateError) Unwrap() error { return e.Err }

// ErrUndeclaredTimeout is matched by [*UndeclaredTimeoutError].
var ErrUndeclaredTimeout = errors.New("saga: timeout message not declared with HandlesTimeout")

// UndeclaredTimeoutError is returned by [Context.RequestTimeout] for a
// message the saga does not declare with [HandlesTimeout]: nothing would
// handle it when it falls due (the bus would dead-letter it then, after
// the whole delay), so it is refused at the call, nothing sent. It is a
// permanent failure (bus.Permanent): returned by the handler, the
// message is dead-lettered at once with this reason.
type UndeclaredTimeoutError struct {
	Saga, Message string // the saga's name, and the name of the message given to RequestTimeout
	// DeclaredAs is how the saga declares Message otherwise ("StartedBy"
	// or "Handles"); empty when it does not declare it at all.
	DeclaredAs string
}

// Error implements error.
func (e *UndeclaredTimeoutError) Error() string {
	if e.DeclaredAs != "" {
		return fmt.Sprintf("saga %s: RequestTimeout(%s): the message is declared with %s, not as a timeout; declare a timeout message of its own with saga.HandlesTimeout", e.Saga, e.Message, e.DeclaredAs)
	}
	return fmt.Sprintf("saga %s: RequestTimeout(%s): no handler for it: declare it with saga.HandlesTimeout before adding the saga to the bus", e.Saga, e.Message)
}

// Is reports whether target is ErrUndeclaredTimeout.
func (e *UndeclaredTimeoutError) Is(target error) bool { return target == ErrUndeclaredTimeout }
