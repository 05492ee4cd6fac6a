package bus

import (
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Option configures a bus. Options are applied once, by [New].
type Option func(*config) error

type config struct {
	name        string
	endpoint    string
	transport   Transport
	handlers    []*handler
	plugins     []Plugin
	concurrency int
	logger      *slog.Logger
	serializer  Serializer
	retry       RetryPolicy
	retryFor    map[string]RetryPolicy // by message name
	routes      map[string]string
	unhandled   UnhandledPolicy
	permanent   []func(error) bool
}

// WithTransport sets the transport. The default is an in-memory transport
// on a broker of its own (see transports/memory to share one).
func WithTransport(t Transport) Option {
	return func(c *config) error {
		if t == nil {
			return errors.New("bus: WithTransport: nil transport")
		}
		c.transport = t
		return nil
	}
}

// WithMiddleware adds plugins, in order: within each stage the first one
// registered is the outermost layer. Each plugin is instantiated once, by New.
// For middleware of one handler alone, see [HandlerMiddleware].
func WithMiddleware(plugins ...Plugin) Option {
	return func(c *config) error {
		for i, p := range plugins {
			if p == nil {
				return fmt.Errorf("bus: WithMiddleware: plugin %d is nil", i)
			}
		}
		c.plugins = append(c.plugins, plugins...)
		return nil
	}
}

// WithOptions bundles options into one, applied in order: a plugin that
// registers several handlers and middleware (a saga) hands them to [New]
// as one option. A nil option is skipped.
func WithOptions(opts ...Option) Option {
	return func(c *config) error {
		for _, o := range opts {
			if o == nil {
				continue
			}
			if err := o(c); err != nil {
				return err
			}
		}
		return nil
	}
}

// WithEndpoint names the endpoint: the queue this bus receives from. A bus
// with handlers needs one; a bus without an endpoint only sends. A bus has
// one endpoint: New refuses a second WithEndpoint of another name with an
// [*EndpointConflictError] (the same name twice is harmless).
func WithEndpoint(name string) Option {
	return func(c *config) error {
		if name == "" {
			return errors.New("bus: WithEndpoint: empty name")
		}
		if c.endpoint != "" && c.endpoint != name {
			return &EndpointConflictError{First: c.endpoint, Second: name}
		}
		c.endpoint = name
		return nil
	}
}

// WithName names the bus in logs and for plugins. The default is the endpoint.
func WithName(name string) Option {
	return func(c *config) error { c.name = name; return nil }
}

// WithConcurrency sets how many messages are processed at once. The default is 8.
func WithConcurrency(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return fmt.Errorf("bus: WithConcurrency(%d): must be at least 1", n)
		}
		c.concurrency = n
		return nil
	}
}

// WithLogger sets the logger. The default is slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return errors.New("bus: WithLogger: nil logger")
		}
		c.logger = l
		return nil
	}
}

// WithSerializer sets the body serializer. The default is [JSON].
func WithSerializer(s Serializer) Option {
	return func(c *config) error {
		if s == nil {
			return errors.New("bus: WithSerializer: nil serializer")
		}
		c.serializer = s
		return nil
	}
}

// WithMaxAttempts delivers a failing message n times in all, at once, and
// then dead-letters it: it is WithRetry(RetryPolicy{Immediate: n - 1}),
// with no delayed retries. The default is [DefaultRetryPolicy].
func WithMaxAttempts(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return fmt.Errorf("bus: WithMaxAttempts(%d): must be at least 1", n)
		}
		c.retry = RetryPolicy{Immediate: n - 1}
		return nil
	}
}

// WithRoute sends the given messages to endpoint when Send is called
// without [To]. A message has one route: New refuses a second WithRoute
// that sends it to another endpoint (the same route twice is harmless).
func WithRoute(endpoint string, msgs ...Message) Option {
	return func(c *config) error {
		if endpoint == "" {
			return errors.New("bus: WithRoute: empty endpoint; name the endpoint the messages go to")
		}
		if len(msgs) == 0 {
			return fmt.Errorf("bus: WithRoute(%q): no messages; pass the messages that go to %[1]q", endpoint)
		}
		if c.routes == nil {
			c.routes = make(map[string]string)
		}
		for i, m := range msgs {
			if m == nil {
				return fmt.Errorf("bus: WithRoute(%q): message %d is nil; pass a value of the message type, such as OrderPlaced{}", endpoint, i)
			}
			name, err := messageName(m)
			if err != nil {
				return fmt.Errorf("bus: WithRoute(%q): %w", endpoint, err)
			}
			if prev, ok := c.routes[name]; ok && prev != endpoint {
				return fmt.Errorf("bus: WithRoute: message %s is routed to both %q and %q; keep one route per message, and send elsewhere with bus.To", name, prev, endpoint)
			}
			c.routes[name] = endpoint
		}
		return nil
	}
}

