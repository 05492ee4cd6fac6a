package bus

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"strings"
	"sync"
)

// handler is a typed handler adapted onto one untyped shape.
type handler struct {
	name     string
	msgName  string
	typeName string       // T as written, for errors
	goType   reflect.Type // T, or what it points to: the type the body is decoded into
	decode   func(s Serializer, body []byte) (any, error)
	invoke   func(ctx context.Context, msg any, attrs Attributes) error
	// asReceived turns what decode returned into what the handler
	// receives, for Handling.Message; nil when they are the same.
	asReceived func(any) Message
	retry      *RetryPolicy // HandlerRetry; nil: the message's or the bus's
	plugins    []Plugin     // HandlerMiddleware, in order

	// runs pools the handler stage's runs of this handler when it has
	// middleware of its own (its chain is the bus's followed by its own);
	// nil: the bus's pool.
	runs *sync.Pool
	// layers is how many middleware its handler stage has (the bus's and
	// its own): with none, runHandler calls invoke directly.
	layers int
}

// HandlerOption configures one handler.
type HandlerOption func(*handler)

// HandlerName names the handler in logs, errors and traces. The default is
// the handler function's name.
func HandlerName(name string) HandlerOption {
	return func(h *handler) { h.name = name }
}

// WithHandler registers fn as a handler of messages of type T, under the
// name T's MessageName returns. Several handlers may handle one message
// name: each runs in its own handler scope, and its sends are flushed only
// when it succeeds. They must all take the same Go type (T or *T): [New]
// refuses two types with one name, since the body would be decoded into
// both and the fields one type lacks silently left zero.
//
// A handler returning an error fails the message, which is returned for
// retry and dead-lettered after the maximum attempts. msg is decoded from
// the body by the bus's serializer; attrs are the message's attributes.
func WithHandler[T Message](fn func(ctx context.Context, msg T, attrs Attributes) error, opts ...HandlerOption) Option {
	return func(c *config) error {
		rt := reflect.TypeFor[T]()
		if fn == nil {
			return fmt.Errorf("bus: WithHandler[%s]: nil handler function; pass the function that handles %[1]s", rt)
		}
		if rt.Kind() == reflect.Interface {
			return fmt.Errorf("bus: WithHandler[%s]: %[1]s is an interface type, which the bus cannot decode into; register one handler per concrete message type", rt)
		}
		h := &handler{typeName: rt.String(), goType: rt, name: funcName(fn)}
		var zero Message
		if rt.Kind() == reflect.Pointer {
			elem := rt.Elem()
			h.goType = elem
			zero = reflect.New(elem).Interface().(T)
			h.decode = func(s Serializer, body []byte) (any, error) {
				v := reflect.New(elem).Interface().(T)
				return v, s.Unmarshal(body, v)
			}
			h.invoke = func(ctx context.Context, msg any, attrs Attributes) error {
				return fn(ctx, msg.(T), attrs)
			}
		} else {
			var z T
			zero = z
			// A value-typed message is decoded into a *T (the decoder needs
			// a pointer, so it is on the heap anyway) and kept as that
			// pointer: boxing the value again would copy it to the heap a
			// second time. The handler gets the value.
			h.decode = func(s Serializer, body []byte) (any, error) {
				p := new(T)
				err := s.Unmarshal(body, p)
				return p, err
			}
			h.invoke = func(ctx context.Context, msg any, attrs Attributes) error {
				return fn(ctx, *msg.(*T), attrs)
			}
			h.asReceived = func(m any) Message { return *m.(*T) }
		}
		name, err := messageName(zero)
		if err != nil {
			return fmt.Errorf("bus: WithHandler[%s]: %w", rt, err)
		}
		h.msgName = name
		for _, o := range opts {
			if o != nil {
				o(h)
			}
		}
		if h.name == "" {
			return fmt.Errorf("bus: WithHandler[%s]: bus.HandlerName(\"\"): give the handler a name (names identify handlers in errors, traces and the inbox)", rt)
		}
		c.handlers = append(c.handlers, h)
		return nil
	}
}

// messageName returns m's wire name, refusing an empty one and turning a
// panic of MessageName into an error.
func messageName(m Message) (name string, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%T.MessageName() panicked on %#v (%v); MessageName must return a constant name, even on the zero value", m, m, p)
		}
	}()
	name = m.MessageName()
	if name == "" {
		return "", fmt.Errorf("%T.MessageName() returned an empty name; return the message's stable wire name, such as \"shop.order_placed\"", m)
	}
	return name, nil
}

