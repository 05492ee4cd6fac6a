package bus_test

import (
	"context"
	"errors"
	"os/exec"
	"regexp"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
)

// What makes a layer one call: the compiler inlines each stage's
// next.Call into the middleware that calls it. A line more in Call can
// push it over the inlining budget, and every layer of every chain would
// cost a call more; the compiler's own report tells.
func TestNextCallIsInlined(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go command is not on PATH: cannot ask the compiler")
	}
	out, err := exec.Command(goTool, "build", "-gcflags=-m", "-o", "/dev/null", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build -gcflags=-m: %v\n%s", err, out)
	}
	for _, next := range []string{"IncomingNext", "HandlingNext", "OutgoingNext"} {
		if !regexp.MustCompile(`can inline \(\*` + next + `\)\.Call\b`).Match(out) {
			t.Errorf("(*bus.%s).Call is not inlinable any more: a layer costs two calls", next)
		}
	}
}

// A next made outside a bus runs once, like a bus's: a second call
// returns a NextMisuseError (naming the StageMaker's middleware for one it
// made) without calling the function, until Reset re-arms it.
func TestStandaloneNextRunsOnceUntilReset(t *testing.T) {
	calls := 0
	boom := errors.New("boom")
	fn := func(context.Context) error { calls++; return boom }
	ctx := context.Background()
	sm := bus.NewStageMaker(bus.StageInfo{Middleware: "tenancy"})
	for _, c := range []struct {
		next   bus.Next
		stage  bus.Stage
		naming string
	}{
		{bus.NewIncomingNext(fn), bus.StageIncoming, "middleware"},
		{bus.NewHandlingNext(fn), bus.StageHandler, "middleware"},
		{bus.NewOutgoingNext(fn), bus.StageOutgoing, "middleware"},
		{sm.IncomingNext(fn), bus.StageIncoming, "tenancy"},
		{sm.HandlingNext(fn), bus.StageHandler, "tenancy"},
		{sm.OutgoingNext(fn), bus.StageOutgoing, "tenancy"},
	} {
		calls = 0
		for round := range 2 {
			if err := c.next.Call(ctx); !errors.Is(err, boom) {
				t.Fatalf("%s round %d: first Call = %v, want the function's error", c.stage, round, err)
			}
			var nm *bus.NextMisuseError
			if err := c.next.Call(ctx); !errors.As(err, &nm) || nm.Stage != c.stage || nm.Middleware != c.naming || nm.AfterReturn {
				t.Fatalf("%s round %d: second Call = %v, want a NextMisuseError naming %q", c.stage, round, err, c.naming)
			}
			switch n := c.next.(type) {
			case *bus.IncomingNext:
				n.Reset()
			case *bus.HandlingNext:
				n.Reset()
			case *bus.OutgoingNext:
				n.Reset()
			}
		}
		if calls != 2 {
			t.Fatalf("%s: function called %d times, want 2 (once per round)", c.stage, calls)
		}
	}
}

// Reset does nothing to a bus's next: a middleware cannot re-arm its
// next to run the rest of the chain twice.
func TestResetDoesNotRearmABussNext(t *testing.T) {
	runs := make(chan string, 4)
	second := make(chan error, 1)
	b, err := bus.New(bus.WithEndpoint("reset"), bus.WithLogger(discard()),
		bus.WithMiddleware(bus.Middleware{Name: "rearm", Incoming: func(ctx context.Context, _ *bus.Incoming, next *bus.IncomingNext) error {
			if err := next.Call(ctx); err != nil {
				return err
			}
			next.Reset()
			second <- next.Call(ctx)
			return nil
		}}),
		bus.WithHandler(func(_ context.Context, _ orderPlaced, a bus.Attributes) error { runs <- a.MessageID; return nil }))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop(context.Background())
	d := &bus.Delivery{Envelope: bus.Envelope{Name: orderPlaced{}.MessageName(), ContentType: "application/json", Body: []byte(`{}`),
		Attributes: bus.NewAttributes("m-1", "m-1", time.Now(), nil, nil)}}
	if err := b.Deliver(t.Context(), d); err != nil {
		t.Fatal(err)
	}
	var nm *bus.NextMisuseError
	if err := <-second; !errors.As(err, &nm) || nm.Middleware != "rearm" {
		t.Fatalf("second Call after Reset = %v, want a NextMisuseError", err)
	}
	if len(runs) != 1 {
		t.Fatalf("handler ran %d times, want 1", len(runs))
	}
}
