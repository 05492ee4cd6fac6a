package faults

import (
	"context"
	"fmt"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Tally counts, for messages 0 to n-1, which were sent (the send
// returned nil) and how many times each was handled.
type Tally struct {
	n int

	mu             sync.Mutex
	sentAt         []time.Time // zero until sent
	handledAt      []time.Time // first handling
	handled        []int
	sent           int
	unique         int
	total          int
	sendErrors     int
	firstSendError error
	reached        []reachWaiter
	all            chan struct{}
}

type reachWaiter struct {
	k  int
	ch chan struct{}
}

// NewTally returns a tally of n messages.
func NewTally(n int) *Tally {
	return &Tally{n: n, sentAt: make([]time.Time, n), handledAt: make([]time.Time, n), handled: make([]int, n), all: make(chan struct{})}
}

// Sent records that the send of id returned nil.
func (t *Tally) Sent(id int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.sentAt[id].IsZero() {
		return
	}
	t.sentAt[id] = time.Now()
	t.sent++
	kept := t.reached[:0]
	for _, w := range t.reached {
		if t.sent >= w.k {
			close(w.ch)
		} else {
			kept = append(kept, w)
		}
	}
	t.reached = kept
}

// SendFailed records a send that returned an error (it is tried again).
func (t *Tally) SendFailed(err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sendErrors++
	if t.firstSendError == nil {
		t.firstSendError = err
	}
}

// Handled records a handling of id and reports whether it was the first.
func (t *Tally) Handled(id int) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.total++
	t.handled[id]++
	if t.handled[id] > 1 {
		return false
	}
	t.handledAt[id] = time.Now()
	t.unique++
	if t.unique == t.n {
		close(t.all)
	}
	return true
}

// SentReached returns a channel closed once k messages were sent.
func (t *Tally) SentReached(k int) <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	ch := make(chan struct{})
	if t.sent >= k {
		close(ch)
		return ch
	}
	t.reached = append(t.reached, reachWaiter{k, ch})
	return ch
}

// All returns a channel closed once every message was handled.
func (t *Tally) All() <-chan struct{} { return t.all }

// Report is what one fault case measured.
type Report struct {
	Case       string
	Sent       int // sends that returned nil
	SendErrors int // sends that returned an error (and were tried again)
	// FirstSendError is the error of the first send that failed.
	FirstSendError error
	Unique         int // messages handled at least once
	Duplicates     int // handlings beyond the first
	Lost           int // sent but never handled
	DeadLettered   int
	// Recovery is the time from the end of the fault to the handling of
	// the first message sent after it.
	Recovery time.Duration
	// Detection is how long the client took to notice the fault (when it
	// has to: a silent connection), zero otherwise.
	Detection time.Duration
	// Replacement is how long it took from noticing to a new connection.
	Replacement time.Duration
	// Reconnects is how many times the client lost its connection.
	Reconnects int
	// Drained is the time from the end of the fault until every message
	// was handled.
	Drained time.Duration
}

// String is the report on one line, for the test log.
func (r Report) String() string {
	s := fmt.Sprintf("%s: sent %d (send errors %d) / handled-unique %d / duplicates %d / lost %d / dead-lettered %d / recovered in %v, all handled %v after the fault",
		r.Case, r.Sent, r.SendErrors, r.Unique, r.Duplicates, r.Lost, r.DeadLettered, r.Recovery.Round(time.Millisecond), r.Drained.Round(time.Millisecond))
	s += fmt.Sprintf(" / connections lost %d", r.Reconnects)
	if r.FirstSendError != nil {
		s += fmt.Sprintf(" / first send error: %v", r.FirstSendError)
	}
	if r.Detection > 0 {
		s += fmt.Sprintf(" / fault noticed in %v", r.Detection.Round(time.Millisecond))
	}
	if r.Replacement > 0 {
		s += fmt.Sprintf(", connection replaced %v later", r.Replacement.Round(time.Millisecond))
	}
	return s
}

// Report returns the counts so far; faultEnd is when the fault was cleared.
func (t *Tally) Report(name string, deadLettered int, faultEnd time.Time) Report {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := Report{Case: name, Sent: t.sent, SendErrors: t.sendErrors, FirstSendError: t.firstSendError, Unique: t.unique, Duplicates: t.total - t.unique, DeadLettered: deadLettered}
	r.Recovery = -1
	for id := range t.n {
		if d := t.handledAt[id].Sub(faultEnd); t.handled[id] > 0 && d > r.Drained {
			r.Drained = d
		}
		if !t.sentAt[id].IsZero() && t.handled[id] == 0 {
			r.Lost++
		}
		if !t.sentAt[id].Before(faultEnd) && t.handled[id] > 0 {
			if d := t.handledAt[id].Sub(faultEnd); r.Recovery < 0 || d < r.Recovery {
				r.Recovery = d
			}
		}
	}
	return r
}

// Stream sends messages 0 to n-1 at perSecond, with at most inFlight
// sends waiting at once (a slow link slows the stream down, as it would a
// real producer's). A send that fails is counted and tried again with
// the same id until ctx ends. The returned channel is closed once every
// message was sent, or ctx ended.
func Stream(ctx context.Context, t *Tally, perSecond float64, inFlight int, send func(ctx context.Context, id int) error) <-chan struct{} {
	done := make(chan struct{})
	limiter := rate.NewLimiter(rate.Limit(perSecond), 1)
	slots := make(chan struct{}, inFlight)
	go func() {
		defer close(done)
		var wg sync.WaitGroup
		defer wg.Wait()
		for id := range t.n {
			if limiter.Wait(ctx) != nil {
				return
			}
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				return
			}
			wg.Go(func() {
				defer func() { <-slots }()
				for ctx.Err() == nil {
					if err := send(ctx, id); err != nil {
						t.SendFailed(err)
						select { // a producer backs off before it tries again
						case <-time.After(50 * time.Millisecond):
						case <-ctx.Done():
						}
						continue
					}
					t.Sent(id)
					return
				}
			})
		}
	}()
	return done
}
