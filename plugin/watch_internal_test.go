package plugin

import (
	"context"
	"testing"
	"time"
)

// TestStandingWatch: the second invocation in a row with one Done channel
// starts a standing watch of it, which later invocations with that
// channel share and any other channel ends; when the channel closes while
// the stream is idle, the stream is cancelled and not handed out again.
func TestStandingWatch(t *testing.T) {
	_, proc := fakeProcess(t, nil)
	cs, err := proc.acquire()
	if err != nil {
		t.Fatal(err)
	}
	ctx1, cancel1 := context.WithCancel(context.Background())
	defer cancel1()
	stop, ok := cs.watch(ctx1)
	if !ok || stop == nil || cs.watched != nil {
		t.Fatalf("first invocation: stop %v, ok %v, watched %v; want a watch of its own", stop != nil, ok, cs.watched != nil)
	}
	if !stop() {
		t.Fatal("the invocation's watch had fired")
	}
	if stop, ok := cs.watch(ctx1); !ok || stop != nil || cs.watched != ctx1.Done() {
		t.Fatalf("second invocation: stop %v, ok %v; want the standing watch of ctx1", stop != nil, ok)
	}
	type key struct{}
	if stop, ok := cs.watch(context.WithValue(ctx1, key{}, 1)); !ok || stop != nil || cs.watched != ctx1.Done() {
		t.Fatalf("a context derived without a Done of its own: stop %v, ok %v; want the standing watch", stop != nil, ok)
	}

	// Another channel ends the standing watch: ctx1's end would cancel an
	// invocation that is not its own.
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	stop, ok = cs.watch(ctx2)
	if !ok || stop == nil || cs.watched != nil || cs.unwatch != nil {
		t.Fatalf("ctx2 after ctx1's standing watch: stop %v, ok %v, watched %v", stop != nil, ok, cs.watched != nil)
	}
	stop()
	if stop, ok := cs.watch(context.Background()); !ok || stop != nil || cs.watched != nil {
		t.Fatalf("no Done channel: stop %v, ok %v, watched %v", stop != nil, ok, cs.watched != nil)
	}
	if stop, _ := cs.watch(ctx2); stop == nil || !stop() { // a watch of its own again: the previous invocation had none
		t.Fatal("ctx2 after no Done channel: no watch of its own")
	}
	if stop, ok := cs.watch(ctx2); !ok || stop != nil || cs.watched != ctx2.Done() {
		t.Fatalf("ctx2 twice: stop %v, ok %v; want the standing watch of ctx2", stop != nil, ok)
	}

	// ctx2 ends while the stream is idle.
	proc.release(cs)
	cancel2()
	select {
	case <-cs.rpc.(*fakeCall).ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("ctx2 ended and the stream was not cancelled")
	}
	if !cs.watchFired.Load() {
		t.Fatal("stream cancelled, watchFired not set")
	}
	other, err := proc.acquire()
	if err != nil {
		t.Fatal(err)
	}
	if other == cs {
		t.Fatal("the cancelled stream was handed out again")
	}
	proc.poolMu.Lock()
	_, open := proc.open[cs]
	proc.poolMu.Unlock()
	if open {
		t.Fatal("the cancelled stream is still open")
	}

	// A standing watch that fired while its stream was held: another
	// channel cannot take the stream over (acquireFor abandons it).
	ctx3, cancel3 := context.WithCancel(context.Background())
	cs3 := other
	if stop, _ := cs3.watch(ctx3); stop == nil || !stop() {
		t.Fatal("ctx3: no watch of its own")
	}
	cs3.watch(ctx3)
	cancel3()
	<-cs3.rpc.(*fakeCall).ctx.Done()
	if _, ok := cs3.watch(context.Background()); ok {
		t.Fatal("a stream whose standing watch fired was kept for another context")
	}
	cs3.abandon()
}

// TestStopEndsTheStandingWatches: stopping the process ends the standing
// watch of every idle stream (its goroutine: goleak checks the package),
// and a stream released after stop's sweep is abandoned.
func TestStopEndsTheStandingWatches(t *testing.T) {
	_, proc := fakeProcess(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var streams []*callStream
	var unwatches []func() bool
	for range 3 {
		cs := standingStream(t, proc, ctx)
		streams = append(streams, cs)
		unwatches = append(unwatches, cs.unwatch)
	}
	held := streams[2]
	proc.release(streams[0])
	proc.release(streams[1])
	proc.stop()
	proc.release(held)
	for i, cs := range streams {
		// ctx is live: a watch that stops now was still running.
		if cs.unwatch != nil || cs.watched != nil || unwatches[i]() {
			t.Fatalf("stream %d kept its standing watch", i)
		}
	}
	if len(proc.idle) != 0 || len(proc.open) != 0 {
		t.Fatalf("%d idle, %d open streams after stop", len(proc.idle), len(proc.open))
	}
}

// TestSendReleaseEndsAStandingWatch: the Release goes out on a stream
// that no other invocation's context can cancel.
func TestSendReleaseEndsAStandingWatch(t *testing.T) {
	_, proc := fakeProcess(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cs := standingStream(t, proc, ctx)
	unwatch := cs.unwatch
	proc.release(cs)
	proc.sendRelease(7)
	if cs.watched != nil || unwatch() {
		t.Fatal("the Release's stream kept the standing watch of another context")
	}
	if got, err := proc.acquire(); err != nil || got != cs {
		t.Fatalf("acquire after the Release: %p, %v; want the same stream back", got, err)
	}
}

// standingStream returns a stream of proc with a standing watch of ctx:
// two invocations' watches in a row, the first stopped as its invocation
// ends.
func standingStream(t *testing.T, proc *process, ctx context.Context) *callStream {
	t.Helper()
	cs, err := proc.acquire()
	if err != nil {
		t.Fatal(err)
	}
	if stop, _ := cs.watch(ctx); stop == nil || !stop() {
		t.Fatal("no watch of its own")
	}
	if stop, ok := cs.watch(ctx); !ok || stop != nil || cs.watched != ctx.Done() {
		t.Fatal("no standing watch")
	}
	return cs
}
