package bench_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/plugbus/plugbus/bench"
)

type next func(context.Context) error

var hopNoop = []func(context.Context, next) error{func(ctx context.Context, n next) error { return n(ctx) }}

// BenchmarkHopFloor measures what one middleware layer costs by the shape
// of its chain alone, no bus around it, so that the per-layer target of
// #17 (≤ 2× a Watermill handler middleware) can be read against a floor:
//
//   - wrap: Watermill's shape, a middleware returns the handler that calls
//     the inner one (one call per layer);
//   - next/locked=K: the shape plugbus had until its next became a
//     pointer whose method the compiler inlines (see the one-call chains
//     of the depth suite), a (ctx, next) middleware whose next is a
//     closure calling the inner middleware (two calls per layer: the
//     middleware is read from a variable, as a bus reads it, so that the
//     compiler cannot inline it into the closure), with K locked atomic
//     operations per hop. That pipeline made two (a compare-and-swap
//     when next was called, a swap when the layer returned).
//
// The cost of a layer is the difference between depth 16 and depth 0,
// divided by 16.
func BenchmarkHopFloor(b *testing.B) {
	type handler func(context.Context) error
	noop := hopNoop[0] // read from a variable: a bus's middleware cannot be inlined into its next either
	wrap := func(depth int) handler {
		h := handler(func(context.Context) error { return nil })
		for range depth {
			inner := h
			h = func(ctx context.Context) error { return inner(ctx) }
		}
		return h
	}
	chain := func(depth, locked int) handler {
		states := make([]atomic.Uint64, depth)
		var epoch atomic.Uint64
		epoch.Store(1)
		n := next(func(context.Context) error { return nil })
		for i := range depth {
			inner, st := n, &states[i]
			switch locked {
			case 0:
				n = func(ctx context.Context) error { return noop(ctx, inner) }
			case 1:
				n = func(ctx context.Context) error {
					st.Add(1) // one locked operation, as a single enter record would cost
					return noop(ctx, inner)
				}
			case 2:
				n = func(ctx context.Context) error {
					e := epoch.Load()
					if !st.CompareAndSwap(e-1, e) {
						return fmt.Errorf("layer %d: next twice", i)
					}
					err := noop(ctx, inner)
					st.Swap(e - 1)
					return err
				}
			}
		}
		return handler(n)
	}
	run := func(b *testing.B, h handler) {
		ctx := context.Background()
		for b.Loop() {
			if err := h(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	for _, depth := range []int{0, 16} {
		b.Run(fmt.Sprintf("wrap/depth=%d", depth), func(b *testing.B) { run(b, wrap(depth)) })
		for _, locked := range []int{0, 1, 2} {
			b.Run(fmt.Sprintf("next/locked=%d/depth=%d", locked, depth), func(b *testing.B) { run(b, chain(depth, locked)) })
		}
	}
}

// callUnder calls op under k more frames of its own.
//
//go:noinline
func callUnder(k int, op func() error) error {
	if k == 0 {
		return op()
	}
	return callUnder(k-1, op)
}

// BenchmarkLayerUnderFrames runs the depth suite's chains (plugbus
// incoming and handler, Watermill's) at 0 and 16 layers, called directly
// and under 12 more frames: what one more layer costs depends on how deep
// the stack already is (past the CPU's return-stack buffer a return is
// mispredicted), which is why a chain measured under a bus's own frames
// pays more per layer than the same chain called from a loop. Per layer:
// (frames=K/layers=16 − frames=K/layers=0) / 16.
func BenchmarkLayerUnderFrames(b *testing.B) {
	chains := bench.DepthChains()
	for _, name := range []string{"plugbus incoming", "plugbus handler", bench.WatermillChain} {
		var ch bench.Chain
		for _, c := range chains {
			if c.Name == name {
				ch = c
			}
		}
		for _, frames := range []int{0, 12} {
			for _, layers := range []int{0, 16} {
				b.Run(fmt.Sprintf("%s/frames=%d/layers=%d", name, frames, layers), func(b *testing.B) {
					op, err := ch.Build(layers)
					if err != nil {
						b.Fatal(err)
					}
					for b.Loop() {
						if err := callUnder(frames, op); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}
