package sqs_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/sqstest"
	"github.com/plugbus/plugbus/transports/sqs"
)

// startRetryingBus starts a bus of endpoint on a fresh transport with
// policy and handler, recording each handled attempt; stopped when the
// test ends. It returns a probe transport on the same prefix.
func startRetryingBus(ctx context.Context, t *testing.T, endpoint string, policy bus.RetryPolicy, handler func(context.Context, job, bus.Attributes) error) (*sqs.Transport, chan int) {
	t.Helper()
	cfg := awsConfig(t)
	prefix := sqstest.UniquePrefix(t, cfg)
	attempts := make(chan int, 100)
	b, err := bus.New(bus.WithEndpoint(endpoint), bus.WithTransport(sqstest.New(t, cfg, sqstest.FastOptions(prefix)...)), bus.WithLogger(slog.New(slog.DiscardHandler)),
		bus.WithRetry(policy), bus.WithHandler(handler),
		bus.WithMiddleware(bus.Middleware{Name: "attempts", Handling: func(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
			attempts <- h.Attempt()
			return next.Call(ctx)
		}}))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Stop(context.Background()); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	probe := sqstest.New(t, cfg, sqstest.FastOptions(prefix)...)
	t.Cleanup(func() { _ = probe.Close(context.Background()) })
	if err := b.Send(ctx, job{N: 1}, bus.To(endpoint)); err != nil {
		t.Fatal(err)
	}
	return probe, attempts
}

// A message that keeps failing goes through the bus's rounds on SQS (an
// immediate retry in each, then a delay carried by a re-sent copy) and
// reaches the dead-letter queue with its retry history: the attempts, the
// delayed rounds, the first and last failure and the distinct errors,
// carried from copy to copy.
func TestDelayedRetriesDeadLetterWithTheRetryHistory(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	policy := bus.RetryPolicy{Immediate: 1, Delayed: 2, Backoff: bus.Backoff{Initial: time.Second, Max: time.Second}}
	var failures atomic.Int32
	began := time.Now()
	probe, attempts := startRetryingBus(ctx, t, "rounds", policy, func(context.Context, job, bus.Attributes) error {
		return fmt.Errorf("failure %d", failures.Add(1))
	})
	letters := sqstest.DeadLetters(ctx, t, probe, "rounds", 1)
	if len(letters) != 1 {
		t.Fatalf("%d dead letters, want 1", len(letters))
	}
	f := letters[0].Failure
	var got []int
	for len(attempts) > 0 {
		got = append(got, <-attempts)
	}
	if want := []int{1, 2, 3, 4, 5, 6}; !slices.Equal(got, want) {
		t.Errorf("attempts %v, want %v (two per round, three rounds)", got, want)
	}
	if f.Attempts != 6 || f.History.Delayed != 2 || f.History.Immediate(f.Attempts) != 3 {
		t.Errorf("failure: %d attempts, %d delayed, %d immediate; want 6, 2, 3", f.Attempts, f.History.Delayed, f.History.Immediate(f.Attempts))
	}
	var endings []string
	for _, e := range f.History.Errors {
		endings = append(endings, e[strings.LastIndex(e, ": ")+2:])
	}
	// SQS's immediate retries change the visibility of the message, which
	// cannot carry what they add: the history holds the errors of the
	// delayed returns and of the last failure.
	if want := []string{"failure 2", "failure 4", "failure 6"}; !slices.Equal(endings, want) {
		t.Errorf("history errors %q, want those ending %q", f.History.Errors, want)
	}
	if f.History.FirstFailure.Before(began) || !f.History.LastFailure.After(f.History.FirstFailure) {
		t.Errorf("first failure %v, last %v, test began %v", f.History.FirstFailure, f.History.LastFailure, began)
	}
}

// A failure that lasts longer than the immediate retries is healed by a
// delayed retry: the message is handled once, on the attempt after its
// delay, and nothing is dead-lettered.
func TestTransientFailureHealedByADelayedRetry(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	policy := bus.RetryPolicy{Immediate: 1, Delayed: 3, Backoff: bus.Backoff{Initial: time.Second, Max: time.Second}}
	handled := make(chan int, 10)
	var calls atomic.Int32
	probe, attempts := startRetryingBus(ctx, t, "heals", policy, func(context.Context, job, bus.Attributes) error {
		if n := calls.Add(1); n <= 2 { // down for the first round
			return fmt.Errorf("dependency down (call %d)", n)
		}
		handled <- int(calls.Load())
		return nil
	})
	select {
	case <-handled:
	case <-ctx.Done():
		t.Fatal("the message was never handled")
	}
	var got []int
	for len(attempts) > 0 {
		got = append(got, <-attempts)
	}
	if want := []int{1, 2, 3}; !slices.Equal(got, want) {
		t.Errorf("attempts %v, want %v", got, want)
	}
	quiet, stopWaiting := context.WithTimeout(ctx, 2*time.Second)
	defer stopWaiting()
	if letters := sqstest.DeadLetters(quiet, t, probe, "heals", 1); len(letters) != 0 {
		t.Errorf("%d dead letters, want none", len(letters))
	}
	select {
	case n := <-handled:
		t.Errorf("handled again (call %d)", n)
	default:
	}
}
