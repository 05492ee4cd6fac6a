package bus

import (
	"errors"
	"fmt"
	"reflect"
)

// The configurations New refuses because two of their parts contradict
// each other: a middleware that runs once given twice, two endpoints, two
// sources of a handler's transaction.

var (
	// ErrDuplicateMiddleware is matched by [*DuplicateMiddlewareError].
	ErrDuplicateMiddleware = errors.New("bus: middleware registered twice")
	// ErrEndpointConflict is matched by [*EndpointConflictError].
	ErrEndpointConflict = errors.New("bus: two endpoints for one bus")
	// ErrTxSourceConflict is matched by [*TxSourceConflictError].
	ErrTxSourceConflict = errors.New("bus: middleware of one handler run it in transactions of different stores")
)

// DuplicateMiddlewareError is returned by [New] for a middleware marked
// [Middleware].Unique that would run twice around a handler: given twice
// to [WithMiddleware] (or by two options that bundle it), or given to a
// handler with [HandlerMiddleware] when the bus has it already.
type DuplicateMiddlewareError struct {
	// Middleware is the middleware's name.
	Middleware string
	// Handler and Message name the handler whose own middleware repeats
	// it (HandlerMiddleware) and its message; empty when the bus's
	// middleware does.
	Handler, Message string
}

// Error implements error.
func (e *DuplicateMiddlewareError) Error() string {
	if e.Handler == "" {
		return fmt.Sprintf("bus: middleware %q is registered twice on the bus, and it runs once around a handler (a second copy breaks or doubles its work): remove the second one from bus.WithMiddleware", e.Middleware)
	}
	return fmt.Sprintf("bus: middleware %q runs twice around handler %s of %s (given to it with bus.HandlerMiddleware, and to the bus or the handler already), and it runs once around a handler: remove one", e.Middleware, e.Handler, e.Message)
}

// Is reports whether target is ErrDuplicateMiddleware.
func (e *DuplicateMiddlewareError) Is(target error) bool { return target == ErrDuplicateMiddleware }

// EndpointConflictError is returned by [New] for [WithEndpoint] given
// twice with different names. The same name twice is harmless.
type EndpointConflictError struct {
	// First and Second are the endpoints, in the order given.
	First, Second string
}

// Error implements error.
func (e *EndpointConflictError) Error() string {
	return fmt.Sprintf("bus: bus.WithEndpoint(%q) and bus.WithEndpoint(%q): a bus receives from one endpoint; keep one, and build a bus for each other endpoint", e.First, e.Second)
}

// Is reports whether target is ErrEndpointConflict.
func (e *EndpointConflictError) Is(target error) bool { return target == ErrEndpointConflict }

// TxSourceConflictError is returned by [New] when two middleware around
// one handler have different [Middleware].TxSource values: the outbox,
// inbox and saga plugins given different stores. A handler runs in one
// transaction; with two, the handler's data, its outbox rows, its inbox
// record and its saga state no longer commit together (exactly once is
// lost), and on SQLite the second transaction waits for the first.
type TxSourceConflictError struct {
	// First and Second are the middleware's names, in registration order.
	First, Second string
	// Handler and Message name the handler and its message when the
	// conflict comes from middleware given to it with [HandlerMiddleware];
	// empty when the bus's middleware conflict.
	Handler, Message string
}

// Error implements error.
func (e *TxSourceConflictError) Error() string {
	where := "on the bus"
	if e.Handler != "" {
		where = fmt.Sprintf("around handler %s of %s", e.Handler, e.Message)
	}
	return fmt.Sprintf("bus: middleware %q and %q %s run handlers in transactions of different stores, so a handler's data, the messages it sends, its inbox record and its saga state would not commit together: open the database once and pass that one *store.Store to outbox.New, inbox.New and saga.New (the same database opened twice is two stores)", e.First, e.Second, where)
}

// Is reports whether target is ErrTxSourceConflict.
func (e *TxSourceConflictError) Is(target error) bool { return target == ErrTxSourceConflict }

// checkJoin returns the error of adding m to the middleware around a
// handler (of the whole bus when handler is nil): a second Unique of its
// name, or a TxSource other than theirs.
//
// Around one handler (h not nil), only middleware with a handler stage
// run it in a transaction: a bus's middleware without one (a saga's,
// whose transaction holds the saga's own handlers only, which no
// HandlerMiddleware reaches) is no other source for h. On the bus, it is
// compared with the others: the bus's outbox and inbox run around the
// saga's handlers.
func checkJoin(around []Middleware, m Middleware, h *handler) error {
	if m.TxSource != nil && !reflect.TypeOf(m.TxSource).Comparable() {
		return fmt.Errorf("bus: middleware %q: its TxSource, a %T, is not comparable; set a pointer", m.Name, m.TxSource)
	}
	var handlerName, msgName string
	if h != nil {
		handlerName, msgName = h.name, h.msgName
	}
	for _, o := range around {
		if o.Name == m.Name && (o.Unique || m.Unique) {
			return &DuplicateMiddlewareError{Middleware: m.Name, Handler: handlerName, Message: msgName}
		}
		if h != nil && (o.Handling == nil || m.Handling == nil) {
			continue // one of them runs no transaction around h
		}
		if o.TxSource != nil && m.TxSource != nil && o.TxSource != m.TxSource {
			return &TxSourceConflictError{First: o.Name, Second: m.Name, Handler: handlerName, Message: msgName}
		}
	}
	return nil
}
