package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
)

const (
	stateNew = iota
	stateRunning
	stateStopping
	stateClosed
)

// Bus sends, publishes and receives messages through one transport, running
// every message through its middleware pipeline. Build it with [New]; it
// is safe for concurrent use.
type Bus struct {
	name, endpoint     string
	t                  Transport
	headerValidator    HeaderValidator
	releaser           DeliveryReleaser
	lendEnvelopes      bool // the transport copies envelopes: a sent one can live in its pooled run
	countsReceives     bool // the broker dead-letters past the maximum attempts (ReceiveCounter)
	logger             *slog.Logger
	serializer         Serializer
	contentType        string
	retry              RetryPolicy
	retryFor           map[string]RetryPolicy // WithRetryFor, by message name
	maxAttempts        int                    // the most any policy delivers a message: Topology.MaxAttempts
	delayer            Delayer                // the transport, when it carries delays
	batcher            Batcher                // the transport, when it takes batches
	concurrency        int
	handlers           map[string][]*handler // by message name
	handledNames       []string              // the keys of handlers, sorted
	routes             map[string]string
	unhandled          UnhandledPolicy
	permanent          []func(error) bool // classifiers (WithPermanentErrors)
	middleware         []Middleware       // the bus's (WithMiddleware), then the handlers' own (HandlerMiddleware)
	wholeBus           int                // how many of middleware are the bus's
	needsInstanceQueue bool

	incoming *pipe[Incoming, IncomingNext]
	handling *pipe[Handling, HandlingNext]
	outgoing *pipe[Outgoing, OutgoingNext]

	incomingRuns, handlingRuns, outgoingRuns sync.Pool

	startStop sync.Mutex    // Start and Stop run one at a time
	stopping  chan struct{} // closed when Stop begins
	// admission makes Deliver's look at the state and its deliveries.Add
	// one step, so that Stop, which switches the state under it, waits
	// for every Deliver it let in.
	admission             sync.Mutex
	state                 atomic.Int32 // stateNew … stateClosed
	startedMiddleware     int          // how many middleware ran their Start hook
	stopReceiving         context.CancelFunc
	stopReceivingInstance context.CancelFunc
	instanceReceiver      sync.WaitGroup
	cancelHandlers        context.CancelFunc
	workers               sync.WaitGroup
	deliveries            sync.WaitGroup // Deliver calls running
}

// New builds a bus from options, applied once: nothing can be registered on
// a bus afterwards. Each plugin is instantiated here, in order.
func New(opts ...Option) (*Bus, error) {
	c := config{concurrency: 8, retry: DefaultRetryPolicy(), serializer: JSON{}}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	if c.name == "" {
		c.name = c.endpoint
	}
	if len(c.handlers) > 0 && c.endpoint == "" {
		return nil, errors.New("bus: a bus with handlers needs an endpoint: add bus.WithEndpoint(name)")
	}
	if c.transport == nil {
		c.transport = newMemTransport(newMemBroker())
	}
	b := &Bus{
		name: c.name, endpoint: c.endpoint, t: c.transport,
		logger:      c.logger.With(slog.String("bus", c.name)),
		serializer:  c.serializer,
		contentType: c.serializer.ContentType(),
		retry:       c.retry, retryFor: c.retryFor, concurrency: c.concurrency,
		handlers: make(map[string][]*handler),
		routes:   c.routes, unhandled: c.unhandled,
		permanent: c.permanent,
	}
	b.headerValidator, _ = c.transport.(HeaderValidator)
	b.releaser, _ = c.transport.(DeliveryReleaser)
	if ec, ok := c.transport.(EnvelopeCopier); ok {
		b.lendEnvelopes = ec.CopiesEnvelopes()
	}
	b.delayer, _ = c.transport.(Delayer)
	b.batcher, _ = c.transport.(Batcher)
	if rc, ok := c.transport.(ReceiveCounter); ok {
		b.countsReceives = rc.CountsReceives()
	}
	if err := b.registerHandlers(c.handlers); err != nil {
		return nil, err
	}
	b.maxAttempts = b.mostAttempts()
	b.stopping = make(chan struct{}) // before the plugins, which may keep Stopping()
	if err := b.instantiatePlugins(c.plugins); err != nil {
		return nil, err
	}
	if err := b.instantiateHandlerMiddleware(c.handlers); err != nil {
		return nil, err
	}
	b.incomingRuns.New = func() any { return newIncomingRun(b, b.incoming, b.endpoint) }
	b.handlingRuns.New = func() any { return newHandlingRun(b, b.handling) }
	b.outgoingRuns.New = func() any { return newOutgoingRun(b, b.outgoing) }
	return b, nil
}

