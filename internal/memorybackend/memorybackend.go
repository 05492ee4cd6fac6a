// Package memorybackend joins the in-process transport's public home,
// package transports/memory, to its implementation, which lives unexported
// in package bus so that bus.New can use it as its default transport. bus
// cannot import transports/memory (that package imports bus for the
// transport contract), so the implementation is reached through the two
// constructors here.
//
// Package bus sets both in an init function, before any code of
// transports/memory runs, and nothing writes them afterwards. They return
// any, so that this package imports nothing of bus; transports/memory
// asserts the values to interfaces of its own that list their methods.
package memorybackend

var (
	// NewBroker returns an empty broker.
	NewBroker func() any
	// NewTransport returns a transport on broker, a value NewBroker returned.
	NewTransport func(broker any) any
)
