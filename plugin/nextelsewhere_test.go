package plugin_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugin"
	"github.com/plugbus/plugbus/sdk/sdktest"
)

// errGaveUp is what the timeout middleware below returns when it stops
// waiting for its next.
var errGaveUp = errors.New("gave up waiting for next")

// gated is a context whose Deadline says that it was called, then waits
// for open to close. Given to the plugin's next, it holds that next
// between its start and its Next frame, as a goroutine descheduled there
// would be, until the middleware returned.
type gated struct {
	context.Context
	entered chan<- struct{} // buffered: told once
	open    <-chan struct{}
}

func (g gated) Deadline() (time.Time, bool) {
	select {
	case g.entered <- struct{}{}:
	default:
	}
	<-g.open
	return g.Context.Deadline()
}

// giveUp is one message the timeout middleware gives up on.
type giveUp struct {
	late     bool          // the middleware returns before the Next frame left the plugin
	inNext   chan struct{} // the plugin's next started (late), or the host runs the rest (else)
	returned chan struct{} // the middleware returned
	nextErr  chan error    // what its next returned
}

// A middleware that calls next on another goroutine and returns before
// that next returned (a timeout that gives up) behaves out of process as
// in process when its next reached the rest of the chain: the host's
// chain returns the middleware's error; the rest of the chain the next
// started runs, once, and the next returns what the rest returned. The
// stream or session that carried the invocation carries the following
// ones unharmed: a message the middleware refuses is not handled, one it
// passes is, once. The middleware gives up while the host runs the rest
// of the chain, or ("late") while its next has not sent the Next frame
// yet, which then goes out all the same: the plugin answers the host
// only once that next returned.
func TestMiddlewareReturnsBeforeItsNext(t *testing.T) {
	eachPath(t, func(t *testing.T, path plugin.Option) {
		for _, late := range []bool{false, true} {
			name := "while the host runs next"
			if late {
				name = "before the next frame left"
			}
			t.Run(name, func(t *testing.T) { testMiddlewareReturnsBeforeItsNext(t, path, late) })
		}
	})
}

func testMiddlewareReturnsBeforeItsNext(t *testing.T, path plugin.Option, late bool) {
	rounds := make(chan *giveUp, 1)
	mw := bus.Middleware{Name: "timeout", Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
		switch role, _ := in.Header("x-role"); role {
		case "refused":
			return errors.New("refused")
		case "slow":
			r := <-rounds
			defer close(r.returned)
			nctx := ctx
			if r.late {
				nctx = gated{Context: ctx, entered: r.inNext, open: r.returned}
			}
			go func() { r.nextErr <- next.Call(nctx) }()
			<-r.inNext
			return errGaveUp
		}
		return next.Call(ctx)
	}}
	p := sdktest.Load(t, mw, sdktest.Wire, sdktest.WithHostOptions(path))
	var current atomic.Pointer[giveUp]
	var handled [3]atomic.Int32 // slow, refused, fast
	b, err := bus.New(bus.WithEndpoint("svc"), bus.WithMiddleware(p), bus.WithLogger(slog.New(slog.DiscardHandler)),
		bus.WithHandler(func(ctx context.Context, _ Ping, _ bus.Attributes) error {
			switch role, _ := bus.MessageHeader(ctx, "x-role"); role {
			case "slow":
				handled[0].Add(1)
				if r := current.Load(); !r.late {
					r.inNext <- struct{}{}
					<-r.returned // the rest outlives the middleware
				}
			case "refused":
				handled[1].Add(1)
			default:
				handled[2].Add(1)
			}
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := b.Stop(ctx); err != nil {
			t.Error(err)
		}
	}()
	const n = 5
	for i := range n {
		r := &giveUp{late: late, inNext: make(chan struct{}, 1), returned: make(chan struct{}), nextErr: make(chan error, 1)}
		current.Store(r)
		rounds <- r
		err := b.Deliver(ctx, delivery(t, Ping{N: i}, bus.Headers{"x-role": "slow"}))
		var pe *plugin.Error
		if !errors.As(err, &pe) || !strings.Contains(pe.Message, errGaveUp.Error()) {
			t.Fatalf("round %d: delivering the slow message returned %v; want the middleware's error", i, err)
		}
		err = b.Deliver(ctx, delivery(t, Ping{N: i}, bus.Headers{"x-role": "refused"}))
		if !errors.As(err, &pe) || pe.Message != "refused" || handled[1].Load() != 0 {
			t.Fatalf("round %d: delivering a refused message returned %v, and it was handled %d times; want the middleware's refusal, and never handled", i, err, handled[1].Load())
		}
		if err := b.Deliver(ctx, delivery(t, Ping{N: i}, bus.Headers{"x-role": "fast"})); err != nil || handled[2].Load() != int32(i+1) {
			t.Fatalf("round %d: delivering a message the middleware passes returned %v, and %d were handled; want nil and %d", i, err, handled[2].Load(), i+1)
		}
		select {
		case err := <-r.nextErr:
			if err != nil {
				t.Fatalf("round %d: the next the middleware gave up on returned %v; want what the rest of the chain returned (nil)", i, err)
			}
		case <-time.After(10 * time.Second): // a failure, not a synchronisation
			t.Fatalf("round %d: the next the middleware gave up on never returned", i)
		}
		if got := handled[0].Load(); got != int32(i+1) {
			t.Fatalf("round %d: the slow messages were handled %d times; want %d (each once)", i, got, i+1)
		}
	}
}
