package saga_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugins/saga"
	"github.com/plugbus/plugbus/store/storetest"
	"github.com/plugbus/plugbus/transports/memory"
)

// TestConflictIsRetried: two messages for one instance handled at once
// both read version n; the second to save finds it gone, its effects are
// undone and its handler runs again on the winner's state, so neither
// update is lost. PostgreSQL only: SQLite's writers take turns, so they
// never conflict.
func TestConflictIsRetried(t *testing.T) {
	db := storetest.New(t, storetest.Postgres)
	st := db.Open(t)
	broker := memory.NewBroker()
	meet := newMeeting(t)
	s := saga.New[Triple]("conflict", st)
	step := func(c *saga.Context[Triple], name string) error {
		if name == "c" {
			meet.count(name)
		} else {
			meet.first(name) // a and b have read the same version before either saves
		}
		c.State.Steps = append(c.State.Steps, name)
		return nil
	}
	saga.StartedBy(s, saga.By(func(m StepA) string { return m.ID }), func(c *saga.Context[Triple], _ StepA) error { return step(c, "a") })
	saga.Handles(s, saga.By(func(m StepB) string { return m.ID }), func(c *saga.Context[Triple], _ StepB) error { return step(c, "b") })
	saga.StartedBy(s, saga.By(func(m StepC) string { return m.ID }), func(c *saga.Context[Triple], _ StepC) error { return step(c, "c") })
	b, _ := orderBus(t, st, memTransport(broker), nil, nil, false, s.Option())
	send(t, b, StepC{ID: "x"})
	waitFor(t, 10*time.Second, "created", func() bool { _, _, ok := row(t, st, "conflict", "x"); return ok })
	send(t, b, StepA{ID: "x"})
	send(t, b, StepB{ID: "x"})
	waitFor(t, 10*time.Second, "both steps saved", func() bool {
		state, _, _ := row(t, st, "conflict", "x")
		return strings.Contains(state, `"a"`) && strings.Contains(state, `"b"`)
	})
	state, _, _ := row(t, st, "conflict", "x")
	if !strings.Contains(state, `"c"`) || strings.Count(state, `"a"`) != 1 || strings.Count(state, `"b"`) != 1 {
		t.Fatalf("state %s; want c, a and b once each", state)
	}
	if n := s.Conflicts(); n != 1 {
		t.Fatalf("Conflicts() = %d; want 1", n)
	}
	if a, b := meet.calls("a"), meet.calls("b"); a+b != 3 {
		t.Fatalf("handler calls a %d, b %d; want the loser to run twice", a, b)
	}
}

// TestStartAndCompleteInOneMessageConflicts: a starting message that
// completes the instance it creates saves nothing, but another message may
// have created the instance since it looked (a version it did not see):
// that is a conflict like any other, and its handler runs again on the
// winner's state. PostgreSQL only: SQLite's writers take turns.
func TestStartAndCompleteInOneMessageConflicts(t *testing.T) {
	db := storetest.New(t, storetest.Postgres)
	st := db.Open(t)
	broker := memory.NewBroker()
	sk := newSink(t, memTransport(broker))
	meet := newMeeting(t)
	first := meet.first
	s := saga.New[Triple]("startstop", st)
	saga.StartedBy(s, saga.By(func(m StepA) string { return m.ID }), func(c *saga.Context[Triple], _ StepA) error {
		first("a")
		c.State.Steps = append(c.State.Steps, "a")
		return nil
	})
	saga.StartedBy(s, saga.By(func(m StepB) string { return m.ID }), func(c *saga.Context[Triple], m StepB) error {
		if first("b") {
			// Once a's instance is committed, b's "none" is stale.
			q := db.Rebind("SELECT count(*) FROM " + st.SagaTable() + " WHERE saga = ? AND correlation = ?")
			tick := time.NewTicker(5 * time.Millisecond)
			defer tick.Stop()
			deadline := time.After(10 * time.Second)
			for n := 0; n == 0; {
				if err := st.DB().QueryRowContext(c, q, "startstop", m.ID).Scan(&n); err != nil {
					return err
				}
				select {
				case <-tick.C:
				case <-deadline:
					t.Error("a's instance never committed")
					return nil
				}
			}
		}
		c.State.Steps = append(c.State.Steps, "b")
		c.Complete()
		return c.Send(Fulfilled{OrderID: m.ID}, bus.To("sink"))
	})
	b, _ := orderBus(t, st, memTransport(broker), nil, nil, false, s.Option())
	send(t, b, StepA{ID: "x"})
	send(t, b, StepB{ID: "x"})
	waitFor(t, 10*time.Second, "b's send", func() bool { f, _ := sk.counts("x"); return f == 1 })
	if state, _, ok := row(t, st, "startstop", "x"); ok {
		t.Fatalf("instance x still stored with state %s after b completed it; want b to lose the conflict and complete a's instance", state)
	}
	if n := s.Conflicts(); n != 1 {
		t.Fatalf("Conflicts() = %d; want 1", n)
	}
	if n := meet.calls("b"); n != 2 {
		t.Fatalf("b ran %d times; want twice", n)
	}
}

