package bus_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/testenv"
)

// A StageMaker's contexts, one per message, each log scoped with their own
// message and report their own endpoint, though they share the
// middleware's scoped logger.
func TestStageMakerContextsAreScopedToTheirMessage(t *testing.T) {
	var buf bytes.Buffer
	sm := bus.NewStageMaker(bus.StageInfo{Middleware: "tenancy", Endpoint: "orders",
		Logger: slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{ReplaceAttr: dropTime}))})
	first := sm.Incoming(&bus.Delivery{Envelope: bus.Envelope{Name: "a", Attributes: bus.Attributes{MessageID: "m-1"}}, Attempt: 1}, "")
	second := sm.Incoming(&bus.Delivery{Envelope: bus.Envelope{Name: "b", Attributes: bus.Attributes{MessageID: "m-2"}}, Attempt: 1}, "billing")
	if got := first.Endpoint(); got != "orders" {
		t.Errorf("first endpoint = %q, want the StageInfo's orders", got)
	}
	if got := second.Endpoint(); got != "billing" {
		t.Errorf("second endpoint = %q, want billing", got)
	}
	second.Logger().Info("two")
	first.Logger().Info("one")
	sm.Outgoing(bus.OutgoingMessage{Name: "c", Attributes: bus.Attributes{MessageID: "m-3"}}).Logger().Info("three")
	logs := buf.String()
	for _, want := range []string{
		`"msg":"two","stage":"incoming","middleware":"tenancy","message_name":"b","message_id":"m-2"`,
		`"msg":"one","stage":"incoming","middleware":"tenancy","message_name":"a","message_id":"m-1"`,
		`"msg":"three","stage":"outgoing","middleware":"tenancy","message_name":"c","message_id":"m-3"`,
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %s\n%s", want, logs)
		}
	}
}

func dropTime(groups []string, a slog.Attr) slog.Attr {
	if len(groups) == 0 && a.Key == slog.TimeKey {
		return slog.Attr{}
	}
	return a
}

// A context given back to its StageMaker is reused for the next message
// (making it then allocates nothing) and reads and logs that message, not
// the one it was first made for.
func TestStageMakerReusesReleasedContexts(t *testing.T) {
	var buf bytes.Buffer
	sm := bus.NewStageMaker(bus.StageInfo{Middleware: "tenancy", Endpoint: "orders",
		Logger: slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{ReplaceAttr: dropTime}))})
	msg := func(id string) *bus.Delivery {
		return &bus.Delivery{Envelope: bus.Envelope{Name: "n-" + id, Attributes: bus.Attributes{MessageID: id}}, Attempt: 1}
	}
	first := sm.Incoming(msg("m-1"), "")
	first.Logger().Info("one")
	sm.ReleaseIncoming(first)
	second := sm.Incoming(msg("m-2"), "billing")
	second.Logger().Info("two")
	if second.Name() != "n-m-2" || second.Attributes().MessageID != "m-2" || second.Endpoint() != "billing" {
		t.Fatalf("reused context reads %s/%s at %s, want n-m-2/m-2 at billing", second.Name(), second.Attributes().MessageID, second.Endpoint())
	}
	sm.ReleaseIncoming(second)
	h := sm.Handling("invoicing", nil, msg("m-3"))
	h.Logger().Info("three")
	sm.ReleaseHandling(h)
	h = sm.Handling("shipping", nil, msg("m-4"))
	h.Logger().Info("four")
	if h.HandlerName() != "shipping" || h.MessageName() != "n-m-4" {
		t.Fatalf("reused handler context reads %s/%s, want shipping/n-m-4", h.HandlerName(), h.MessageName())
	}
	sm.ReleaseHandling(h)
	logs := buf.String()
	for _, want := range []string{
		`"msg":"one","stage":"incoming","middleware":"tenancy","message_name":"n-m-1","message_id":"m-1"`,
		`"msg":"two","stage":"incoming","middleware":"tenancy","message_name":"n-m-2","message_id":"m-2"`,
		`"msg":"three","stage":"handler","middleware":"tenancy","message_name":"n-m-3","message_id":"m-3","correlation_id":"","handler":"invoicing"`,
		`"msg":"four","stage":"handler","middleware":"tenancy","message_name":"n-m-4","message_id":"m-4","correlation_id":"","handler":"shipping"`,
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %s\n%s", want, logs)
		}
	}
	if testenv.RaceEnabled {
		return // sync.Pool drops released contexts at random under the race detector
	}
	d := msg("m-5")
	if n := testing.AllocsPerRun(100, func() { sm.ReleaseIncoming(sm.Incoming(d, "")) }); n != 0 {
		t.Errorf("making a released incoming context allocates %.1f times, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() { sm.ReleaseHandling(sm.Handling("invoicing", nil, d)) }); n != 0 {
		t.Errorf("making a released handler context allocates %.1f times, want 0", n)
	}
}
