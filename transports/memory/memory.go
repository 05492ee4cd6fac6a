// Package memory is the in-process transport: the one bus.New uses when it
// is given none, and the one tests and the demo run on.
//
// Transports made from one [Broker] exchange messages, so several buses in
// one process can talk to each other:
//
//	broker := memory.NewBroker()
//	orders, err := bus.New(bus.WithEndpoint("orders"), bus.WithTransport(memory.New(memory.WithBroker(broker))))
//	if err != nil {
//		return err
//	}
//	billing, err := bus.New(bus.WithEndpoint("billing"), bus.WithTransport(memory.New(memory.WithBroker(broker))),
//		bus.WithHandler(chargeCard)) // receives what orders publishes
//
// The package's Example runs two such buses.
//
// It is at-least-once within the process: a received message stays in
// flight until it is deleted; a returned one comes back at the tail of its
// queue with its attempt count raised; a failed one goes to the endpoint's
// dead-letter queue with its failure ([Broker.DeadLetters]). Closing a
// transport puts what is in flight back at the head of its queue, in
// order. One receiver sees its queue in order. Nothing survives the
// process.
//
// A bus.New without bus.WithTransport uses this transport on a broker of
// its own. Its implementation lives, unexported, in package bus, so that
// bus.New can use it without importing this package (which imports bus);
// this package is its one public name.
package memory

import (
	"context"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/memorybackend"
)

// Broker is an in-process broker: endpoint queues, the subscriptions of
// endpoints to the message names they handle, and dead-letter queues.
// Transports made from one broker talk to each other. Make one with
// [NewBroker].
type Broker struct {
	impl brokerImpl
}

// brokerImpl is what the implementation in package bus does for a Broker.
type brokerImpl interface {
	DeadLetters(endpoint string) []bus.DeadLetter
	Depth(endpoint string) int
	Delayed() int
}

// NewBroker returns an empty broker.
func NewBroker() *Broker {
	return &Broker{impl: memorybackend.NewBroker().(brokerImpl)}
}

// DeadLetters returns the messages dead-lettered by endpoint, oldest
// first. A bus without an endpoint keeps its dead letters under its
// instance queue's address ([Transport.InstanceAddress]).
func (b *Broker) DeadLetters(endpoint string) []bus.DeadLetter { return b.impl.DeadLetters(endpoint) }

// Depth returns how many messages wait in endpoint's queue, not counting
// those in flight.
func (b *Broker) Depth(endpoint string) int { return b.impl.Depth(endpoint) }

// Delayed returns how many messages wait for their delay
// ([Transport.ReturnAfter]) on the broker, over all endpoints.
func (b *Broker) Delayed() int { return b.impl.Delayed() }

// Option configures a transport made by [New].
type Option func(*options)

type options struct{ broker *Broker }

// WithBroker puts the transport on broker, so that it exchanges messages
// with the other transports on it. The default is a broker of its own.
func WithBroker(b *Broker) Option { return func(o *options) { o.broker = b } }

// Transport is a bus.Transport on a [Broker]. Besides the contract it
// implements bus.InstanceQueuer, bus.InstanceReceiver, bus.EnvelopeCopier,
// bus.Delayer and bus.Batcher. Make one with [New].
type Transport struct {
	impl   transportImpl
	broker *Broker
}

// transportImpl is what the implementation in package bus does for a
// Transport.
type transportImpl interface {
	bus.Transport
	bus.InstanceQueuer
	bus.InstanceReceiver
	bus.EnvelopeCopier
	bus.Delayer
	bus.DeadLetterManager
	bus.EndpointLister
	bus.DeliveryCounter
	bus.DestinationChecker
	bus.Batcher
}

// New returns a transport.
func New(opts ...Option) *Transport {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if o.broker == nil {
		o.broker = NewBroker()
	}
	return &Transport{impl: memorybackend.NewTransport(o.broker.impl).(transportImpl), broker: o.broker}
}

// Broker returns the transport's broker.
func (t *Transport) Broker() *Broker { return t.broker }

// Setup binds the transport to the endpoint's queue, creating it if need
// be, and subscribes the endpoint to the published messages it handles.
// With topo.Instance it also makes the transport's own queue
// ([Transport.InstanceAddress]).
func (t *Transport) Setup(ctx context.Context, topo bus.Topology) error {
	return t.impl.Setup(ctx, topo)
}

