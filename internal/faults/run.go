package faults

import (
	"context"
	"testing"
	"time"
)

// Case is one fault injected under a stream of messages.
type Case struct {
	Name   string
	Toxics []Toxic
	// Hold keeps the fault this long; or, with UntilLogs set, until log
	// messages containing each of UntilLogs say the client noticed it.
	Hold      time.Duration
	UntilLogs []string
	// ReplacedLog, with UntilLogs, is the message logged once the
	// connection is replaced: Report.Replacement is measured to it.
	ReplacedLog string
	// MaxDetection bounds how long noticing the fault (every one of
	// UntilLogs) may take.
	MaxDetection time.Duration
	// Trigger, when set, starts the fault instead of the fifth message
	// sent: it is closed by whoever injected the fault (a handler adding
	// Toxics in the middle of its transaction, say); Toxics are then not
	// added by Run.
	Trigger <-chan struct{}
}

// Target is what a case runs against: the proxy in front of the service,
// the bus's logs, and how to send message id and count dead letters.
type Target struct {
	Proxy        *Proxy
	Logs         *Logs
	Tally        *Tally
	PerSecond    float64
	InFlight     int
	Send         func(ctx context.Context, id int) error
	DeadLettered func(ctx context.Context) (int, error)
	// LostLog is the message the client logs when it loses its
	// connection: Report.Reconnects counts them.
	LostLog string
}

// Run streams the target's messages, injects c once a fifth of them were
// sent, clears it, waits until every message was handled and returns the
// report. It fails t unless nothing was lost and nothing dead-lettered.
func Run(ctx context.Context, t testing.TB, c Case, tg Target) Report {
	t.Helper()
	streamed := Stream(ctx, tg.Tally, tg.PerSecond, tg.InFlight, tg.Send)
	if c.Trigger != nil {
		select {
		case <-c.Trigger:
		case <-ctx.Done():
			t.Fatalf("%s: the fault was never triggered: %v", c.Name, tg.Tally.Report(c.Name, 0, time.Now()))
		}
	} else {
		select {
		case <-tg.Tally.SentReached(tg.Tally.n / 5):
		case <-ctx.Done():
			t.Fatalf("%s: the stream did not start: %v", c.Name, tg.Tally.Report(c.Name, 0, time.Now()))
		}
		tg.Proxy.Add(t, c.Toxics...)
	}
	start := time.Now()
	var detection, replacement time.Duration
	if len(c.UntilLogs) > 0 {
		bound, cancel := context.WithTimeout(ctx, c.MaxDetection)
		for _, msg := range c.UntilLogs {
			r, ok := tg.Logs.Await(bound, msg, start)
			if !ok {
				cancel()
				tg.Proxy.Clear()
				t.Fatalf("%s: no log %q within %v of the fault", c.Name, msg, c.MaxDetection)
			}
			detection = max(detection, r.At.Sub(start))
			t.Logf("%s: noticed after %v: %s %s", c.Name, r.At.Sub(start).Round(time.Millisecond), r.Msg, r.Attrs)
		}
		cancel()
	} else {
		select {
		case <-time.After(c.Hold):
		case <-ctx.Done():
		}
	}
	end := time.Now() // clearing a latency toxic waits for the bytes it holds
	tg.Proxy.Clear()
	if c.ReplacedLog != "" {
		r, ok := tg.Logs.Await(ctx, c.ReplacedLog, start.Add(detection))
		if !ok {
			t.Fatalf("%s: no log %q after the fault was cleared", c.Name, c.ReplacedLog)
		}
		replacement = r.At.Sub(start.Add(detection))
	}
	select {
	case <-streamed:
	case <-ctx.Done():
	}
	select {
	case <-tg.Tally.All():
	case <-ctx.Done():
	}
	dead, err := tg.DeadLettered(context.WithoutCancel(ctx))
	if err != nil {
		t.Errorf("%s: counting dead letters: %v", c.Name, err)
	}
	r := tg.Tally.Report(c.Name, dead, end)
	r.Detection, r.Replacement = detection, replacement
	if tg.LostLog != "" {
		r.Reconnects = tg.Logs.Count(tg.LostLog)
	}
	t.Log(r)
	if r.Lost > 0 || r.Unique < tg.Tally.n || r.DeadLettered > 0 {
		t.Errorf("%s: %d of %d handled, %d sent and lost, %d dead-lettered", c.Name, r.Unique, tg.Tally.n, r.Lost, r.DeadLettered)
	}
	if r.Recovery < 0 {
		t.Errorf("%s: no message sent after the fault was cleared was handled", c.Name)
	}
	return r
}
