package memory_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/memory"
)

func receiveWithin(t *testing.T, tr *memory.Transport, d time.Duration) *bus.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	got, err := tr.Receive(ctx)
	if err != nil {
		t.Fatalf("Receive: %v", err)
	}
	return got
}

// A message delayed for an hour never holds back one delayed for a few
// milliseconds, and a delayed message comes back no earlier than its
// delay, with its attempt raised and its retry history.
func TestReturnAfterHasNoHeadOfLineBlocking(t *testing.T) {
	tr := memory.New()
	if err := tr.Setup(t.Context(), bus.Topology{Endpoint: "delays", MaxAttempts: 5}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Close(context.Background()) })
	for _, name := range []string{"late", "soon"} {
		if err := tr.Send(t.Context(), &bus.Envelope{Name: name, Attributes: bus.NewAttributes(name, name, time.Now(), nil, nil)}, "delays"); err != nil {
			t.Fatal(err)
		}
	}
	late := receiveWithin(t, tr, time.Second)
	soon := receiveWithin(t, tr, time.Second)
	if err := tr.ReturnAfter(t.Context(), late, errors.New("later"), time.Hour); err != nil {
		t.Fatal(err)
	}
	soon.Retries.Delayed = 1
	returned := time.Now()
	if err := tr.ReturnAfter(t.Context(), soon, errors.New("soon"), 30*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if n := tr.Broker().Delayed(); n != 2 {
		t.Fatalf("Delayed() = %d, want 2", n)
	}
	got := receiveWithin(t, tr, 2*time.Second)
	if waited := time.Since(returned); waited < 30*time.Millisecond {
		t.Errorf("delivered after %v, before its 30ms delay", waited)
	}
	if got.Name != "soon" || got.Attempt != 2 || got.Retries.Delayed != 1 {
		t.Errorf("got %s attempt %d with %d delayed rounds, want soon, 2, 1", got.Name, got.Attempt, got.Retries.Delayed)
	}
	if n := tr.Broker().Delayed(); n != 1 {
		t.Errorf("Delayed() = %d, want 1: the hour-long one still waits", n)
	}
	if err := tr.Delete(t.Context(), got); err != nil {
		t.Fatal(err)
	}
}

// Delayed messages come back in the order of their due times.
func TestReturnAfterDeliversInDueOrder(t *testing.T) {
	tr := memory.New()
	if err := tr.Setup(t.Context(), bus.Topology{Endpoint: "due-order", MaxAttempts: 5}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Close(context.Background()) })
	delays := map[string]time.Duration{"c": 60 * time.Millisecond, "a": 20 * time.Millisecond, "b": 40 * time.Millisecond}
	for name := range delays {
		if err := tr.Send(t.Context(), &bus.Envelope{Name: name}, "due-order"); err != nil {
			t.Fatal(err)
		}
	}
	for range delays {
		d := receiveWithin(t, tr, time.Second)
		if err := tr.ReturnAfter(t.Context(), d, nil, delays[d.Name]); err != nil {
			t.Fatal(err)
		}
	}
	var order string
	for range delays {
		d := receiveWithin(t, tr, 2*time.Second)
		order += d.Name
		_ = tr.Delete(t.Context(), d)
	}
	if order != "abc" {
		t.Errorf("delivered in the order %q, want abc", order)
	}
}