func funcName(fn any) string {
	f := runtime.FuncForPC(reflect.ValueOf(fn).Pointer())
	if f == nil {
		return "handler"
	}
	name := f.Name()
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		name = name[i+1:]
	}
	return name
}

// Outbound is a finished message waiting to be handed to the transport.
type Outbound struct {
	Kind     Kind
	Envelope *Envelope
	// Destination is the endpoint of a send; empty for a publish.
	Destination string
}

// Outbox receives the messages a handler sends. The default outbox buffers
// them in memory and hands them to the transport when the handler
// succeeds; a durable outbox plugin stores them in the handler's
// transaction instead (see [Handling.UseOutbox]).
type Outbox interface {
	Add(ctx context.Context, m Outbound) error
}

// handlerScope is the outbox and identity of one handler invocation. It is
// the handler's context as well: the parent context with the scope as the
// value of scopeKey, without a second allocation for context.WithValue.
type handlerScope struct {
	context.Context
	bus     *Bus
	attrs   Attributes
	headers Headers // the native headers the transport read
	handler string

	mu       sync.Mutex // guards the fields below
	buffered []Outbound
	outbox   Outbox
	closed   bool // the handler returned
}

type scopeKey struct{}

// String names the context as the context package's own do.
func (s *handlerScope) String() string {
	return fmt.Sprint(s.Context) + ".WithHandlerScope(" + s.handler + ")"
}

// Value returns the scope itself for scopeKey and asks the parent context
// for any other key.
func (s *handlerScope) Value(key any) any {
	if key == (scopeKey{}) {
		return s
	}
	return s.Context.Value(key)
}

// scopeFrom returns the handler scope in ctx when it belongs to b.
func scopeFrom(ctx context.Context, b *Bus) *handlerScope {
	s, _ := ctx.Value(scopeKey{}).(*handlerScope)
	if s == nil || s.bus != b {
		return nil
	}
	return s
}

// errSendAfterHandler is returned by a send from a goroutine that outlived its handler.
var errSendAfterHandler = errors.New("bus: send from a handler that already returned; send before returning or use a context that is not the handler's")

func (s *handlerScope) add(ctx context.Context, m Outbound) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errSendAfterHandler
	}
	if o := s.outbox; o != nil {
		s.mu.Unlock()
		return o.Add(ctx, m)
	}
	s.buffered = append(s.buffered, m)
	s.mu.Unlock()
	return nil
}

// setOutbox makes o the scope's outbox, moving into it what the handler
// already sent, and returns the function that puts the previous outbox
// back.
func (s *handlerScope) setOutbox(ctx context.Context, o Outbox) (func(), error) {
	s.mu.Lock()
	prev := s.outbox
	s.outbox = o
	moved := s.buffered
	s.buffered = nil
	s.mu.Unlock()
	restore := func() {
		s.mu.Lock()
		if s.outbox == o {
			s.outbox = prev
		}
		s.mu.Unlock()
	}
	for _, m := range moved {
		if err := o.Add(ctx, m); err != nil {
			return restore, err
		}
	}
	return restore, nil
}

// close ends the scope and returns what was buffered.
func (s *handlerScope) close() []Outbound {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	buffered := s.buffered
	s.buffered = nil
	return buffered
}

// MessageContext returns the bus and the attributes of the message being
// handled when ctx is (or derives from) a handler's context. Plugins use it
// to act on the message in hand, for example to reply to it.
func MessageContext(ctx context.Context) (b *Bus, attrs Attributes, ok bool) {
	s, _ := ctx.Value(scopeKey{}).(*handlerScope)
	if s == nil {
		return nil, Attributes{}, false
	}
	return s.bus, s.attrs, true
}

// MessageHeader returns the native header named key of the message being
// handled, as the transport read it (an AMQP header, an SQS message
// attribute), when ctx is (or derives from) a handler's context: what a
// foreign producer put in a header reaches a handler without a middleware
// that copies it. ok is false outside a handler and for a header the
// message does not have. Read it while the handler runs.
func MessageHeader(ctx context.Context, key string) (value string, ok bool) {
	s, _ := ctx.Value(scopeKey{}).(*handlerScope)
	if s == nil {
		return "", false
	}
	value, ok = s.headers[key]
	return value, ok
}
