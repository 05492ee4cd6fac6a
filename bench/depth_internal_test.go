package bench

import (
	"context"
	"errors"
	"testing"
)

// The one-call chains are reference points of the depth suite: their
// check must be a real one, and every operation must reach the handler.
func TestOneCallChains(t *testing.T) {
	for _, checked := range []bool{false, true} {
		op, err := oneCallChain(4, checked)
		if err != nil {
			t.Fatal(err)
		}
		for range 3 { // the records are reset by each operation
			if err := op(); err != nil {
				t.Fatalf("checked=%v: %v", checked, err)
			}
		}
	}

	runs := 0
	inner := &oneCallHop{fn: func(context.Context, *bareStage, *oneCallHop) error { runs++; return nil }, ret: hopFresh}
	twice := func(ctx context.Context, next *oneCallHop) error {
		if err := next.NextOnce(ctx); err != nil {
			return err
		}
		return next.NextOnce(ctx)
	}
	if err := twice(context.Background(), inner); !errors.Is(err, errNextTwice) || runs != 1 {
		t.Fatalf("a second next: %v, the layer after it ran %d times; want errNextTwice and once", err, runs)
	}
}
