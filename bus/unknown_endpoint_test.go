package bus_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/plugbus/plugbus/bus"
)

// The error of an unknown endpoint names it, suggests a known endpoint a
// typo away, and lists the known ones; without them it says to check the
// name.
func TestUnknownEndpointErrorSuggests(t *testing.T) {
	known := []string{"billing", "orders", "shipping"}
	for _, c := range []struct {
		endpoint string
		known    []string
		want     []string
		not      []string
	}{
		{"ordrs", known, []string{`endpoint "ordrs" does not exist`, `did you mean "orders"?`, "billing, orders, shipping"}, nil},
		{"Shiping", known, []string{`did you mean "shipping"?`}, nil},
		{"oredrs", known, []string{`did you mean "orders"?`}, nil}, // two letters swapped: one edit
		{"inventory", known, []string{"known endpoints: billing, orders, shipping"}, []string{"did you mean"}},
		{"x", known, []string{"known endpoints:"}, []string{"did you mean"}},
		{"orders", []string{}, []string{"knows no endpoint"}, []string{"did you mean"}},
		{"orders", nil, []string{"check the name"}, []string{"known endpoints", "did you mean"}},
		// A replay's destination known by its dead letters alone.
		{"orders", known, []string{`endpoint "orders" has no queue`}, []string{"did you mean"}},
	} {
		err := fmt.Errorf("wrapped: %w", &bus.UnknownEndpointError{Endpoint: c.endpoint, Known: c.known})
		if !errors.Is(err, bus.ErrUnknownEndpoint) {
			t.Errorf("%v is not bus.ErrUnknownEndpoint", err)
		}
		msg := err.Error()
		for _, w := range c.want {
			if !strings.Contains(msg, w) {
				t.Errorf("%s among %q: %q, want %q in it", c.endpoint, c.known, msg, w)
			}
		}
		for _, n := range c.not {
			if strings.Contains(msg, n) {
				t.Errorf("%s among %q: %q, want no %q in it", c.endpoint, c.known, msg, n)
			}
		}
	}
	many := make([]string, 30)
	for i := range many {
		many[i] = fmt.Sprintf("endpoint-%02d", i)
	}
	if msg := (&bus.UnknownEndpointError{Endpoint: "nope", Known: many}).Error(); !strings.Contains(msg, "and 10 more") || strings.Contains(msg, "endpoint-29") {
		t.Errorf("30 known endpoints: %q, want the first 20 and the number of the others", msg)
	}
}
