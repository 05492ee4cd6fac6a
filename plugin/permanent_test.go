package plugin_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugin"
	"github.com/plugbus/plugbus/plugin/internal/scenarios"
	"github.com/plugbus/plugbus/transports/memory"
)

// settlements is a memory transport that reports each Return and Fail.
type settlements struct {
	bus.Transport
	returned chan int // attempt
	failed   chan bus.Failure
}

func (s *settlements) Return(ctx context.Context, d *bus.Delivery, cause error) error {
	s.returned <- d.Attempt
	return s.Transport.Return(ctx, d, cause)
}

func (s *settlements) Fail(ctx context.Context, d *bus.Delivery, f bus.Failure) error {
	s.failed <- f
	return s.Transport.Fail(ctx, d, f)
}

// A plugin's permanent failure crosses the process boundary: in the
// incoming stage, in the handler stage, and as the bus's own kind (a
// decode error the plugin made), the message is dead-lettered on its first
// attempt with the plugin's reason, and the host sees the error as
// permanent (errors.Is(err, bus.ErrPermanent) for a marked one).
func TestPluginPermanentErrorDeadLettersOnFirstAttempt(t *testing.T) {
	for _, c := range []struct {
		scenario string
		marked   bool // returned through bus.Permanent
	}{
		{"permanent", true},
		{"handler-permanent", true},
		{"decode", false},
	} {
		t.Run(c.scenario, func(t *testing.T) {
			p := load(t, c.scenario)
			tr := &settlements{Transport: memory.New(), returned: make(chan int, 10), failed: make(chan bus.Failure, 10)}
			b, err := bus.New(bus.WithEndpoint("svc"), bus.WithTransport(tr), bus.WithMiddleware(p), bus.WithLogger(testLogger(t)),
				bus.WithMaxAttempts(5), bus.WithHandler(func(context.Context, Ping, bus.Attributes) error { return nil }))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := b.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer b.Stop(ctx)

			derr := b.Deliver(ctx, delivery(t, Ping{}, nil))
			var pe *plugin.Error
			if !bus.IsPermanent(derr) || !errors.As(derr, &pe) || pe.Plugin != scenarios.Name || !strings.Contains(pe.Message, scenarios.PermanentReason) {
				t.Fatalf("Deliver = %v, want the plugin's *plugin.Error, permanent", derr)
			}
			if c.marked && !errors.Is(derr, bus.ErrPermanent) {
				t.Fatalf("errors.Is(%v, bus.ErrPermanent) = false", derr)
			}

			if err := b.Send(ctx, Ping{N: 1}, bus.To("svc")); err != nil {
				t.Fatal(err)
			}
			select {
			case f := <-tr.failed:
				if f.Attempts != 1 || !strings.Contains(f.Reason, scenarios.PermanentReason) || !strings.Contains(f.Reason, "permanent") {
					t.Fatalf("dead-lettered after %d attempt(s) with %q, want 1 and the plugin's permanent reason", f.Attempts, f.Reason)
				}
			case a := <-tr.returned:
				t.Fatalf("attempt %d returned for retry, want it dead-lettered at once", a)
			case <-ctx.Done():
				t.Fatal("not dead-lettered within a minute")
			}
		})
	}
}

// A plugin that marks the host's transient failure permanent (wrapping
// next's error) makes the message dead-lettered at once, and the host's
// error is still inside.
func TestPluginMarkingNextsErrorPermanent(t *testing.T) {
	p := load(t, "mark-after")
	b, err := bus.New(bus.WithEndpoint("svc"), bus.WithMiddleware(p), bus.WithLogger(testLogger(t)),
		bus.WithHandler(func(context.Context, Ping, bus.Attributes) error { return errHandler }))
	if err != nil {
		t.Fatal(err)
	}
	derr := deliverOnce(t, b)
	var rejected *bus.HandlerDispatchRejectedError
	if !errors.Is(derr, bus.ErrPermanent) || !errors.As(derr, &rejected) || !errors.Is(derr, errHandler) {
		t.Fatalf("Deliver = %v, want the handler's error, marked permanent", derr)
	}
}
