// Package tracetree prints finished OpenTelemetry spans as an indented
// tree: one line per span with its name, kind, duration and the attributes
// that tell a message's journey (destination, message id, error type).
// The demo (examples/demo) uses it to show the trace the otel plugin recorded.
package tracetree

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// shownAttrs are the attributes printed after a span, under a short label,
// in this order.
var shownAttrs = []struct{ key, label string }{
	{"messaging.destination.name", "dest"},
	{"messaging.message.id", "id"},
	{"plugbus.delivery.attempt", "attempt"},
	{"error.type", "error.type"},
}

// Print writes spans to w as trees. A span whose parent is among spans is
// printed under it; the others are roots. Roots and siblings are ordered by
// start time. A link to a span is shown as "↪ <name>" (or its trace and span
// ids when the linked span is not among spans), and a failed span ends with
// its status description. Write errors are ignored: Print is for humans.
func Print(w io.Writer, spans []sdktrace.ReadOnlySpan) {
	byID := make(map[trace.SpanID]sdktrace.ReadOnlySpan, len(spans))
	for _, s := range spans {
		byID[s.SpanContext().SpanID()] = s
	}
	children := make(map[trace.SpanID][]sdktrace.ReadOnlySpan, len(spans))
	var roots []sdktrace.ReadOnlySpan
	for _, s := range spans {
		p := s.Parent()
		if parent, ok := byID[p.SpanID()]; ok && p.IsValid() && parent.SpanContext().TraceID() == p.TraceID() {
			children[p.SpanID()] = append(children[p.SpanID()], s)
			continue
		}
		roots = append(roots, s)
	}
	var b strings.Builder
	for _, r := range sortByStart(roots) {
		printSpan(&b, r, "", "", children, byID)
	}
	_, _ = io.WriteString(w, b.String())
}

func sortByStart(spans []sdktrace.ReadOnlySpan) []sdktrace.ReadOnlySpan {
	return slices.SortedStableFunc(slices.Values(spans), func(a, b sdktrace.ReadOnlySpan) int {
		return cmp.Or(a.StartTime().Compare(b.StartTime()), strings.Compare(a.Name(), b.Name()))
	})
}

// printSpan writes s after first (its own prefix) and its children after
// rest (the prefix of the lines below it).
func printSpan(b *strings.Builder, s sdktrace.ReadOnlySpan, first, rest string, children map[trace.SpanID][]sdktrace.ReadOnlySpan, byID map[trace.SpanID]sdktrace.ReadOnlySpan) {
	b.WriteString(first)
	b.WriteString(line(s, byID))
	b.WriteByte('\n')
	kids := sortByStart(children[s.SpanContext().SpanID()])
	for i, c := range kids {
		if i == len(kids)-1 {
			printSpan(b, c, rest+"└─ ", rest+"   ", children, byID)
		} else {
			printSpan(b, c, rest+"├─ ", rest+"│  ", children, byID)
		}
	}
}

// line is one span's description.
func line(s sdktrace.ReadOnlySpan, byID map[trace.SpanID]sdktrace.ReadOnlySpan) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s [%s] %s", s.Name(), s.SpanKind(), Duration(s.EndTime().Sub(s.StartTime())))
	for _, a := range shownAttrs {
		for _, kv := range s.Attributes() {
			if string(kv.Key) != a.key {
				continue
			}
			if a.key == "plugbus.delivery.attempt" && kv.Value.AsInt64() <= 1 {
				break // only retries are worth a mention
			}
			fmt.Fprintf(&b, " %s=%s", a.label, kv.Value.String())
			break
		}
	}
	for _, l := range s.Links() {
		if t, ok := byID[l.SpanContext.SpanID()]; ok && t.SpanContext().TraceID() == l.SpanContext.TraceID() {
			fmt.Fprintf(&b, " ↪ %s", t.Name())
		} else {
			fmt.Fprintf(&b, " ↪ %s/%s", l.SpanContext.TraceID(), l.SpanContext.SpanID())
		}
	}
	if st := s.Status(); st.Code == codes.Error {
		b.WriteString(" ERROR")
		if st.Description != "" {
			fmt.Fprintf(&b, " %q", st.Description)
		}
	}
	return b.String()
}

// Duration formats d with about three significant digits: 1.23ms, 45.6µs, 2.5s.
func Duration(d time.Duration) string {
	switch {
	case d >= 100*time.Second:
		d = d.Round(time.Second)
	case d >= 10*time.Second:
		d = d.Round(100 * time.Millisecond)
	case d >= time.Second:
		d = d.Round(10 * time.Millisecond)
	case d >= 100*time.Millisecond:
		d = d.Round(time.Millisecond)
	case d >= 10*time.Millisecond:
		d = d.Round(100 * time.Microsecond)
	case d >= time.Millisecond:
		d = d.Round(10 * time.Microsecond)
	case d >= 100*time.Microsecond:
		d = d.Round(time.Microsecond)
	case d >= 10*time.Microsecond:
		d = d.Round(100 * time.Nanosecond)
	case d >= time.Microsecond:
		d = d.Round(10 * time.Nanosecond)
	}
	return d.String()
}
