// Package memory is the in-process transport, the default of bus.New.
//
// Transports made from one [Broker] exchange messages, so several buses in
// one process can talk to each other:
//
//	broker := memory.NewBroker()
//	orders, _ := bus.New(bus.WithEndpoint("orders"), bus.WithTransport(memory.New(memory.WithBroker(broker))), ...)
//	billing, _ := bus.New(bus.WithEndpoint("billing"), bus.WithTransport(memory.New(memory.WithBroker(broker))), ...)
//
// It is at-least-once within the process: messages wait in flight until
// deleted, a returned message comes back with its attempt count raised, a
// failed one goes to the endpoint's dead-letter queue with its failure
// ([Broker.DeadLetters]). Nothing survives the process. The implementation
// lives in package bus so that it can be bus.New's default.
package memory

import "github.com/plugbus/plugbus/bus"

// Broker is an in-process broker shared by transports.
type Broker = bus.MemoryBroker

// Transport is the in-memory transport.
type Transport = bus.MemoryTransport

// NewBroker returns an empty broker.
func NewBroker() *Broker { return bus.NewMemoryBroker() }

// Option configures a memory transport.
type Option func(*options)

type options struct{ broker *Broker }

// WithBroker puts the transport on broker. The default is a broker of its own.
func WithBroker(b *Broker) Option { return func(o *options) { o.broker = b } }

// New returns a memory transport.
func New(opts ...Option) *Transport {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if o.broker == nil {
		o.broker = NewBroker()
	}
	return bus.NewMemoryTransport(o.broker)
}
