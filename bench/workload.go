package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
)

// OrderPlaced is the message of the workload: small, typed, JSON-encoded.
type OrderPlaced struct {
	ID       int     `json:"id"`
	Customer string  `json:"customer"`
	Amount   float64 `json:"amount"`
}

// MessageName is the wire name of OrderPlaced on every side.
func (OrderPlaced) MessageName() string { return "bench.order_placed" }

// order returns the i-th message of a round.
func order(i int) OrderPlaced { return OrderPlaced{ID: i, Customer: "customer-42", Amount: 12.5} }

// errBadMessage is returned by a handler that received a message that was
// not decoded: it keeps the decoding from being skipped anywhere.
var errBadMessage = errors.New("bench: handler received a message that was not decoded")

// Side is one system running the workload.
type Side interface {
	// Name names the side in tables, for example "plugbus".
	Name() string
	// Round sends n messages and returns once every one was handled. It
	// returns an error when ctx ends first.
	Round(ctx context.Context, n int) error
	// Close releases the side and whatever it declared on a broker.
	Close(ctx context.Context) error
}

// counter tells a round when its last message was handled.
type counter struct {
	handled atomic.Int64
	target  atomic.Int64
	done    chan struct{}
}

func newCounter() *counter { return &counter{done: make(chan struct{}, 1)} }

// handle counts one message handled.
func (c *counter) handle(m *OrderPlaced) error {
	if m.Customer == "" {
		return errBadMessage
	}
	if c.handled.Add(1) == c.target.Load() {
		c.done <- struct{}{}
	}
	return nil
}

// expect sets the target of a round of n messages. Call it before sending.
func (c *counter) expect(n int) { c.target.Store(c.handled.Load() + int64(n)) }

// wait blocks until the round's target is reached or ctx ends.
func (c *counter) wait(ctx context.Context, name string) error {
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("bench: %s: %d of %d messages handled: %w", name, c.handled.Load(), c.target.Load(), ctx.Err())
	}
}

// sendAll sends messages 1..n from senders goroutines and returns the
// first error.
func sendAll(ctx context.Context, n, senders int, send func(ctx context.Context, i int) error) error {
	if senders <= 1 {
		for i := 1; i <= n; i++ {
			if err := send(ctx, i); err != nil {
				return err
			}
		}
		return nil
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for range senders {
		wg.Go(func() {
			for {
				i := int(next.Add(1))
				if i > n {
					return
				}
				if err := send(ctx, i); err != nil {
					once.Do(func() { first = err })
					next.Store(int64(n)) // stop the others
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}

// quiet is the logger of every side: benchmarks log nothing.
var quiet = slog.New(slog.DiscardHandler)
