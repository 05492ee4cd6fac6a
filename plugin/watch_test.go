package plugin_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/testenv"
	"github.com/plugbus/plugbus/plugin"
	"github.com/plugbus/plugbus/plugin/internal/scenarios"
)

// TestTheBusContextsEndCancelsTheInvocation: invocations that share a
// context (a running bus's handler context) share one watch of it per
// stream; its end still cancels the invocation in flight in the plugin,
// and the next invocation, with another context, runs on a stream that
// context's end did not cancel.
func TestTheBusContextsEndCancelsTheInvocation(t *testing.T) {
	eachPath(t, testTheBusContextsEndCancelsTheInvocation)
}

func testTheBusContextsEndCancelsTheInvocation(t *testing.T, path plugin.Option) {
	// An invocation timeout far beyond the test's bound: only ctx's end
	// can end the hanging invocation in time.
	p := load(t, "hang-on-header", path, plugin.WithStreams(1), plugin.WithInvocationTimeout(10*time.Minute))
	handled := make(chan struct{}, 8)
	b, err := bus.New(bus.WithEndpoint("svc"), bus.WithMiddleware(p), bus.WithLogger(testLogger(t)),
		bus.WithHandler(func(context.Context, Ping, bus.Attributes) error { handled <- struct{}{}; return nil }))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop(context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range 3 { // the second starts the stream's standing watch of ctx
		if err := b.Deliver(ctx, delivery(t, Ping{N: i}, nil)); err != nil {
			t.Fatalf("delivery %d: %v", i, err)
		}
		<-handled
	}
	hung := make(chan error, 1)
	go func() { hung <- b.Deliver(ctx, delivery(t, Ping{}, bus.Headers{scenarios.HangHeader: "1"})) }()
	// The invocation waits in the plugin until ctx ends.
	waitFor(t, "the fourth invocation", func() bool { return p.Stats().Invocations == 4 })
	cancel()
	select {
	case err := <-hung:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v, want context.Canceled", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("ctx ended and the invocation still runs in the plugin")
	}
	for i := range 2 {
		if err := b.Deliver(context.Background(), delivery(t, Ping{N: i}, nil)); err != nil {
			t.Fatalf("after ctx ended, delivery %d: %v", i, err)
		}
		<-handled
	}
	if s := p.Stats(); s.Crashes != 0 || s.Restarts != 0 {
		t.Fatalf("stats %+v: the plugin process was taken for failed", s)
	}
}

// TestACancellableContextCostsNoAllocation: in a running bus every
// invocation's context has a Done channel; delivering with one allocates
// no more per message than delivering with context.Background (a
// context.AfterFunc per invocation cost 2 allocations).
func TestACancellableContextCostsNoAllocation(t *testing.T) {
	if testenv.RaceEnabled {
		t.Skip("under the race detector sync.Pool drops items at random")
	}
	p := load(t, "pass")
	b, err := bus.New(bus.WithEndpoint("svc"), bus.WithMiddleware(p), bus.WithLogger(testLogger(t)),
		bus.WithHandler(func(context.Context, Ping, bus.Attributes) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop(context.Background())
	d := delivery(t, Ping{N: 1}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	allocs := func(ctx context.Context) float64 {
		return testing.AllocsPerRun(2000, func() {
			if err := b.Deliver(ctx, d); err != nil {
				t.Fatal(err)
			}
		})
	}
	background, cancellable := allocs(context.Background()), allocs(ctx)
	if cancellable > background+1 { // a gRPC buffer may tip the average by one
		t.Fatalf("%.2f allocations per message with a cancellable context, %.2f with context.Background", cancellable, background)
	}
	t.Logf("%.2f allocations per message with a cancellable context, %.2f with context.Background", cancellable, background)
}
