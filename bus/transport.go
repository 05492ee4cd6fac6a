package bus

import (
	"context"
	"time"
)

// This file is the transport contract, whole: what a transport implements
// ([Transport]), the values it exchanges with the bus ([Topology],
// [Envelope], [Delivery], [Failure], [DeadLetter]), and the
// optional interfaces through which it offers more, each checked at run
// time by the code that uses it. The package doc's "Writing a transport"
// lists them; docs/transports/contract.md explains them; package
// transports/transporttest checks a transport against them.

// Transport moves envelopes between endpoints. A transport is used by one
// bus; several transports may share a broker.
//
// The bus calls Setup once at Start, then Receive from as many goroutines
// as its concurrency, and exactly one of Delete, Return or Fail for each
// delivery. Send and Publish may be called at any time, concurrently,
// including on a transport that never had Setup called (a send-only bus).
//
// Errors a transport returns: [ErrClosed] (wrapped) after Close; an error
// wrapping [ErrNoRoute] for a send without a destination; a
// [*HeaderReservedError] for a header whose name it writes itself; a
// [*MessageTooLargeError] for a message over its size limit.
type Transport interface {
	// Setup declares the endpoint's queue, its dead-letter queue and the
	// subscriptions to the published messages it handles. It is idempotent.
	Setup(ctx context.Context, topo Topology) error
	// Send delivers env to the endpoint named to.
	Send(ctx context.Context, env *Envelope, to string) error
	// Publish delivers env to every endpoint subscribed to env.Name.
	Publish(ctx context.Context, env *Envelope) error
	// Receive blocks until a message arrives, ctx is done (ctx.Err()) or
	// the transport is closed ([ErrClosed]).
	Receive(ctx context.Context) (*Delivery, error)
	// Delete acknowledges a delivery: it will not be seen again.
	Delete(ctx context.Context, d *Delivery) error
	// Return gives a delivery back for redelivery with Attempt+1. cause is
	// the error that made it fail.
	Return(ctx context.Context, d *Delivery, cause error) error
	// Fail moves a delivery to the endpoint's dead-letter queue with f.
	Fail(ctx context.Context, d *Delivery, f Failure) error
	// Close releases the transport. Deliveries not yet deleted are given
	// back to the broker (they will be delivered again), so Delete, Return
	// and Fail after Close return an error wrapping ErrClosed. Receive,
	// Send and Publish return ErrClosed afterwards.
	Close(ctx context.Context) error
}

// Topology is what a transport declares when the bus starts.
type Topology struct {
	// Endpoint names this service's queue.
	Endpoint string
	// Handles lists the message names the endpoint has handlers for, sorted.
	// A transport subscribes the endpoint to the published messages of these names.
	Handles []string
	// MaxAttempts is the number of deliveries before the bus dead-letters a message.
	MaxAttempts int
	// Concurrency is the number of messages the bus processes at once; a
	// transport may size its prefetch from it.
	Concurrency int
	// Instance asks for a queue of this transport instance alone, received
	// through the same Receive (and through [InstanceReceiver] when the
	// transport implements it), whose address [InstanceQueuer] returns. The
	// bus sets it when a middleware needs it (request/reply); Endpoint may
	// then be empty.
	Instance bool
}

// Envelope is a finished, encoded message: what the bus hands to a
// transport and what a transport hands back when it receives one.
type Envelope struct {
	// Name is the message's wire name ([Message.MessageName]).
	Name string
	// ContentType is the serializer's content type, for example "application/json".
	ContentType string
	// Body is the encoded message.
	Body []byte
	// Attributes are the bus attributes; transports carry them natively.
	Attributes Attributes
	// Headers are the transport-native headers set by outgoing middleware.
	Headers Headers
	// Due, when not zero, is the earliest time the message may be
	// delivered ([Delay], [At]). A transport that implements [Delayer]
	// honours it in Send and Publish with the mechanism that carries its
	// delayed retries: a Due that has passed means now, and it may
	// refuse one further ahead than its MaxDelay (the bus refuses those
	// before they reach it). A transport need not set it on the envelopes
	// it receives.
	Due time.Time
}

