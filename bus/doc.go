// Package bus is the core of plugbus: a message bus whose one extension
// model is a typed (ctx, next) middleware pipeline with three stages.
//
// A bus is built once from options and cannot be changed afterwards:
//
//	b, err := bus.New(
//		bus.WithEndpoint("shipping"),
//		bus.WithHandler(func(ctx context.Context, m PaymentTaken, a bus.Attributes) error {
//			shipping, _, _ := bus.MessageContext(ctx) // the bus handling this message
//			return shipping.Publish(ctx, OrderShipped{OrderID: m.OrderID}) // sent when this handler succeeds
//		}),
//		bus.WithMiddleware(otel.New(), logging),
//	)
//	if err != nil {
//		return err
//	}
//	return b.Start(ctx)
//
// # Stages
//
// A middleware ([Middleware]) has up to three stages. Each is a function
// (ctx, stage context, next) error; next.Call(ctx) continues the chain with a
// context the middleware may derive, which is how data flows downstream.
//
//	stage     runs                                   may change            not calling next           returning an error
//	incoming  once per received message, before any  nothing (read-only;   message handled: handlers  message returned for retry;
//	          handler, also when no handler handles  raw transport         skipped, message deleted   catching next's error and
//	          it; for polled and pushed messages     message readable)                                returning nil marks it handled
//	handler   around each handler, inside that       nothing in the        that handler is skipped    that handler fails alone: its
//	          handler's outbox                       message; ctx          and counts as succeeded    sends are discarded, siblings
//	                                                                                                  unaffected, message retried
//	outgoing  at Send/Publish, after correlation id  attributes and        message dropped            Send/Publish returns it;
//	          and sticky attributes are merged,      native headers        (debug log names the       nothing is buffered
//	          before any outbox                                            middleware)
//
// # Order
//
// Within each stage middleware runs in registration order and the first
// registered is the outermost layer. There are no priorities or named slots.
//
//	WithMiddleware(a, b):  a ─▶ b ─▶ terminal ─▶ b returns ─▶ a returns
//
// Middleware is given at two levels: to the bus ([WithMiddleware]: every
// message, every handler, every send) and to one handler
// ([HandlerMiddleware]: the handler stage of that handler only). A
// handler's own middleware is the innermost, inside the bus's
// handler-stage middleware, in the order given; a plugin bundles
// middleware for either level:
//
//	bus.WithMiddleware(a, b)
//	bus.WithHandler(charge, bus.HandlerMiddleware(x, y))
//	bus.WithHandler(email)
//
//	┌ a.Incoming ────────────────────────────────────────────────────┐
//	│ ┌ b.Incoming ────────────────────────────────────────────────┐ │
//	│ │ decode, then each handler in a scope of its own:           │ │
//	│ │                                                            │ │
//	│ │ ┌ a.Handling ──────────────────┐  ┌ a.Handling ──────────┐ │ │
//	│ │ │ ┌ b.Handling ──────────────┐ │  │ ┌ b.Handling ──────┐ │ │ │
//	│ │ │ │ ┌ x.Handling ──────────┐ │ │  │ │                  │ │ │ │
//	│ │ │ │ │ ┌ y.Handling ──────┐ │ │ │  │ │      email       │ │ │ │
//	│ │ │ │ │ │      charge      │ │ │ │  │ │                  │ │ │ │
//	│ │ │ │ │ └──────────────────┘ │ │ │  │ └──────────────────┘ │ │ │
//	│ │ │ │ └──────────────────────┘ │ │  └──────────────────────┘ │ │
//	│ │ │ └──────────────────────────┘ │                           │ │
//	│ │ └──────────────────────────────┘                           │ │
//	│ └────────────────────────────────────────────────────────────┘ │
//	└────────────────────────────────────────────────────────────────┘
//
//	bus level (a, b): every stage; handler level (x, y): charge's handler stage
//
// A handler's own middleware follows the handler stage's rules and costs
// the same: nothing allocated per layer.
//
// Each stage has its own next type ([IncomingNext], [HandlingNext],
// [OutgoingNext]), a pointer whose Call the compiler inlines into the
// middleware, so that a layer is one call. next may be called at most
// once per invocation, and only while the middleware runs; a second call
// returns a [*NextMisuseError] naming the stage and the middleware. The
// chains are composed once, in [New], so running a layer allocates
// nothing.
//
// # Outbox
//
// A Send or Publish inside a handler is buffered in that handler's outbox
// (the handler scope travels in ctx) and handed to the transport only when
// that handler succeeds; flushing never re-runs outgoing middleware. A
// durable outbox plugin replaces the buffer ([Handling.UseOutbox]). The
// flush hands the handler's sends to the transport as one batch, so on a
// [Batcher] transport N sends cost about one confirmation round trip.
//
// # Batches
//
// [Bus.SendBatch] and [Bus.PublishBatch] run each message through the
// outgoing stage and hand the transport the batch; the result names, by
// index, each message that was not sent ([*BatchError]), and nothing is
// reported as sent unless the broker confirmed it. A transport without
// [Batcher] gets the messages one by one.
//
// # Failures
//
// A handler or middleware that could not try the message now (a circuit
// breaker is open, a concurrency limit is full) returns [RetryAfter]: the
// message is handed back with a delay, outside its retry policy, and is
// never dead-lettered for it.
//
// A failed message is retried as its retry policy says ([RetryPolicy]):
// at once, then in delayed rounds; it comes back with its attempt raised,
// and once the policy is used up it goes to the endpoint's dead-letter
// queue with its [Failure]. A permanent failure, which no retry can fix,
// is dead-lettered at once, on its first attempt, with a reason that says
// so ([IsPermanent]): an error marked with [Permanent] by a handler or a
// middleware (also in another process), one a classifier of the bus marks
// ([WithPermanentErrors]), and a message that cannot be decoded. So is a
// message whose name none of the bus's handlers handles, once its
// incoming middleware passed it on (a [*NoHandlerError] naming the
// message and the endpoint, logged at WARN); [WithUnhandled] with
// [UnhandledDiscard] deletes such messages instead, logged at INFO and
// visible to middleware through [Incoming.Unhandled]. Panics in handlers
// and middleware are recovered as [*PanicError]. Nothing is lost silently.
//
// Whatever waits before trying again (a delayed retry round, a plugin
// restart, the outbox relay, a store's retry of a message the transport
// refused) waits a [Backoff]: exponential, with full jitter, set by an
// option spelled WithBackoff in the packages outside bus.
//
// Registration mistakes fail [New] with an error saying what to change:
// two Go types with one message name, one message routed to two
// endpoints, a nil handler function, a handler of an interface type, an
// empty message name.
//
// # Plugins
//
// [WithMiddleware] takes plugins ([Plugin]): factories the bus calls once,
// in New, with [PluginInfo]; [HandlerMiddleware] takes them for one
// handler, instantiated once for it. A [Middleware] value is itself a
// plugin. Package middleware (middleware/...) holds the built-in ones:
// timeout, ratelimit, breaker, concurrency, validation, audit.
// Nothing is package-level: two buses in one process never see each
// other's middleware or context.
//
// # Writing a transport
//
// A transport connects a bus to a broker. It implements [Transport]: the
// bus gives it a [Topology] to declare at Start, hands it each [Envelope]
// to Send (to an endpoint) or Publish, and receives each
// [Delivery] from it, settled with exactly one of Delete, Return or Fail
// (with a [Failure]); the transport reads each message it dead-lettered
// back as a [DeadLetter]. It refuses what it cannot carry with the core's
// errors ([ErrClosed], [ErrNoRoute], [*HeaderReservedError],
// [*MessageTooLargeError]). Whatever more it offers is an optional
// interface, checked at run time by the code that uses it:
//
//	interface             what the transport offers                            used by
//	HeaderValidator       refuses a header at send, before any outbox          the bus, at Send and Publish
//	EnvelopeCopier        keeps no pointer to a sent envelope                  the bus, to reuse envelopes
//	DeliveryReleaser      reuses a delivery once the bus is done with it       the bus, after settling
//	ReceiveCounter        its broker counts receives and dead-letters          the bus, at Stop on a last attempt
//	Connector             holds a connection; Connect waits for it             the bus, at Start of a send-only bus
//	Delayer               delivers a returned message after a delay            the bus, for delayed retries (RetryPolicy)
//	                      and honours Envelope.Due in Send and Publish         Delay, At (scheduling)
//	Batcher               takes many messages at once, confirms each           SendBatch, PublishBatch, the flush, outbox relay
//	InstanceQueuer        a queue of this bus instance alone                   New, for middleware such as requestreply
//	InstanceReceiver      receives from the instance queue alone               the bus, for replies while handlers wait
//	MessagingSystemNamer  names its messaging system                           plugins/otel (messaging.system)
//	DeadLetterManager     lists, counts, replays and deletes dead letters      plugbus dlq, the console (package console)
//	EndpointLister        names the endpoints it knows                         the console, UnknownEndpointError.Known
//	DeliveryCounter       counts the messages delivered from a queue           the console (messages per second)
//	DestinationChecker    says whether a replay's destination has a queue      plugbus dlq replay -to -dry-run
//
// Package transports/transporttest is the conformance suite every
// transport passes. The memory transport (transports/memory, implemented
// in this package's memory.go so that it can be New's default) is the
// smallest complete one. A new transport lives in a package of its own
// under transports/; docs/transports/contract.md explains each piece.
package bus
