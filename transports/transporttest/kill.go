package transporttest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
)

// childEnv names the endpoint a child process of delayedSurvivesKill
// consumes from; set only in the child.
const childEnv = "PLUGBUS_TRANSPORTTEST_DELAY_CHILD"

// childReady starts the line the child prints once ReturnAfter returned,
// followed by when it was called, in Unix nanoseconds.
const childReady = "PLUGBUS-DELAYED "

// A message given to ReturnAfter survives the death of the process that
// delayed it: a consumer process returns it with a delay and is killed
// with SIGKILL at once; a consumer started afterwards receives it, no
// earlier than its delay, with its attempt raised.
func (s *suite) delayedSurvivesKill(t *testing.T) {
	if ep := os.Getenv(childEnv); ep != "" {
		s.delayInChild(t, ep)
		return
	}
	ep, name := Name("tt-kill"), Name("tt.msg")
	tr := s.open(t, ep, name)
	ctx := s.ctx(t)
	env := envelope(name, `{"survives":"kill -9"}`)
	if err := tr.Send(ctx, env, ep); err != nil {
		t.Fatal(err)
	}
	_ = tr.Close(ctx) // the child receives it

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	pattern := "^" + strings.ReplaceAll(t.Name(), "/", "$/^") + "$"
	cmd := exec.CommandContext(ctx, exe, "-test.run", pattern, "-test.count", "1")
	cmd.Env = append(os.Environ(), childEnv+"="+ep)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	var returned time.Time
	lines := bufio.NewScanner(out)
	for lines.Scan() {
		if at, ok := strings.CutPrefix(lines.Text(), childReady); ok {
			n, err := strconv.ParseInt(at, 10, 64)
			if err != nil {
				t.Fatalf("child: %q", lines.Text())
			}
			returned = time.Unix(0, n)
			break
		}
	}
	if returned.IsZero() {
		t.Fatalf("the child ended without delaying the message: %v", lines.Err())
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err == nil {
		t.Fatal("the child exited cleanly; it was to be killed")
	}

	next := s.open(t, ep, name)
	d := s.receive(t, next)
	delay := s.delayAcrossKill()
	if arrived := time.Now(); arrived.Before(returned.Add(delay)) {
		t.Errorf("delivered %v after ReturnAfter, before its delay of %v", arrived.Sub(returned), delay)
	}
	if d.Attempt != 2 || d.Attributes.MessageID != env.Attributes.MessageID || string(d.Body) != `{"survives":"kill -9"}` {
		t.Errorf("after the kill: attempt %d, id %s, body %s; want attempt 2 of the same message", d.Attempt, d.Attributes.MessageID, d.Body)
	}
	if err := next.Delete(ctx, d); err != nil {
		t.Fatal(err)
	}
}

// delayAcrossKill is the delay of delayedSurvivesKill: long enough for
// the kill and a new consumer to come first.
func (s *suite) delayAcrossKill() time.Duration { return max(2*time.Second, 3*s.f.DelayUnit) }

// delayInChild is the child's side: receive the message, return it with
// a delay, say so, and wait to be killed.
func (s *suite) delayInChild(t *testing.T, ep string) {
	tr := s.newTransport(t)
	ctx, cancel := context.WithTimeout(context.Background(), s.f.Timeout)
	defer cancel()
	if err := tr.Setup(ctx, bus.Topology{Endpoint: ep, MaxAttempts: 5, Concurrency: 1}); err != nil {
		t.Fatalf("child: Setup: %v", err)
	}
	d, err := tr.Receive(ctx)
	if err != nil {
		t.Fatalf("child: Receive: %v", err)
	}
	at := time.Now()
	if err := tr.(bus.Delayer).ReturnAfter(ctx, d, errors.New("delayed, then killed"), s.delayAcrossKill()); err != nil {
		t.Fatalf("child: ReturnAfter: %v", err)
	}
	fmt.Printf("%s%d\n", childReady, at.UnixNano())
	<-ctx.Done() // killed before this
	t.Fatal("child: not killed")
}
