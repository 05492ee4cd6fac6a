package bus_test

import (
	"context"
	"errors"
	"os/exec"
	"regexp"
	"testing"

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

// A next made outside a bus calls its function on every call: the
// function decides what a second call does.
func TestStandaloneNextCallsItsFunctionEachTime(t *testing.T) {
	calls := 0
	boom := errors.New("boom")
	fn := func(context.Context) error { calls++; return boom }
	ctx := context.Background()
	in, h, out := bus.NewIncomingNext(fn), bus.NewHandlingNext(fn), bus.NewOutgoingNext(fn)
	for range 2 {
		for _, n := range []bus.Next{in, h, out} {
			if err := n.Call(ctx); !errors.Is(err, boom) {
				t.Fatalf("Call = %v, want the function's error", err)
			}
		}
	}
	if calls != 6 {
		t.Fatalf("function called %d times, want 6", calls)
	}
}
