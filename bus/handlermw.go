package bus

import (
	"fmt"
	"slices"
	"sync"
)

// HandlerMiddleware adds plugins to one handler's registration: their
// middleware runs in the handler stage of that handler only, inside the
// bus's handler-stage middleware ([WithMiddleware]), in the order given
// (the first is the outermost of them), with the same rules as any
// handler-stage middleware: next at most once, not calling it skips the
// handler, an error fails that handler alone.
//
//	bus.New(
//		bus.WithMiddleware(tracing, tx),               // every handler
//		bus.WithHandler(chargeCard, bus.HandlerMiddleware(
//			timeout.New(5*time.Second), breaker.New(), // chargeCard only
//		)),
//	)
//
//	tracing ─▶ tx ─▶ timeout ─▶ breaker ─▶ chargeCard
//
// Each plugin is instantiated by [New] once for this handler, with
// [PluginInfo].Handler set to the handler's name and Handles to its
// message's name, so a plugin can tell the two levels apart (and one
// plugin value given to two handlers keeps separate state for each). Its
// Start and Stop hooks run with the bus's, after the bus-level ones at
// Start and before them at Stop. Its middleware may have only a handler
// stage: New refuses one with an incoming or outgoing stage, or asking
// for an instance queue, since neither runs per handler. It refuses too a
// middleware that runs once ([Middleware].Unique) which the bus has
// already, and one whose [Middleware].TxSource is not that of the bus's
// middleware with a handler stage: a handler runs in one transaction.
// Calling HandlerMiddleware several times appends.
func HandlerMiddleware(plugins ...Plugin) HandlerOption {
	return func(h *handler) {
		h.plugins = append(h.plugins, plugins...)
	}
}

// instantiateHandlerMiddleware instantiates every handler's own plugins,
// after the bus-level ones, and gives each handler with middleware of its
// own a chain: the bus's handler-stage middleware, then its own.
func (b *Bus) instantiateHandlerMiddleware(handlers []*handler) error {
	for _, h := range handlers {
		if len(h.plugins) == 0 {
			h.layers = len(b.handling.funcs)
			continue
		}
		chain := &pipe[Handling, HandlingNext]{stage: StageHandler,
			names: slices.Clone(b.handling.names),
			funcs: slices.Clone(b.handling.funcs),
			base:  slices.Clone(b.handling.base),
			twice: slices.Clone(b.handling.twice)}
		info := PluginInfo{Bus: b, Name: b.name, Endpoint: b.endpoint, Logger: b.logger, Transport: b.t, Handles: []string{h.msgName}, Handler: h.name}
		around := slices.Clone(b.middleware[:b.wholeBus]) // the middleware around h
		for i, p := range h.plugins {
			if p == nil {
				return fmt.Errorf("bus: HandlerMiddleware of handler %s of %s: plugin %d is nil", h.name, h.msgName, i)
			}
			m, err := p.Instantiate(info)
			if err != nil {
				return fmt.Errorf("bus: HandlerMiddleware of handler %s of %s: plugin %d (%T): %w", h.name, h.msgName, i, p, err)
			}
			switch {
			case m.Name == "":
				return fmt.Errorf("bus: HandlerMiddleware of handler %s of %s: plugin %d (%T) returned a middleware without a name", h.name, h.msgName, i, p)
			case m.Incoming != nil || m.Outgoing != nil || m.InstanceQueue:
				return fmt.Errorf("bus: HandlerMiddleware of handler %s of %s: middleware %q has an incoming or outgoing stage or asks for an instance queue, which run per bus, not per handler; register it with bus.WithMiddleware, or give it only a handler stage", h.name, h.msgName, m.Name)
			case m.Handling == nil && m.Start == nil && m.Stop == nil:
				return fmt.Errorf("bus: HandlerMiddleware of handler %s of %s: middleware %q has no handler stage; per handler only the handler stage runs", h.name, h.msgName, m.Name)
			}
			if err := checkJoin(around, m, h); err != nil {
				return err
			}
			around = append(around, m)
			b.middleware = append(b.middleware, m)
			if m.Handling != nil {
				chain.add(m.Name, m.Handling, b.logger)
			}
		}
		h.runs = &sync.Pool{New: func() any { return newHandlingRun(b, chain) }}
		h.layers = len(chain.funcs)
	}
	return nil
}

// handlingRunsOf returns the pool of h's handler-stage runs.
func (b *Bus) handlingRunsOf(h *handler) *sync.Pool {
	if h.runs != nil {
		return h.runs
	}
	return &b.handlingRuns
}