// UnhandledPolicy says what a bus does with a received message whose name
// none of its handlers handles, once its incoming middleware passed it on
// (see [WithUnhandled]).
type UnhandledPolicy uint8

const (
	// UnhandledDeadLetter dead-letters the message at once, without
	// retries, with a [*NoHandlerError] as the reason, and logs it at
	// WARN. It is the default: such a message is never lost silently.
	UnhandledDeadLetter UnhandledPolicy = iota
	// UnhandledDiscard deletes the message and logs it at INFO.
	// [Incoming.Unhandled] reports it to incoming middleware (the otel
	// plugin counts it).
	UnhandledDiscard
)

// String implements fmt.Stringer.
func (p UnhandledPolicy) String() string {
	switch p {
	case UnhandledDeadLetter:
		return "dead-letter"
	case UnhandledDiscard:
		return "discard"
	}
	return fmt.Sprintf("UnhandledPolicy(%d)", uint8(p))
}

// WithUnhandled sets what the bus does with a received message whose name
// none of its handlers handles and that no incoming middleware handled
// (request/reply resolves its replies in its incoming stage, so they never
// count): [UnhandledDeadLetter] (the default) or [UnhandledDiscard], for
// an endpoint that is sent more than it handles on purpose.
func WithUnhandled(p UnhandledPolicy) Option {
	return func(c *config) error {
		if p > UnhandledDiscard {
			return fmt.Errorf("bus: WithUnhandled(%d): unknown policy; use bus.UnhandledDeadLetter or bus.UnhandledDiscard", uint8(p))
		}
		c.unhandled = p
		return nil
	}
}

// SendOption configures one Send or Publish.
type SendOption func(*sendConfig)

type sendConfig struct {
	to, correlationID, messageID string
	values, sticky               map[string]string
	immediate                    bool
	delay                        time.Duration // Delay's; used when at is zero
	at                           time.Time     // At's
}

// To sends the message to endpoint, overriding routes.
func To(endpoint string) SendOption { return func(s *sendConfig) { s.to = endpoint } }

// WithCorrelationID sets the correlation id instead of inheriting or generating one.
func WithCorrelationID(id string) SendOption {
	return func(s *sendConfig) { s.correlationID = id }
}

// WithMessageID sets the message id instead of generating one, for
// producers that must stay idempotent across their own retries.
func WithMessageID(id string) SendOption { return func(s *sendConfig) { s.messageID = id } }

// Immediately hands the message to the transport when Send returns, even
// inside a handler, instead of buffering it until the handler succeeds. It
// still inherits the handled message's correlation id and sticky
// attributes. Use it for what must go out now whatever the handler's fate:
// a request the handler waits for, a progress notice. It is not rolled back
// when the handler fails, and it goes past an outbox put in the context
// with [ContextWithOutbox] too.
func Immediately() SendOption { return func(s *sendConfig) { s.immediate = true } }

// WithAttribute sets a one-hop attribute.
func WithAttribute(key, value string) SendOption {
	return func(s *sendConfig) {
		if s.values == nil {
			s.values = make(map[string]string, 2)
		}
		s.values[key] = value
	}
}

// WithStickyAttribute sets a sticky attribute: it is copied onto every
// message sent while this one is handled, and so on down the conversation.
func WithStickyAttribute(key, value string) SendOption {
	return func(s *sendConfig) {
		if s.sticky == nil {
			s.sticky = make(map[string]string, 2)
		}
		s.sticky[key] = value
	}
}

// Delay asks for the message to be delivered no earlier than d after the
// call to Send or Publish. Inside a handler the delay counts from the call,
// not from when the handler's messages are flushed: the due time is fixed
// when Send is called, and a handler that ran long delivers it sooner
// after the flush. A zero or negative d means now. The transport carries
// the delay ([Delayer]); a delay beyond its [Delayer.MaxDelay] is refused
// at Send with a [*DelayTooLongError]. A later Delay or At replaces it.
// docs/scheduling.md tells where each transport keeps it.
func Delay(d time.Duration) SendOption {
	return func(s *sendConfig) { s.delay, s.at = d, time.Time{} }
}

// At asks for the message to be delivered no earlier than t. A t that has
// passed (or the zero time) means now; one beyond the transport's
// [Delayer.MaxDelay] from now is refused at Send with a
// [*DelayTooLongError]. A later Delay or At replaces it.
func At(t time.Time) SendOption {
	return func(s *sendConfig) { s.at, s.delay = t, 0 }
}
