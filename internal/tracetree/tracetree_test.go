package tracetree_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/plugbus/plugbus/internal/tracetree"
)

var (
	t0  = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tid = trace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
)

func sc(trace trace.TraceID, span byte) trace.SpanContext {
	return traceSpanContext(trace, span, false)
}

func traceSpanContext(t trace.TraceID, span byte, remote bool) trace.SpanContext {
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: t, SpanID: trace.SpanID{0, 0, 0, 0, 0, 0, 0, span}, TraceFlags: trace.FlagsSampled, Remote: remote})
}

type stub struct {
	name         string
	id, parent   byte
	kind         trace.SpanKind
	start, took  time.Duration
	attrs        []attribute.KeyValue
	status       sdktrace.Status
	links        []sdktrace.Link
	traceID      trace.TraceID
	remoteParent bool
}

func (s stub) span() sdktrace.ReadOnlySpan {
	tr := s.traceID
	if !tr.IsValid() {
		tr = tid
	}
	ss := tracetest.SpanStub{
		Name: s.name, SpanContext: sc(tr, s.id), SpanKind: s.kind,
		StartTime: t0.Add(s.start), EndTime: t0.Add(s.start + s.took),
		Attributes: s.attrs, Status: s.status, Links: s.links,
	}
	if s.parent != 0 {
		ss.Parent = traceSpanContext(tr, s.parent, s.remoteParent)
	}
	return ss.Snapshot()
}

func spans(stubs ...stub) []sdktrace.ReadOnlySpan {
	out := make([]sdktrace.ReadOnlySpan, len(stubs))
	for i, s := range stubs {
		out[i] = s.span()
	}
	return out
}

// checkout is a trace of send → process → handler → send → process, given
// out of order, with a sibling under the first handler.
func checkout() []sdktrace.ReadOnlySpan {
	dest := func(d string) attribute.KeyValue { return attribute.String("messaging.destination.name", d) }
	id := func(d string) attribute.KeyValue { return attribute.String("messaging.message.id", d) }
	return spans(
		stub{name: "process ChargeCard", id: 6, parent: 5, remoteParent: true, kind: trace.SpanKindConsumer, start: 900 * time.Microsecond, took: 2345 * time.Microsecond,
			attrs:  []attribute.KeyValue{dest("billing"), id("m-2"), attribute.Int("plugbus.delivery.attempt", 2), attribute.String("error.type", "card_declined")},
			status: sdktrace.Status{Code: codes.Error, Description: "card declined"}},
		stub{name: "checkout", id: 1, kind: trace.SpanKindInternal, took: 5 * time.Millisecond},
		stub{name: "send PlaceOrder", id: 2, parent: 1, kind: trace.SpanKindProducer, start: 10 * time.Microsecond, took: 12345 * time.Nanosecond,
			attrs: []attribute.KeyValue{id("m-1"), dest("orders"), attribute.Int("plugbus.delivery.attempt", 1)}},
		stub{name: "process PlaceOrder", id: 3, parent: 2, remoteParent: true, kind: trace.SpanKindConsumer, start: 100 * time.Microsecond, took: 700 * time.Microsecond,
			attrs: []attribute.KeyValue{dest("orders"), id("m-1")}},
		stub{name: "orders.place", id: 4, parent: 3, kind: trace.SpanKindInternal, start: 120 * time.Microsecond, took: 600 * time.Microsecond},
		stub{name: "send ChargeCard", id: 5, parent: 4, kind: trace.SpanKindProducer, start: 400 * time.Microsecond, took: 50 * time.Microsecond,
			attrs: []attribute.KeyValue{dest("billing"), id("m-2")}},
		stub{name: "audit", id: 7, parent: 4, kind: trace.SpanKindClient, start: 130 * time.Microsecond, took: 1500 * time.Millisecond},
	)
}

func TestPrintTree(t *testing.T) {
	var b strings.Builder
	tracetree.Print(&b, checkout())
	want := `checkout [internal] 5ms
└─ send PlaceOrder [producer] 12.3µs dest=orders id=m-1
   └─ process PlaceOrder [consumer] 700µs dest=orders id=m-1
      └─ orders.place [internal] 600µs
         ├─ audit [client] 1.5s
         └─ send ChargeCard [producer] 50µs dest=billing id=m-2
            └─ process ChargeCard [consumer] 2.35ms dest=billing id=m-2 attempt=2 error.type=card_declined ERROR "card declined"
`
	if got := b.String(); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}

// Spans of two traces, the second linked to the first, and a span whose
// parent is not among the spans.
func TestPrintLinksAndOrphans(t *testing.T) {
	other := trace.TraceID{9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9}
	faraway := trace.TraceID{7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7}
	got := new(strings.Builder)
	tracetree.Print(got, spans(
		stub{name: "send PlaceOrder", id: 1, parent: 42, kind: trace.SpanKindProducer, took: time.Millisecond},
		stub{name: "process PlaceOrder", id: 2, traceID: other, kind: trace.SpanKindConsumer, start: time.Millisecond, took: 3 * time.Millisecond,
			links: []sdktrace.Link{{SpanContext: sc(tid, 1)}, {SpanContext: sc(faraway, 3)}}},
		stub{name: "orders.place", id: 3, parent: 2, traceID: other, kind: trace.SpanKindInternal, start: 2 * time.Millisecond, took: time.Millisecond},
	))
	want := `send PlaceOrder [producer] 1ms
process PlaceOrder [consumer] 3ms ↪ send PlaceOrder ↪ 07070707070707070707070707070707/0000000000000003
└─ orders.place [internal] 1ms
`
	if got.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}

func TestPrintEmpty(t *testing.T) {
	var b strings.Builder
	tracetree.Print(&b, nil)
	if b.Len() != 0 {
		t.Errorf("got %q for no spans, want nothing", b.String())
	}
}

// Spans recorded by a real SDK print as well as stubs.
func TestPrintRecorded(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	tr := tp.Tracer("test")
	ctx, root := tr.Start(context.Background(), "root")
	_, child := tr.Start(ctx, "child", trace.WithSpanKind(trace.SpanKindProducer))
	child.End()
	root.End()
	var b strings.Builder
	tracetree.Print(&b, rec.Ended())
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "root [internal] ") || !strings.HasPrefix(lines[1], "└─ child [producer] ") {
		t.Errorf("got:\n%s", b.String())
	}
}

func TestDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                           "0s",
		999:                         "999ns",
		1234:                        "1.23µs",
		12345:                       "12.3µs",
		123456:                      "123µs",
		1234567:                     "1.23ms",
		12345678:                    "12.3ms",
		123456789:                   "123ms",
		1234567891:                  "1.23s",
		12345678912:                 "12.3s",
		123456789123:                "2m3s",
		5 * time.Millisecond:        "5ms",
		1500 * time.Millisecond:     "1.5s",
		-3 * time.Millisecond / 100: "-30µs",
	} {
		if got := tracetree.Duration(d); got != want {
			t.Errorf("Duration(%d) = %q, want %q", int64(d), got, want)
		}
	}
}

func ExamplePrint() {
	tracetree.Print(os.Stdout, checkout()[1:6])
	// Output:
	// checkout [internal] 5ms
	// └─ send PlaceOrder [producer] 12.3µs dest=orders id=m-1
	//    └─ process PlaceOrder [consumer] 700µs dest=orders id=m-1
	//       └─ orders.place [internal] 600µs
	//          └─ send ChargeCard [producer] 50µs dest=billing id=m-2
}
