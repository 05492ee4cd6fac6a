package transporttest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
)

// This file tests a transport's bus.DeadLetterManager
// (Features.DeadLetterManager).

func (s *suite) manager(t *testing.T, tr bus.Transport) bus.DeadLetterManager {
	t.Helper()
	m, ok := tr.(bus.DeadLetterManager)
	if !ok {
		t.Fatalf("Features.DeadLetterManager is set but %T does not implement bus.DeadLetterManager", tr)
	}
	return m
}

// deadLetter sends env to ep, receives it and fails it with f.
func (s *suite) deadLetter(t *testing.T, tr bus.Transport, ep string, env *bus.Envelope, f bus.Failure) {
	t.Helper()
	ctx := s.ctx(t)
	if err := tr.Send(ctx, env, ep); err != nil {
		t.Fatal(err)
	}
	d := s.receive(t, tr)
	if d.Attributes.MessageID != env.Attributes.MessageID {
		t.Fatalf("received %s, want %s", d.Attributes.MessageID, env.Attributes.MessageID)
	}
	f.Endpoint, f.Attempts = ep, d.Attempt
	if err := tr.Fail(ctx, d, f); err != nil {
		t.Fatalf("Fail: %v", err)
	}
}

// waitDeadLetters waits until ep counts n dead letters. A broker's count
// may lag (SQS's is approximate): poll, bounded by the suite's timeout.
func (s *suite) waitDeadLetters(t *testing.T, m bus.DeadLetterManager, ep string, n int) {
	t.Helper()
	ctx := s.ctx(t)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		got, err := m.CountDeadLetters(ctx, ep)
		if err != nil {
			t.Fatalf("CountDeadLetters: %v", err)
		}
		if got == n {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("CountDeadLetters(%s) = %d, want %d", ep, got, n)
		case <-tick.C:
		}
	}
}

func ids(dls []bus.DeadLetter) []string {
	out := make([]string, len(dls))
	for i, dl := range dls {
		out[i] = dl.Envelope.Attributes.MessageID
	}
	return out
}

func (s *suite) deadLettersFiltered(t *testing.T) {
	ep, a, b := Name("tt-dlm"), Name("tt.a"), Name("tt.b")
	tr := s.open(t, ep, a, b)
	m := s.manager(t, tr)
	ctx := s.ctx(t)
	base := time.Now().UTC().Truncate(time.Second).Add(-time.Hour)
	sent := []*bus.Envelope{envelope(a, `{"n":0}`), envelope(a, `{"n":1}`), envelope(b, `{"n":2}`), envelope(a, `{"n":3}`)}
	reasons := []string{"Card declined", "timeout", "card expired", "timeout"}
	for i, env := range sent {
		s.deadLetter(t, tr, ep, env, bus.Failure{Reason: reasons[i], Time: base.Add(time.Duration(i) * time.Minute)})
	}
	s.waitDeadLetters(t, m, ep, 4)
	all, err := m.ListDeadLetters(ctx, bus.DeadLetterFilter{Endpoint: ep})
	if err != nil {
		t.Fatalf("ListDeadLetters: %v", err)
	}
	want := ids([]bus.DeadLetter{{Envelope: *sent[0]}, {Envelope: *sent[1]}, {Envelope: *sent[2]}, {Envelope: *sent[3]}})
	if got := ids(all); !slices.Equal(got, want) {
		t.Fatalf("listed %v, want %v (oldest first)", got, want)
	}
	seen := map[string]bool{}
	for i, dl := range all {
		if dl.ID == "" || seen[dl.ID] {
			t.Errorf("dead letter %d has ID %q: want a unique one", i, dl.ID)
		}
		seen[dl.ID] = true
		if dl.Failure.Reason != reasons[i] || dl.Failure.Endpoint != ep || !dl.Failure.Time.Equal(base.Add(time.Duration(i)*time.Minute)) {
			t.Errorf("dead letter %d: failure %+v", i, dl.Failure)
		}
	}
	cases := []struct {
		name string
		f    bus.DeadLetterFilter
		want []int
	}{
		{"name", bus.DeadLetterFilter{Name: b}, []int{2}},
		{"reason, any case", bus.DeadLetterFilter{Reason: "CARD"}, []int{0, 2}},
		{"name and reason", bus.DeadLetterFilter{Name: a, Reason: "timeout"}, []int{1, 3}},
		{"time range", bus.DeadLetterFilter{Since: base.Add(time.Minute), Until: base.Add(3 * time.Minute)}, []int{1, 2}},
		{"ids", bus.DeadLetterFilter{IDs: []string{all[3].ID, all[0].ID}}, []int{0, 3}},
		{"limit", bus.DeadLetterFilter{Limit: 2}, []int{0, 1}},
	}
	for _, c := range cases {
		c.f.Endpoint = ep
		got, err := m.ListDeadLetters(ctx, c.f)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		var want []string
		for _, i := range c.want {
			want = append(want, sent[i].Attributes.MessageID)
		}
		if !slices.Equal(ids(got), want) {
			t.Errorf("filter by %s: %v, want %v", c.name, ids(got), want)
		}
	}
	if n, err := m.CountDeadLetters(ctx, ep); err != nil || n != 4 {
		t.Errorf("after listing, CountDeadLetters = %d, %v: listing must remove nothing", n, err)
	}
	if _, err := m.ListDeadLetters(ctx, bus.DeadLetterFilter{}); !errors.Is(err, bus.ErrNoDeadLetterEndpoint) {
		t.Errorf("ListDeadLetters without an endpoint: %v, want bus.ErrNoDeadLetterEndpoint", err)
	}
	n, err := m.DeleteDeadLetters(ctx, bus.DeadLetterFilter{Endpoint: ep, Reason: "timeout"}, nil)
	if err != nil || n != 2 {
		t.Fatalf("DeleteDeadLetters(timeout) = %d, %v, want 2", n, err)
	}
	s.waitDeadLetters(t, m, ep, 2)
	left, err := m.ListDeadLetters(ctx, bus.DeadLetterFilter{Endpoint: ep})
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(left); !slices.Equal(got, []string{sent[0].Attributes.MessageID, sent[2].Attributes.MessageID}) {
		t.Errorf("after deleting the timeouts: %v", got)
	}
	s.expectNothing(t, tr)
}

