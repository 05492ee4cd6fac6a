// Package middleware is the parent of plugbus's built-in middleware: one
// small package per concern, each a [bus.Plugin] that works for the whole
// bus ([bus.WithMiddleware]) or for one handler ([bus.HandlerMiddleware]):
//
//	package       what it does                                            stages
//	timeout       a deadline for each handler, in its ctx                 handler
//	ratelimit     messages per second per endpoint, message name or key   handler
//	breaker       a circuit breaker around handlers; while open, messages handler
//	              are returned with a delay, not dead-lettered
//	concurrency   at most n messages of one name at once                  incoming (bus), handler (one handler)
//	validation    Validate() error refuses a send and dead-letters a      outgoing, handler
//	              received message at once
//	audit         one slog record per message per stage outcome           all three
//
// They live under middleware/ rather than plugins/ because they are of
// another kind: each is a few dozen lines around one stage function, with
// no store, no transport capability and no background work, in the style
// of Watermill's message/router/middleware; plugins/ holds the plugins that
// bring a subsystem of their own (spans and metrics, a database, a reply
// table). Keeping the small ones together makes the set easy to find and
// lets them share their out-of-process test binary (middleware/internal).
//
// docs/middleware.md compares them with Watermill's router middleware.
package middleware
