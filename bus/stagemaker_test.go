package bus_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/plugbus/plugbus/bus"
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