// TestVersionOfAnEarlierInstanceIsAConflict: a handler read an instance at
// version 1; before it saves, that instance completes (deleted) and a new
// one with the same correlation value starts, at version 1 too. The
// handler's save must not land on the new instance as if it were the one
// it read: it is a conflict, and the handler runs again on the new
// instance's state. PostgreSQL only: SQLite's writers take turns.
func TestVersionOfAnEarlierInstanceIsAConflict(t *testing.T) {
	db := storetest.New(t, storetest.Postgres)
	st := db.Open(t)
	broker := memory.NewBroker()
	var (
		mu      sync.Mutex
		started int
		bRuns   int
		loaded  = make(chan struct{})
		proceed = make(chan struct{})
	)
	s := saga.New[Triple]("aba", st)
	saga.StartedBy(s, saga.By(func(m StepA) string { return m.ID }), func(c *saga.Context[Triple], _ StepA) error {
		mu.Lock()
		started++
		n := started
		mu.Unlock()
		c.State.Steps = append(c.State.Steps, fmt.Sprintf("a%d", n))
		return nil
	})
	saga.Handles(s, saga.By(func(m StepB) string { return m.ID }), func(c *saga.Context[Triple], _ StepB) error {
		mu.Lock()
		bRuns++
		first := bRuns == 1
		mu.Unlock()
		if first {
			close(loaded)
			select {
			case <-proceed:
			case <-time.After(10 * time.Second):
				t.Error("never told to proceed")
			}
		}
		c.State.Steps = append(c.State.Steps, "b")
		return nil
	})
	saga.Handles(s, saga.By(func(m StepC) string { return m.ID }), func(c *saga.Context[Triple], _ StepC) error {
		c.Complete()
		return nil
	})
	b, _ := orderBus(t, st, memTransport(broker), nil, nil, false, s.Option())
	var release sync.Once
	t.Cleanup(func() { release.Do(func() { close(proceed) }) }) // before the bus stops
	send(t, b, StepA{ID: "x"})
	waitFor(t, 10*time.Second, "first instance", func() bool { _, _, ok := row(t, st, "aba", "x"); return ok })
	send(t, b, StepB{ID: "x"})
	select {
	case <-loaded: // b read the first instance, at version 1
	case <-time.After(10 * time.Second):
		t.Fatal("b never ran")
	}
	send(t, b, StepC{ID: "x"})
	waitFor(t, 10*time.Second, "first instance completed", func() bool { _, _, ok := row(t, st, "aba", "x"); return !ok })
	send(t, b, StepA{ID: "x"})
	waitFor(t, 10*time.Second, "second instance", func() bool { _, _, ok := row(t, st, "aba", "x"); return ok })
	release.Do(func() { close(proceed) })
	waitFor(t, 10*time.Second, "b saved", func() bool { state, _, _ := row(t, st, "aba", "x"); return strings.Contains(state, `"b"`) })
	if state, _, _ := row(t, st, "aba", "x"); state != `{"Steps":["a2","b"]}` {
		t.Fatalf("state %s; want {\"Steps\":[\"a2\",\"b\"]}: b read the first instance, and must run again on the second", state)
	}
	if n := s.Conflicts(); n != 1 {
		t.Fatalf("Conflicts() = %d; want 1", n)
	}
}

// meeting makes the first runs of two handlers meet: each waits for the
// other's, so that both have read the saga instance before either saves.
type meeting struct {
	t       *testing.T
	mu      sync.Mutex
	runs    map[string]int
	arrived int
	both    chan struct{}
}

func newMeeting(t *testing.T) *meeting {
	return &meeting{t: t, runs: map[string]int{}, both: make(chan struct{})}
}

// count counts a run of name.
func (m *meeting) count(name string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.runs[name]++
	return m.runs[name]
}

// first counts a run of name and returns whether it is its first, which
// returns once the other handler's first run has come too.
func (m *meeting) first(name string) bool {
	if m.count(name) != 1 {
		return false
	}
	m.mu.Lock()
	if m.arrived++; m.arrived == 2 {
		close(m.both)
	}
	m.mu.Unlock()
	select {
	case <-m.both:
	case <-time.After(10 * time.Second):
		m.t.Error("the two handlers never ran at once")
	}
	return true
}

// calls returns how many times name ran.
func (m *meeting) calls(name string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.runs[name]
}
