package otel_test

import (
	"slices"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugins/otel"
)

func TestOutgoingCarrier(t *testing.T) {
	attrs := bus.NewAttributes("m-1", "c-1", time.Now(), map[string]string{"tenant": "acme"}, map[string]string{"sticky": "s"})
	out := bus.NewOutgoing(bus.OutgoingMessage{Kind: bus.KindSend, Name: "PlaceOrder", Attributes: attrs}, bus.StageInfo{})
	c := otel.OutgoingCarrier(out)
	c.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	if got := c.Get("traceparent"); got != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" {
		t.Errorf("Get(traceparent) = %q", got)
	}
	if got := c.Get("missing"); got != "" {
		t.Errorf("Get(missing) = %q, want empty", got)
	}
	if got := slices.Sorted(slices.Values(c.Keys())); !slices.Equal(got, []string{"tenant", "traceparent"}) {
		t.Errorf("Keys() = %v, want the one-hop attributes tenant and traceparent", got)
	}
	if v, _ := out.Attributes().Value("traceparent"); v == "" {
		t.Errorf("Set did not reach the message's attributes")
	}
	if _, ok := attrs.Value("traceparent"); ok {
		t.Errorf("Set changed the attributes the message was built from")
	}
}

func TestAttributesCarrier(t *testing.T) {
	attrs := bus.NewAttributes("m-1", "c-1", time.Now(), map[string]string{"traceparent": "tp", "baggage": "k=v"}, nil)
	c := otel.AttributesCarrier(attrs)
	if c.Get("traceparent") != "tp" || c.Get("baggage") != "k=v" || c.Get("nope") != "" {
		t.Errorf("Get: traceparent=%q baggage=%q nope=%q", c.Get("traceparent"), c.Get("baggage"), c.Get("nope"))
	}
	c.Set("traceparent", "changed")
	if c.Get("traceparent") != "tp" {
		t.Errorf("Set changed received attributes")
	}
	if got := slices.Sorted(slices.Values(c.Keys())); !slices.Equal(got, []string{"baggage", "traceparent"}) {
		t.Errorf("Keys() = %v", got)
	}
}
