package saga

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"time"

	"github.com/plugbus/plugbus/bus"
)

// Context is what a saga handler receives: the instance's state, which it
// changes in place, and the means to send, request timeouts and complete.
// It is a context.Context (the handler's), so it can be passed to any
// function taking one, bus.Send included.
type Context[S any] struct {
	context.Context
	// State is the instance's state: zero for the message that creates
	// the instance, what the last handler left otherwise. It is saved when
	// the handler returns nil.
	State *S

	saga       string
	key        string
	instanceID string
	attrs      bus.Attributes
	completed  bool
	fx         effects
	tx         *sql.Tx
	logger     *slog.Logger
	// of is the saga, which says how it declares a message name
	// (Saga.route).
	of *Saga[S]
}

// ID returns the instance's correlation value.
func (c *Context[S]) ID() string { return c.key }

// InstanceID returns the instance's unique id: a new instance with the
// same correlation value, after one completed, has another.
func (c *Context[S]) InstanceID() string { return c.instanceID }

// Attributes returns the attributes of the message being handled.
func (c *Context[S]) Attributes() bus.Attributes { return c.attrs }

// Now returns the current time: the clock of sagatest's harness in tests.
func (c *Context[S]) Now() time.Time { return c.fx.now() }

// Tx returns the database transaction in which the state is saved (the
// outbox's, when the bus has it), for the handler's own writes; nil under
// sagatest.
func (c *Context[S]) Tx() *sql.Tx { return c.tx }

// Logger returns a logger naming the saga and the instance.
func (c *Context[S]) Logger() *slog.Logger { return c.logger }

// Send sends msg as the handler: it goes out when the handler's
// transaction commits (with the outbox, stored in it).
func (c *Context[S]) Send(msg bus.Message, opts ...bus.SendOption) error {
	return c.fx.emit(c, bus.KindSend, msg, opts)
}

// Publish publishes msg as the handler, like [Context.Send].
func (c *Context[S]) Publish(msg bus.Message, opts ...bus.SendOption) error {
	return c.fx.emit(c, bus.KindPublish, msg, opts)
}

// RequestTimeout asks for msg to be delivered to this instance after d,
// to the handler declared with [HandlesTimeout] for its type. It is sent
// like the handler's other messages (so not at all if the handler fails)
// to the saga's own endpoint, and it is dropped on arrival when the
// instance completed in the meantime. A message the saga does not declare
// with HandlesTimeout is refused, nothing sent, with a permanent
// [*UndeclaredTimeoutError].
func (c *Context[S]) RequestTimeout(d time.Duration, msg bus.Message) error {
	if d < 0 {
		return fmt.Errorf("saga %s: RequestTimeout(%s): negative delay", c.saga, d)
	}
	// A nil message (or one whose MessageName panics) is left to the bus,
	// which refuses it.
	if name, err := messageName(msg); err == nil {
		if r := c.of.route(name); r == nil || !r.timeout {
			e := &UndeclaredTimeoutError{Saga: c.saga, Message: name}
			switch {
			case r != nil && r.starts:
				e.DeclaredAs = "StartedBy"
			case r != nil:
				e.DeclaredAs = "Handles"
			}
			return bus.Permanent(e)
		}
	}
	return c.fx.timeout(c, d, msg, map[string]string{AttrSaga: c.saga, AttrKey: c.key, AttrInstance: c.instanceID})
}

// Complete ends the instance when the handler returns nil: it is deleted,
// or kept for the retention of [WithRetention]. Timeouts it requested are
// dropped when they arrive.
func (c *Context[S]) Complete() { c.completed = true }

// Completed reports whether [Context.Complete] was called.
func (c *Context[S]) Completed() bool { return c.completed }

// effects is where a Context's sends go: the bus, or the simulator.
type effects interface {
	emit(ctx context.Context, kind bus.Kind, msg bus.Message, opts []bus.SendOption) error
	timeout(ctx context.Context, d time.Duration, msg bus.Message, attrs map[string]string) error
	now() time.Time
}

// busEffects sends through the bus handling the message.
type busEffects struct{ b *bus.Bus }

func (e busEffects) emit(ctx context.Context, kind bus.Kind, msg bus.Message, opts []bus.SendOption) error {
	if kind == bus.KindPublish {
		return e.b.Publish(ctx, msg, opts...)
	}
	return e.b.Send(ctx, msg, opts...)
}

func (e busEffects) timeout(ctx context.Context, d time.Duration, msg bus.Message, attrs map[string]string) error {
	delay, err := delayOption(d)
	if err != nil {
		return err
	}
	opts := make([]bus.SendOption, 0, 2+len(attrs))
	opts = append(opts, bus.To(e.b.Endpoint()), delay)
	for k, v := range attrs {
		opts = append(opts, bus.WithAttribute(k, v))
	}
	return e.b.Send(ctx, msg, opts...)
}

func (busEffects) now() time.Time { return time.Now() }