// registerHandlers files each handler under its message name, refusing
// two Go types with one name and two handlers of one message with one
// name.
func (b *Bus) registerHandlers(handlers []*handler) error {
	for _, h := range handlers {
		if h.retry != nil {
			if err := h.retry.validate(); err != nil {
				return fmt.Errorf("bus: HandlerRetry of handler %s of %s: %w", h.name, h.msgName, err)
			}
		}
		for _, other := range b.handlers[h.msgName] {
			if other.goType != h.goType {
				return fmt.Errorf("bus: message name %q is the MessageName of both %s and %s: one name must decode into one Go type (the body would be decoded into both, and the fields one type lacks left zero); give one type its own MessageName, or handle both with the same type", h.msgName, other.typeName, h.typeName)
			}
			if other.name == h.name {
				return fmt.Errorf("bus: two handlers of %s are named %q: give each its own name with bus.HandlerName (names identify handlers in errors, traces and the inbox)", h.msgName, h.name)
			}
		}
		b.handlers[h.msgName] = append(b.handlers[h.msgName], h)
	}
	b.handledNames = slices.Sorted(maps.Keys(b.handlers))
	return nil
}

// instantiatePlugins instantiates each plugin, in order, and composes the
// three stage chains from the middleware they return.
func (b *Bus) instantiatePlugins(plugins []Plugin) error {
	b.incoming = &pipe[Incoming, IncomingNext]{stage: StageIncoming}
	b.handling = &pipe[Handling, HandlingNext]{stage: StageHandler}
	b.outgoing = &pipe[Outgoing, OutgoingNext]{stage: StageOutgoing}
	info := PluginInfo{Bus: b, Name: b.name, Endpoint: b.endpoint, Logger: b.logger, Transport: b.t, Handles: slices.Clone(b.handledNames)}
	for i, p := range plugins {
		m, err := p.Instantiate(info)
		if err != nil {
			return fmt.Errorf("bus: plugin %d (%T): %w", i, p, err)
		}
		if m.Name == "" {
			return fmt.Errorf("bus: plugin %d (%T) returned a middleware without a name", i, p)
		}
		if err := checkJoin(b.middleware, m, nil); err != nil {
			return err
		}
		b.middleware = append(b.middleware, m)
		if m.InstanceQueue {
			if _, ok := b.t.(InstanceQueuer); !ok {
				return fmt.Errorf("bus: middleware %q needs a queue of this bus instance, which the %T transport cannot give (it does not implement bus.InstanceQueuer)", m.Name, b.t)
			}
			b.needsInstanceQueue = true
		}
		if m.Incoming != nil {
			b.incoming.add(m.Name, m.Incoming, b.logger)
		}
		if m.Handling != nil {
			b.handling.add(m.Name, m.Handling, b.logger)
		}
		if m.Outgoing != nil {
			b.outgoing.add(m.Name, m.Outgoing, b.logger)
		}
	}
	b.wholeBus = len(b.middleware)
	return nil
}

// Name returns the bus's name.
func (b *Bus) Name() string { return b.name }

// HasMiddleware reports whether a middleware named name, given to
// [WithMiddleware], runs on b for every message; the middleware given to
// one handler with [HandlerMiddleware] do not count. A function that needs
// a plugin on the bus it is given (requestreply.Request) checks with it
// before it does anything.
func (b *Bus) HasMiddleware(name string) bool {
	for _, m := range b.middleware[:b.wholeBus] {
		if m.Name == name {
			return true
		}
	}
	return false
}

// Endpoint returns the bus's endpoint, empty for a send-only bus.
func (b *Bus) Endpoint() string { return b.endpoint }

// Transport returns the bus's transport.
func (b *Bus) Transport() Transport { return b.t }

// Stopping returns a channel closed when Stop begins, before in-flight
// messages drain: code waiting on the bus (a request waiting for its reply)
// can give up at once instead of holding up Stop.
func (b *Bus) Stopping() <-chan struct{} { return b.stopping }

// Running reports whether the bus was started and not yet stopped.
func (b *Bus) Running() bool { return b.state.Load() == stateRunning }

// Serializer returns the bus's body serializer.
func (b *Bus) Serializer() Serializer { return b.serializer }
