// Package lazylog defers the scoping of a log handler to the first record.
//
// Stage contexts made outside a bus (bus.NewIncoming and friends, one per
// message in a plugin process) scope a logger for every invocation, and
// most invocations never log. A [Handler] records WithAttrs and WithGroup
// and applies them to its base handler only when a record is handled, so
// that scoping costs a slice append instead of the base handler's work
// (a JSON or text handler formats the attributes at WithAttrs).
//
// The base is fixed ([New]) or read anew at every record ([Follow]), for
// a logger made once that must follow a base that changes later.
package lazylog

import (
	"context"
	"log/slog"
	"sync/atomic"
)

// Handler is a slog.Handler that applies WithAttrs and WithGroup to its
// base handler when a record is handled. Enabled asks the base directly.
// It is safe for concurrent use.
type Handler struct {
	fixed   slog.Handler        // the base, when it never changes
	current func() slog.Handler // or the function that returns the base as it is now
	scopes  []scope             // WithAttrs and WithGroup calls, in order

	// resolved is fixed with the scopes applied, made at the first record
	// (twice at worst, when the first records race: the results are equal).
	resolved atomic.Pointer[slog.Handler]
}

// scope is one WithAttrs (attrs) or WithGroup (group) call.
type scope struct {
	attrs []slog.Attr
	group string
}

// New returns a handler that scopes base lazily, with attrs (which it
// keeps) added when a record is handled. When base is already a *Handler
// it is scoped with attrs: laziness does not stack.
func New(base slog.Handler, attrs ...slog.Attr) *Handler {
	lazy, ok := base.(*Handler)
	switch {
	case ok && len(attrs) == 0:
		return lazy
	case ok:
		return lazy.with(scope{attrs: attrs})
	case len(attrs) == 0:
		return &Handler{fixed: base}
	}
	return &Handler{fixed: base, scopes: []scope{{attrs: attrs}}}
}

// Follow returns a handler whose base is what current returns at each
// record (and at each Enabled), so that loggers derived from it once
// follow a base that changes later. current is called often: it should
// be a load, not a computation.
func Follow(current func() slog.Handler) *Handler {
	return &Handler{current: current}
}

func (h *Handler) base() slog.Handler {
	if h.current != nil {
		return h.current()
	}
	return h.fixed
}

// Enabled reports whether the base handles records of level l.
func (h *Handler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.base().Enabled(ctx, l)
}

// Handle applies the scopes to the base and hands it r. With a fixed
// base, the scoped handler is made once and kept.
func (h *Handler) Handle(ctx context.Context, rec slog.Record) error {
	if h.current != nil {
		return applyScopes(h.current(), h.scopes).Handle(ctx, rec)
	}
	if r := h.resolved.Load(); r != nil {
		return (*r).Handle(ctx, rec)
	}
	scoped := applyScopes(h.fixed, h.scopes)
	h.resolved.Store(&scoped)
	return scoped.Handle(ctx, rec)
}

// WithAttrs returns a handler that adds attrs when a record is handled.
func (h *Handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	if len(attrs) == 0 {
		return h
	}
	return h.with(scope{attrs: attrs})
}

// WithGroup returns a handler that opens group name when a record is
// handled.
func (h *Handler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	return h.with(scope{group: name})
}

func (h *Handler) with(s scope) *Handler {
	return &Handler{fixed: h.fixed, current: h.current, scopes: append(h.scopes[:len(h.scopes):len(h.scopes)], s)}
}

func applyScopes(base slog.Handler, scopes []scope) slog.Handler {
	for _, s := range scopes {
		if s.group != "" {
			base = base.WithGroup(s.group)
		} else {
			base = base.WithAttrs(s.attrs)
		}
	}
	return base
}

var _ slog.Handler = (*Handler)(nil)