// Send puts a copy of env on the queue of the endpoint named to,
// creating the queue if need be: a message sent before its endpoint starts
// waits there. A send to the instance queue of a closed transport is
// dropped, as on RabbitMQ and SQS (the instance that waited for it is
// gone). With no destination it returns an error wrapping bus.ErrNoRoute.
// An env.Due ahead (bus.Delay, bus.At) keeps the copy in the broker's
// delay heap, beside the delayed retries, until it is due; it does not
// survive the process.
func (t *Transport) Send(ctx context.Context, env *bus.Envelope, to string) error {
	return t.impl.Send(ctx, env, to)
}

// Publish puts a copy of env on the queue of every endpoint subscribed to
// env.Name. With no subscriber the broker keeps no copy. An env.Due ahead
// keeps each copy in the broker's delay heap until it is due: the
// endpoints subscribed at the publish get it.
func (t *Transport) Publish(ctx context.Context, env *bus.Envelope) error {
	return t.impl.Publish(ctx, env)
}

// Receive takes the next message of the endpoint's queue or of the
// transport's instance queue, waiting until one arrives, ctx ends or the
// transport is closed (bus.ErrClosed).
func (t *Transport) Receive(ctx context.Context) (*bus.Delivery, error) {
	return t.impl.Receive(ctx)
}

// ReceiveInstance implements bus.InstanceReceiver: it takes the next
// message of the instance queue alone.
func (t *Transport) ReceiveInstance(ctx context.Context) (*bus.Delivery, error) {
	return t.impl.ReceiveInstance(ctx)
}

// InstanceAddress implements bus.InstanceQueuer: the destination of the
// transport's own queue, "<endpoint>.instance.<uuid>" ("instance.<uuid>"
// without an endpoint), made by Setup with Topology.Instance and removed
// by Close.
func (t *Transport) InstanceAddress() string { return t.impl.InstanceAddress() }

// CopiesEnvelopes implements bus.EnvelopeCopier: Send and Publish queue a
// copy of the envelope.
func (t *Transport) CopiesEnvelopes() bool { return t.impl.CopiesEnvelopes() }

// SendBatch implements bus.Batcher: it puts a copy of each message of
// batch where Send and Publish would, taking the broker's lock once for
// the batch and each queue's lock once for its share, in batch order. A
// send with no destination fails alone (in the *bus.BatchError, wrapping
// bus.ErrNoRoute); the others are queued.
func (t *Transport) SendBatch(ctx context.Context, batch []bus.Outbound) error {
	return t.impl.SendBatch(ctx, batch)
}

// Delete acknowledges d: it will not be delivered again.
func (t *Transport) Delete(ctx context.Context, d *bus.Delivery) error {
	return t.impl.Delete(ctx, d)
}

// Return puts d back at the tail of its queue with its attempt raised.
func (t *Transport) Return(ctx context.Context, d *bus.Delivery, cause error) error {
	return t.impl.Return(ctx, d, cause)
}

// ReturnAfter puts d back at the tail of its queue with its attempt
// raised, no earlier than delay from now. The broker keeps the message
// in a heap by due time with one timer set for the earliest, so a long
// delay never holds back a short one; it does not survive the process.
func (t *Transport) ReturnAfter(ctx context.Context, d *bus.Delivery, cause error, delay time.Duration) error {
	return t.impl.ReturnAfter(ctx, d, cause, delay)
}

// MaxDelay returns the longest time.Duration: a timer carries any delay.
func (t *Transport) MaxDelay() time.Duration { return t.impl.MaxDelay() }

// Fail moves d to the endpoint's dead-letter queue with f
// ([Broker.DeadLetters]); f.Time is set to now when zero.
func (t *Transport) Fail(ctx context.Context, d *bus.Delivery, f bus.Failure) error {
	return t.impl.Fail(ctx, d, f)
}

// Close stops receiving, puts the deliveries still in flight back at the
// head of their queue in order, and removes the instance queue. Delete,
// Return and Fail of a delivery received before return an error wrapping
// bus.ErrClosed.
func (t *Transport) Close(ctx context.Context) error { return t.impl.Close(ctx) }

var (
	_ bus.Transport         = (*Transport)(nil)
	_ bus.InstanceQueuer    = (*Transport)(nil)
	_ bus.InstanceReceiver  = (*Transport)(nil)
	_ bus.EnvelopeCopier    = (*Transport)(nil)
	_ bus.Delayer           = (*Transport)(nil)
	_ bus.DeadLetterManager = (*Transport)(nil)
	_ bus.EndpointLister    = (*Transport)(nil)
	_ bus.DeliveryCounter   = (*Transport)(nil)
	_ bus.Batcher           = (*Transport)(nil)
)
