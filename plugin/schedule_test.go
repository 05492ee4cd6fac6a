package plugin_test

import (
	"context"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugin/internal/scenarios"
)

// delayingCapture is a capture transport that carries delays of up to a
// day, so that the bus accepts due times.
type delayingCapture struct{ capture }

func (*delayingCapture) ReturnAfter(context.Context, *bus.Delivery, error, time.Duration) error {
	return nil
}
func (*delayingCapture) MaxDelay() time.Duration { return 24 * time.Hour }

// An outgoing middleware reads and changes the due time of a message the
// same way in process and out of process.
func TestOutgoingDueInAndOutOfProcess(t *testing.T) {
	at := time.Now().Add(10 * time.Minute).Round(0)
	run := func(p bus.Plugin, opts ...bus.SendOption) *bus.Envelope {
		t.Helper()
		tr := &delayingCapture{}
		b, err := bus.New(bus.WithTransport(tr), bus.WithMiddleware(p), bus.WithLogger(testLogger(t)))
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if err := b.Start(ctx); err != nil {
			t.Fatal(err)
		}
		perr := b.Publish(ctx, Ping{N: 1}, opts...)
		if err := b.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if perr != nil || len(tr.envs) != 1 {
			t.Fatalf("Publish: %v, %d sent", perr, len(tr.envs))
		}
		return tr.envs[0]
	}
	for name, p := range map[string]bus.Plugin{"in process": scenarios.New("due"), "out of process": load(t, "due")} {
		t.Run(name, func(t *testing.T) {
			e := run(p, bus.At(at))
			if got, want := e.Headers["x-due"], at.UTC().Format(time.RFC3339Nano); got != want {
				t.Errorf("middleware read due %q, want %q", got, want)
			}
			if want := at.Add(time.Minute); !e.Due.Equal(want) {
				t.Errorf("sent with due %v, want %v", e.Due, want)
			}
			before := time.Now()
			e = run(p)
			if e.Headers["x-due"] != "none" || e.Due.Before(before.Add(time.Minute)) {
				t.Errorf("without a due time: middleware read %q, sent with due %v; want none and a minute from now", e.Headers["x-due"], e.Due)
			}
		})
	}
}
