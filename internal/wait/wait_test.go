package wait_test

import (
	"context"
	"testing"
	"time"

	"github.com/plugbus/plugbus/internal/wait"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSleepWaitsTheDelay(t *testing.T) {
	begin := time.Now()
	if !wait.Sleep(context.Background(), 20*time.Millisecond) {
		t.Fatal("Sleep reported a stop without one")
	}
	if took := time.Since(begin); took < 20*time.Millisecond {
		t.Fatalf("Sleep(20ms) returned after %s", took)
	}
}

func TestSleepEndsWithTheContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan bool)
	go func() { done <- wait.Sleep(ctx, time.Hour) }()
	cancel()
	select {
	case elapsed := <-done:
		if elapsed {
			t.Fatal("Sleep reported the hour elapsed")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Sleep did not end with its context")
	}
}

func TestSleepWithoutDelay(t *testing.T) {
	if !wait.Sleep(context.Background(), 0) || !wait.Sleep(context.Background(), -time.Second) {
		t.Fatal("Sleep(0) reported a stop without one")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if wait.Sleep(ctx, 0) {
		t.Fatal("Sleep(0) on a done context reported the delay elapsed")
	}
}
