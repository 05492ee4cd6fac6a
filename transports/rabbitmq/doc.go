// Package rabbitmq is the RabbitMQ transport of plugbus, built on
// github.com/rabbitmq/amqp091-go.
//
//	t, err := rabbitmq.New("amqp://guest:guest@127.0.0.1:5672/")
//	if err != nil {
//		return err
//	}
//	b, err := bus.New(bus.WithEndpoint("orders"), bus.WithTransport(t), bus.WithHandler(placeOrder))
//
// # Topology
//
// Published messages go through one durable topic exchange (default
// "plugbus.events", see [WithExchange]) with the message name as routing
// key. Each endpoint has a durable queue named after the endpoint, bound to
// the exchange once per message name it handles, and a durable dead-letter
// queue named endpoint + ".dlq" ([DeadLetterQueue]). A send goes straight to
// the destination endpoint's queue through the default exchange. Setup
// declares all of it; every declaration is idempotent.
//
// With Topology.Instance (request/reply) Setup also declares an exclusive,
// auto-delete instance queue of this transport ([Transport.InstanceAddress]),
// declared again under the same name after a reconnection; a message sent
// to it while it does not exist is dropped with a warning.
//
// # Delivery guarantees
//
// Every message is persistent and published with the mandatory flag on a
// channel in confirm mode: Send and Publish return only once the broker
// confirmed the message. A message no queue takes is an [*UnroutableError]
// and a broker nack is [ErrNacked]; neither is reported as sent. Confirms
// are pipelined: concurrent senders share a small pool of confirm channels
// and never wait for each other's confirmation.
//
// Consumers use manual acknowledgements and a prefetch of twice the bus
// concurrency ([WithPrefetch]). Delete acknowledges; Return republishes the
// message to the endpoint's queue with its attempt count raised (the count
// travels in a header, so it survives the redelivery) and acknowledges the
// original once the copy is confirmed; Fail does the same towards the
// dead-letter queue with the failure in headers. When the broker refuses
// the copy, the original is requeued (nack) and redelivered with its
// attempt count unchanged. On a quorum queue the broker's x-delivery-count
// also counts as attempts, so a message that crashes its consumer reaches
// the dead-letter queue; a classic queue cannot count those redeliveries.
//
// A message the broker refuses by closing the publisher channel (over
// max_message_size, access refused) is a [*RefusedError]: only that
// channel is replaced. A publish that finds the topic exchange deleted
// declares it again, with the endpoint's bindings, and publishes again;
// other endpoints miss events until their transports reconnect or
// publish (see the docs). A body over [WithMaxMessageSize] is refused
// before sending with a [*bus.MessageTooLargeError], properties and
// headers that do not fit one AMQP frame (on which the broker would close
// the connection) with a [*HeadersTooLargeError].
//
// # Delays
//
// [Transport.ReturnAfter] (a delayed retry) and the delayed sends and
// publishes of scheduling are carried by the broker, without plugins, in a
// cascade of 29 durable quorum queues shared by every endpoint of the
// virtual host ([DelayPrefix]): level i holds a message for 2^i × 10 ms
// and dead-letters it, at least once, to the exchange of level i-1. The
// delay is written in binary into the routing key, so that a message waits
// in one queue per set bit and each queue holds messages of one TTL only:
// a long delay never holds back a short one. At the end, the delivery
// exchange routes it to the destination queue, or, for a delayed publish,
// to the endpoints that handle its name then; what it routes nowhere is
// kept in [DelayUndeliverableQueue]. Delays are rounded up to 10 ms, never
// delivered early, and at most [Transport.MaxDelay] (about 62 days). Setup
// declares the queues and binds the endpoint's queue for the last hop.
// The copies Return, ReturnAfter and Fail make carry the retry history
// the bus gave them ([HeaderRetries]); Receive reads it back.
//
// # Headers
//
// The outgoing headers bag becomes AMQP message headers. Names starting
// with [ReservedPrefix] ("plugbus-", compared without regard to case)
// carry the bus attributes and failure metadata and are refused with a
// *bus.HeaderReservedError, as are "CC" and "BCC", on which RabbitMQ
// routes (sender-selected distribution; the broker compares these two
// with regard to case). The same names are reserved on receipt: they never
// reach handlers as ordinary headers. Of a received message the transport
// reads only its own spelling of its headers; any other reserved name, a
// value of the wrong type or out of range (an attempt below 1 or above
// Topology.MaxAttempts, a sent time more than [ClockSkewAllowance] ahead)
// is ignored with a warning naming the header and the message: foreign
// input never shortens a message's retries. The copies Return and Fail
// make carry CC and BCC as [HeaderOriginalCC] and [HeaderOriginalBCC], so
// that the broker never routes a copy anywhere else. Incoming ordinary
// headers of any AMQP type (numbers, tables such as x-death) are read:
// non-string values are turned into text, and the raw *amqp091.Delivery is
// available to middleware as Delivery.Raw while the message is processed
// (the transport reuses it once the bus releases the delivery).
//
// # Connecting and reconnection
//
// The transport owns one connection, made on first use: Setup (bus Start
// of a bus that receives), Send, Publish or [Transport.Connect]. Each
// waits for the broker until its context ends and then returns an
// [*UnreachableError]; with a context that never ends it waits for ever.
// Every failed connection attempt is logged at warn level with the broker
// address (its password replaced by "xxxxx") and the time of the next
// attempt. A send-only bus never calls Setup: its Start calls Connect
// (the transport is a bus.Connector), so it fails the same way.
//
// When the connection or its consumer channel is lost, the transport
// reconnects with exponential backoff, declares the topology again and
// resumes consuming. A send during the outage waits for the new
// connection (bounded by its context) and is published again; it never
// reports success for a message the broker did not confirm.
package rabbitmq
