package bus_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

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

// Looking for a suggestion among many endpoints for a long name (a
// console address of any length) skips the names too different in length
// to be near: it computed the edit distance to every one, for minutes.
func TestUnknownEndpointErrorOfALongName(t *testing.T) {
	known := make([]string, 100)
	for i := range known {
		known[i] = fmt.Sprintf("endpoint-number-%04d", i)
	}
	e := &bus.UnknownEndpointError{Endpoint: strings.Repeat("x", 256<<10), Known: known}
	start := time.Now()
	msg := e.Error()
	// The distances took about 20 s with -race on a busy machine; what
	// remains takes about a millisecond.
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("the error of a 256 KiB name among %d endpoints took %v to write", len(known), took)
	}
	if strings.Contains(msg, "did you mean") {
		t.Errorf("a suggestion for a 256 KiB name: %.200s", msg)
	}
	near := &bus.UnknownEndpointError{Endpoint: "ENDPOINT-NUMBR-0042", Known: known}
	if msg := near.Error(); !strings.Contains(msg, `did you mean "endpoint-number-0042"?`) {
		t.Errorf("%.200s, want endpoint-number-0042 suggested", msg)
	}
}

// A replay's destination without a queue, on a transport that cannot
// list its endpoints, is said to have no queue: it may well exist, with
// its dead letters.
func TestUnknownDestinationError(t *testing.T) {
	msg := (&bus.UnknownEndpointError{Endpoint: "orders", Destination: true}).Error()
	if !strings.Contains(msg, `endpoint "orders" has no queue`) || strings.Contains(msg, "does not exist") {
		t.Errorf("%q, want it to say that orders has no queue, not that it does not exist", msg)
	}
}