// Delivery is one received message, owned by the transport that returned it
// until it is deleted, returned or failed.
type Delivery struct {
	Envelope
	// Attempt is 1 on the first delivery and grows by one each time the
	// message is returned for retry. The bus dead-letters a failing
	// message whose Attempt reached the maximum, so a transport that reads
	// it from something a foreign publisher can write (a message header)
	// ignores a value out of range, with a warning naming that header,
	// rather than let a forged count shorten the message's life. The bus
	// itself counts an Attempt below 1 as 1, with a warning. (Above the
	// maximum is in range: the bus returns a last attempt that Stop
	// interrupted, which comes back one above it.)
	Attempt int
	// Retries is what the message's earlier failures left, as the
	// transport carried it with the returned message (RabbitMQ and
	// memory always; SQS on a delayed retry): a transport that carries
	// it stores [RetryHistory.MarshalText] with the copy that Return,
	// [Delayer.ReturnAfter] and Fail make, and reads it back with
	// UnmarshalText, ignoring with a warning what it cannot read. The bus
	// updates it before it calls Return, ReturnAfter or Fail.
	Retries RetryHistory
	// Raw is the transport-native message (*amqp091.Delivery, an SQS
	// types.Message, ...). Middleware may read it while the message is
	// processed; a [DeliveryReleaser] reuses it afterwards.
	Raw any
	// Err is set by a transport that received a message it could not read
	// (missing name, malformed attributes). The bus dead-letters such a
	// message with Err as the reason, without running any middleware.
	Err error
	// Token is for the transport's own bookkeeping.
	Token any
}

// Failure describes why a message was dead-lettered. Transports store it
// with the message in the dead-letter queue.
type Failure struct {
	// Reason is the error text.
	Reason string
	// Attempts is how many times the message was delivered.
	Attempts int
	// Endpoint is the endpoint that gave up on the message.
	Endpoint string
	// Time is when the message was dead-lettered.
	Time time.Time
	// History is the message's retry history, this failure included.
	History RetryHistory
}

// DeadLetter is a message read back from a dead-letter queue: the envelope
// as the transport received it and the failure that dead-lettered it. Each
// transport reads its dead letters into this shape (memory's
// Broker.DeadLetters, rabbitmq.DecodeDeadLetter, sqs.DecodeDeadLetter).
type DeadLetter struct {
	// ID names the dead letter in its queue for a [DeadLetterManager]
	// (a [DeadLetterFilter] selects by it); empty where nothing set it.
	ID       string
	Envelope Envelope
	Failure  Failure
}

// HeaderValidator is implemented by transports that restrict header names
// or values. The bus calls it when a message is sent, before it is buffered
// in a handler's outbox, so the error reaches the code that sent.
type HeaderValidator interface {
	ValidateHeaders(h Headers) error
}

// EnvelopeCopier is implemented by transports whose Send and Publish keep
// no pointer to env once they return: they copy what they keep (the
// Envelope struct; its body and maps are never reused by the bus). When
// CopiesEnvelopes reports true, the bus hands such a transport envelopes
// it reuses for later messages, which saves an allocation per message.
// A transport that keeps env itself, such as a fake recording what was
// sent, must not implement it.
type EnvelopeCopier interface {
	CopiesEnvelopes() bool
}

// DeliveryReleaser is implemented by transports that reuse the memory of
// the deliveries they return. The bus calls ReleaseDelivery once it is
// done with d: settled, logged, and out of reach of every middleware (it
// does not call it for a delivery that a stage run which did not end
// clean may still read on another goroutine, nor for one given to
// [Bus.Deliver]). The transport may then reuse d and what d.Raw points to.
type DeliveryReleaser interface {
	ReleaseDelivery(d *Delivery)
}