func (s *suite) deadLetterReplayed(t *testing.T) {
	ep, name := Name("tt-replay"), Name("tt.msg")
	tr := s.open(t, ep, name)
	m := s.manager(t, tr)
	ctx := s.ctx(t)
	env := envelope(name, `{"replay":1}`)
	env.Headers = bus.Headers{"x-kept": "yes"}
	h := history(t)
	at := time.Now().UTC().Truncate(time.Second)
	s.deadLetter(t, tr, ep, env, bus.Failure{Reason: "boom", Time: at, History: h})
	s.waitDeadLetters(t, m, ep, 1)
	replayedAt := at.Add(time.Minute)
	var done []bus.DeadLetter
	n, err := m.ReplayDeadLetters(ctx, bus.DeadLetterFilter{Endpoint: ep}, bus.Replay{By: "alice", At: replayedAt}, func(dl bus.DeadLetter) { done = append(done, dl) })
	if err != nil || n != 1 || len(done) != 1 {
		t.Fatalf("ReplayDeadLetters = %d, %v (done called %d times), want 1", n, err, len(done))
	}
	d := s.receive(t, tr)
	if d.Attributes.MessageID != env.Attributes.MessageID || d.Attributes.CorrelationID != env.Attributes.CorrelationID ||
		string(d.Body) != `{"replay":1}` || d.Name != name || d.Headers["x-kept"] != "yes" {
		t.Errorf("replayed copy: id %s corr %s name %s body %s headers %v", d.Attributes.MessageID, d.Attributes.CorrelationID, d.Name, d.Body, d.Headers)
	}
	if d.Attempt != 1 || !d.Retries.IsZero() {
		t.Errorf("replayed copy: attempt %d retries %+v, want a fresh start", d.Attempt, d.Retries)
	}
	rec, ok, err := bus.ReplayRecordOf(d.Headers)
	if !ok || err != nil {
		t.Fatalf("replayed copy: %s record %v, %v", bus.HeaderReplay, ok, err)
	}
	if rec.By != "alice" || !rec.At.Equal(replayedAt) || rec.Count != 1 || len(rec.Failures) != 1 {
		t.Fatalf("replay record %+v", rec)
	}
	if f := rec.Failures[0]; f.Reason != "boom" || f.Endpoint != ep || !f.Time.Equal(at) || !sameHistory(f.History, h) {
		t.Errorf("replay record keeps failure %+v, want boom at %v with history %+v", f, at, h)
	}
	s.waitDeadLetters(t, m, ep, 0)
	// It fails again: the new dead letter keeps the record, and a second
	// replay adds to it.
	f := bus.Failure{Reason: "boom again", Endpoint: ep, Attempts: 1, Time: at.Add(2 * time.Minute)}
	if err := tr.Fail(ctx, d, f); err != nil {
		t.Fatal(err)
	}
	s.waitDeadLetters(t, m, ep, 1)
	if n, err := m.ReplayDeadLetters(ctx, bus.DeadLetterFilter{Endpoint: ep}, bus.Replay{By: "bob"}, nil); err != nil || n != 1 {
		t.Fatalf("second replay = %d, %v", n, err)
	}
	d = s.receive(t, tr)
	rec, _, err = bus.ReplayRecordOf(d.Headers)
	if err != nil || rec.Count != 2 || rec.By != "bob" || len(rec.Failures) != 2 || rec.Failures[1].Reason != "boom again" {
		t.Errorf("after a second replay: record %+v, %v", rec, err)
	}
	if err := tr.Delete(ctx, d); err != nil {
		t.Fatal(err)
	}
	s.expectNothing(t, tr)
}

