package saga_test

import (
	"strings"
	"sync"
	"testing"
	"time"

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
	var (
		mu      sync.Mutex
		calls   = map[string]int{}
		both    = make(chan struct{})
		arrived int
	)
	s := saga.New[Triple]("conflict", st)
	step := func(c *saga.Context[Triple], name string) error {
		mu.Lock()
		calls[name]++
		first := calls[name] == 1 && name != "c"
		if first {
			arrived++
			if arrived == 2 {
				close(both)
			}
		}
		mu.Unlock()
		if first {
			// Both handlers have read the same version before either saves.
			select {
			case <-both:
			case <-time.After(10 * time.Second):
				t.Error("the two handlers never ran at once")
			}
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
	mu.Lock()
	defer mu.Unlock()
	if calls["a"]+calls["b"] != 3 {
		t.Fatalf("handler calls %v; want the loser to run twice", calls)
	}

}
