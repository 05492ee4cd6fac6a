package otel

import (
	"go.opentelemetry.io/otel/propagation"

	"github.com/plugbus/plugbus/bus"
)

// OutgoingCarrier returns a carrier over the one-hop attributes of a
// message being sent, for an outgoing middleware that injects a context of
// its own with a propagator.
func OutgoingCarrier(out *bus.Outgoing) propagation.TextMapCarrier { return outgoingCarrier{out} }

type outgoingCarrier struct{ out *bus.Outgoing }

func (c outgoingCarrier) Get(key string) string {
	v, _ := c.out.Attributes().Value(key)
	return v
}

func (c outgoingCarrier) Set(key, value string) { c.out.SetValue(key, value) }

func (c outgoingCarrier) Keys() []string { return keys(c.out.Attributes()) }

// AttributesCarrier returns a read-only carrier over the one-hop attributes
// of a received message, to extract the sender's context with a
// propagator; its Set does nothing, as received attributes are immutable.
func AttributesCarrier(a bus.Attributes) propagation.TextMapCarrier { return attributesCarrier{a} }

type attributesCarrier struct{ a bus.Attributes }

func (c attributesCarrier) Get(key string) string {
	v, _ := c.a.Value(key)
	return v
}

func (attributesCarrier) Set(string, string) {}

func (c attributesCarrier) Keys() []string { return keys(c.a) }

// incomingCarrier reads the attributes of a received message without
// copying them into an interface.
type incomingCarrier struct{ in *bus.Incoming }

func (c incomingCarrier) Get(key string) string {
	v, _ := c.in.Attributes().Value(key)
	return v
}

func (incomingCarrier) Set(string, string) {}

func (c incomingCarrier) Keys() []string { return keys(c.in.Attributes()) }

func keys(a bus.Attributes) []string {
	n, _ := a.Len()
	ks := make([]string, 0, n)
	for k := range a.Values() {
		ks = append(ks, k)
	}
	return ks
}

var (
	_ propagation.TextMapCarrier = outgoingCarrier{}
	_ propagation.TextMapCarrier = attributesCarrier{}
	_ propagation.TextMapCarrier = incomingCarrier{}
)