// ReceiveCounter is implemented by transports whose broker counts the
// receives of a message and dead-letters it itself past the maximum
// attempts (SQS's redrive policy). A message that Stop interrupted on its
// last attempt cannot be retried there: the bus dead-letters it with its
// reason instead of returning it, which would leave the broker to
// dead-letter it without one.
type ReceiveCounter interface {
	CountsReceives() bool
}

// Delayer is implemented by transports that can deliver a message again
// no earlier than a delay from now: the bus's delayed retries
// ([RetryPolicy]) use it. A transport without it gets its delayed retries
// at once, and the bus warns at Start. The delay is durable where the
// broker is: a delayed message survives a restart of the process that
// returned it (and of a durable broker).
//
// A Delayer also schedules: its Send and Publish deliver an envelope whose
// [Envelope.Due] is set no earlier than Due, with the same mechanism, and
// MaxDelay is then the longest a due time may lie ahead ([Delay], [At]).
type Delayer interface {
	// ReturnAfter gives d back for redelivery with Attempt+1, like
	// Return, delivered no earlier than delay from now, carrying
	// d.Retries. A delay above MaxDelay is cut to MaxDelay.
	ReturnAfter(ctx context.Context, d *Delivery, cause error, delay time.Duration) error
	// MaxDelay returns the longest delay the transport carries.
	MaxDelay() time.Duration
}

// Batcher is implemented by transports that can hand many finished
// messages to the broker at once and report, per message, whether the
// broker confirmed it. [Bus.SendBatch], [Bus.PublishBatch], the flush of
// a handler's sends and [Bus.DispatchBatch] (the outbox relay) use it;
// without it the bus hands the messages to Send and Publish one by one,
// each waiting for its own confirmation.
//
// SendBatch sends the sends and publishes the publishes of batch, as Send
// and Publish would (an Envelope.Due ahead goes through the transport's
// delay path), and returns once the broker confirmed or refused each. It
// returns nil when every message was confirmed, and a [*BatchError] whose
// Failures name, by index in batch, each message that was not (with why)
// when some were not: every message it does not name was confirmed. Any
// other error means that no message of the batch is known to be
// confirmed: the bus reports each as failed with it. Like Send, it may be
// called concurrently and keeps no pointer into batch once it returns
// when the transport is an [EnvelopeCopier].
type Batcher interface {
	SendBatch(ctx context.Context, batch []Outbound) error
}

// Connector is implemented by transports that hold a connection to a
// broker. Start calls Connect on a bus that does not receive (a send-only
// bus, which never calls Setup), so that Start fails, when ctx ends, on a
// wrong address or a broker that is down, as it does for a bus that
// receives. Connect waits for the connection until ctx ends.
type Connector interface {
	Connect(ctx context.Context) error
}

// InstanceQueuer is implemented by transports that can give one bus
// instance a queue of its own, so that a reply reaches the instance that
// asked even when several instances share an endpoint. The queue lives as
// long as the transport: it is removed at Close, and a message sent to the
// address of a removed instance queue is dropped (the instance that waited
// for it is gone). [New] refuses a middleware that asks for an instance
// queue ([Middleware.InstanceQueue], as plugins/requestreply does) on a
// transport without it; requestreply sends its replies to InstanceAddress.
type InstanceQueuer interface {
	// InstanceAddress returns the Destination that reaches this instance's
	// queue. It is valid after Setup with Topology.Instance.
	InstanceAddress() string
}

// InstanceReceiver is implemented by transports that can receive from the
// instance queue alone. The bus then reads it with a receive loop of its
// own, beside its handler workers, so that a handler waiting for a reply
// (request/reply) never keeps that reply from being received, and keeps
// reading it while Stop waits for handlers. Receive may still return
// messages of the instance queue too.
type InstanceReceiver interface {
	ReceiveInstance(ctx context.Context) (*Delivery, error)
}

// MessagingSystemNamer is implemented by transports that name their
// messaging system as the OpenTelemetry semantic conventions spell it
// ("rabbitmq", "aws_sqs"). plugins/otel reports it as messaging.system; for
// a transport without it, the plugin reports "plugbus".
type MessagingSystemNamer interface {
	MessagingSystem() string
}
