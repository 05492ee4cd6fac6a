package memory_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/memory"
)

// Reading the depth of an endpoint that does not exist (a typo in
// `plugbus dlq`, the console's --endpoint) says so, and does not make it
// exist: Endpoints names the endpoints with a queue or dead letters.
func TestReadingFiguresMakesNoEndpoint(t *testing.T) {
	tr := memory.New()
	ctx := context.Background()
	if n, err := tr.QueueDepth(ctx, "no-such-endpoint"); !errors.Is(err, bus.ErrUnknownEndpoint) || n != 0 {
		t.Fatalf("QueueDepth = %d, %v; want bus.ErrUnknownEndpoint", n, err)
	}
	if _, err := tr.Delivered(ctx, "another-typo"); err != nil {
		t.Fatal(err)
	}
	eps, err := tr.Endpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(eps, "no-such-endpoint") || slices.Contains(eps, "another-typo") {
		t.Errorf("Endpoints = %v: reading a depth or a delivery count created the endpoint", eps)
	}
}
