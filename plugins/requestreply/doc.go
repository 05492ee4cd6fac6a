// Package requestreply sends a request over the bus and waits for its
// reply, built only on the bus's three middleware stages.
//
// Install the plugin on every bus that sends requests (and, to turn a
// returned [*Error] into an error reply, on responders too):
//
//	b, err := bus.New(bus.WithTransport(t), bus.WithMiddleware(requestreply.New()))
//	...
//	quote, err := requestreply.Request[PriceQuote](ctx, b, GetPrice{SKU: "A-1"}, requestreply.To("pricing"))
//
// A responder is an ordinary handler that answers with [Reply]:
//
//	bus.WithHandler(func(ctx context.Context, q GetPrice, _ bus.Attributes) error {
//		return requestreply.Reply(ctx, PriceQuote{SKU: q.SKU, Cents: 1250})
//	})
//
// # How it works
//
// The plugin asks the bus for a queue of this bus instance alone
// (bus.Middleware.InstanceQueue; the transport must implement
// bus.InstanceQueuer). Its outgoing stage registers the request in a
// bounded table of pending requests and stamps two one-hop attributes on
// it: the request id ([AttrRequestID]) and the instance's reply address
// ([AttrReplyTo]). [Reply] sends the response to that address with
// [AttrInReplyTo]. The incoming stage of the requesting instance resolves
// the reply without calling next: a reply never reaches a handler and is
// deleted once resolved. Because the address names one instance, a reply
// reaches the instance that asked even when several instances share an
// endpoint.
//
// # Deadlines, cancellation and late replies
//
// A request waits until its context ends or its timeout passes
// ([WithTimeout] per request, [WithDefaultTimeout] for contexts without a
// deadline). A [*TimeoutError] (errors.Is [ErrTimeout] and
// context.DeadlineExceeded) or the context's cancellation error is returned
// and the pending entry is removed at once. A reply arriving afterwards is
// dropped with a debug log and counted in [Stats].Late. The table holds at
// most [WithMaxPending] requests; beyond that Request fails with a
// [*PendingLimitError] before sending anything.
//
// # Errors from the responder
//
// A responder answers with an error by calling [ReplyError] or by returning
// an [*Error] from its handler (on a bus with this plugin): the requester
// receives an [*Error] with the same Code and Message (errors.Is
// [ErrResponder]). Either way the request is answered: the handler counts
// as succeeded and what it sent is sent.
//
// Any other handler error is an ordinary failure: the request is retried
// with the bus's usual semantics (and dead-lettered after the maximum
// attempts), and the requester waits — receiving the reply of a later
// attempt if it comes in time, else timing out. A reply is sent only when
// the handler succeeds, like every message a handler sends.
//
// # Delivery of replies
//
// Replies are not durable. An instance queue lives as long as its
// transport; a reply sent to an instance that stopped, or (RabbitMQ) while
// it reconnects, is dropped by the transport with a warning, and the
// requester times out. Requests themselves are ordinary messages, retried
// and dead-lettered as usual.
package requestreply