func (s *suite) deadLetterReplayedElsewhere(t *testing.T) {
	ep, other, name := Name("tt-replay-from"), Name("tt-replay-to"), Name("tt.msg")
	tr := s.open(t, ep, name)
	to := s.open(t, other, name)
	m := s.manager(t, tr)
	env := envelope(name, `{}`)
	s.deadLetter(t, tr, ep, env, bus.Failure{Reason: "x"})
	s.waitDeadLetters(t, m, ep, 1)
	if n, err := m.ReplayDeadLetters(s.ctx(t), bus.DeadLetterFilter{Endpoint: ep}, bus.Replay{To: other}, nil); err != nil || n != 1 {
		t.Fatalf("ReplayDeadLetters to %s = %d, %v", other, n, err)
	}
	d := s.receive(t, to)
	if d.Attributes.MessageID != env.Attributes.MessageID {
		t.Errorf("%s received %s", other, d.Attributes.MessageID)
	}
	if err := to.Delete(s.ctx(t), d); err != nil {
		t.Fatal(err)
	}
	s.expectNothing(t, tr)
}

// interruptedReplay cancels a bulk replay midway and counts: every
// message is either replayed (once) or still a dead letter.
func (s *suite) interruptedReplay(t *testing.T) {
	const total, stopAfter = 40, 15
	ep, name := Name("tt-bulk"), Name("tt.msg")
	tr := s.open(t, ep, name)
	m := s.manager(t, tr)
	all := map[string]bool{}
	for i := range total {
		env := envelope(name, fmt.Sprintf(`{"n":%d}`, i))
		all[env.Attributes.MessageID] = true
		s.deadLetter(t, tr, ep, env, bus.Failure{Reason: "bulk"})
	}
	s.waitDeadLetters(t, m, ep, total)
	ctx, cancel := context.WithCancel(s.ctx(t))
	defer cancel()
	calls := 0 // done is called one call at a time
	n, err := m.ReplayDeadLetters(ctx, bus.DeadLetterFilter{Endpoint: ep}, bus.Replay{By: "bulk"}, func(bus.DeadLetter) {
		calls++
		if calls == stopAfter {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted ReplayDeadLetters: %d, %v, want context.Canceled", n, err)
	}
	if err.Error() != context.Canceled.Error() {
		// More than the cancellation (a transport may say what it could
		// not put back): shown should the count below not come right.
		t.Logf("interrupted ReplayDeadLetters: %v", err)
	}
	// The replays in hand when ctx ended are finished (a transport may
	// have several waiting for their confirmation), none started after.
	if n < stopAfter || n >= total || calls != n {
		t.Fatalf("interrupted ReplayDeadLetters replayed %d of %d (done called %d times), want from %d, not all", n, total, calls, stopAfter)
	}
	s.waitDeadLetters(t, m, ep, total-n)
	left, err := m.ListDeadLetters(s.ctx(t), bus.DeadLetterFilter{Endpoint: ep})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, id := range ids(left) {
		got[id]++
	}
	ctx2 := s.ctx(t)
	for range n {
		d := s.receive(t, tr)
		got[d.Attributes.MessageID]++
		if err := tr.Delete(ctx2, d); err != nil {
			t.Fatal(err)
		}
	}
	s.expectNothing(t, tr)
	for id := range all {
		if got[id] != 1 {
			t.Errorf("message %s is %d times among the dead letters and the replayed copies, want once", id, got[id])
		}
	}
	if len(got) != total {
		t.Errorf("%d distinct messages, want %d", len(got), total)
	}
}
