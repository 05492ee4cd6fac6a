package transporttest

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/plugbus/plugbus/bus"
)

// This file tests what a transport's bus.DeadLetterManager does with an
// endpoint that does not exist (Features.DeadLetterManager): a mistyped
// name is an error, never "0 dead letters", and a replay to one leaves
// the dead letters where they were.

// managerOp is one method of bus.DeadLetterManager called on an
// endpoint: what it returned as a count (dead letters, depth, replayed,
// deleted) and its error.
type managerOp struct {
	name string
	call func(ctx context.Context, m bus.DeadLetterManager, endpoint string, done func(bus.DeadLetter)) (int, error)
}

var managerOps = []managerOp{
	{"ListDeadLetters", func(ctx context.Context, m bus.DeadLetterManager, ep string, _ func(bus.DeadLetter)) (int, error) {
		dls, err := m.ListDeadLetters(ctx, bus.DeadLetterFilter{Endpoint: ep})
		return len(dls), err
	}},
	{"CountDeadLetters", func(ctx context.Context, m bus.DeadLetterManager, ep string, _ func(bus.DeadLetter)) (int, error) {
		return m.CountDeadLetters(ctx, ep)
	}},
	{"QueueDepth", func(ctx context.Context, m bus.DeadLetterManager, ep string, _ func(bus.DeadLetter)) (int, error) {
		return m.QueueDepth(ctx, ep)
	}},
	{"ReplayDeadLetters", func(ctx context.Context, m bus.DeadLetterManager, ep string, done func(bus.DeadLetter)) (int, error) {
		return m.ReplayDeadLetters(ctx, bus.DeadLetterFilter{Endpoint: ep}, bus.Replay{By: "transporttest"}, done)
	}},
	{"DeleteDeadLetters", func(ctx context.Context, m bus.DeadLetterManager, ep string, done func(bus.DeadLetter)) (int, error) {
		return m.DeleteDeadLetters(ctx, bus.DeadLetterFilter{Endpoint: ep}, done)
	}},
}

// unknownEndpoint checks the error of err for the unknown endpoint ep:
// bus.ErrUnknownEndpoint, naming ep as a replay's destination or not
// (UnknownEndpointError.Destination) and, from a transport that lists its
// endpoints, those it knows, known among them.
func unknownEndpoint(t *testing.T, m bus.DeadLetterManager, what string, err error, ep, known string, destination bool) {
	t.Helper()
	var ue *bus.UnknownEndpointError
	if !errors.Is(err, bus.ErrUnknownEndpoint) || !errors.As(err, &ue) {
		t.Errorf("%s: %v, want a *bus.UnknownEndpointError (bus.ErrUnknownEndpoint)", what, err)
		return
	}
	if ue.Endpoint != ep {
		t.Errorf("%s: the error names endpoint %q, want %q", what, ue.Endpoint, ep)
	}
	if ue.Destination != destination {
		t.Errorf("%s: the error's Destination is %t, want %t", what, ue.Destination, destination)
	}
	if _, lists := m.(bus.EndpointLister); !lists {
		return
	}
	if !slices.Contains(ue.Known, known) || slices.Contains(ue.Known, ep) || !slices.IsSorted(ue.Known) {
		t.Errorf("%s: the error's known endpoints are %q; the transport lists its endpoints (bus.EndpointLister): want them sorted, with %s and without %s", what, ue.Known, known, ep)
	}
}

// unknownEndpointRefused calls every method of the manager on an endpoint
// never set up: each fails with bus.ErrUnknownEndpoint and creates
// nothing. On an endpoint set up and without dead letters each one
// succeeds with 0.
func (s *suite) unknownEndpointRefused(t *testing.T) {
	known, name := Name("tt-known"), Name("tt.msg")
	tr := s.open(t, known, name)
	m := s.manager(t, tr)
	ctx := s.ctx(t)
	notDone := func(dl bus.DeadLetter) { t.Errorf("done called for dead letter %s", dl.ID) }
	for _, op := range managerOps {
		if n, err := op.call(ctx, m, known, notDone); err != nil || n != 0 {
			t.Errorf("%s(%s), an endpoint set up without dead letters: %d, %v; want 0 and no error", op.name, known, n, err)
		}
	}
	if dc, ok := m.(bus.DestinationChecker); ok {
		if err := dc.CheckDestination(ctx, known); err != nil {
			t.Errorf("CheckDestination(%s), an endpoint set up: %v; want nil", known, err)
		}
	}
	unknown := Name("tt-unknown")
	for _, op := range managerOps {
		n, err := op.call(ctx, m, unknown, notDone)
		if n != 0 {
			t.Errorf("%s(%s) = %d, want 0", op.name, unknown, n)
		}
		unknownEndpoint(t, m, op.name+"("+unknown+")", err, unknown, known, false)
	}
	// Asking made nothing: the endpoint is as unknown as before.
	_, err := m.QueueDepth(ctx, unknown)
	unknownEndpoint(t, m, "QueueDepth asked again", err, unknown, known, false)
	if l, ok := m.(bus.EndpointLister); ok {
		if eps, err := l.Endpoints(ctx); err != nil || slices.Contains(eps, unknown) {
			t.Errorf("Endpoints = %q, %v: asking about %s made it an endpoint", eps, err, unknown)
		}
	}
	if _, err := m.ListDeadLetters(ctx, bus.DeadLetterFilter{}); !errors.Is(err, bus.ErrNoDeadLetterEndpoint) {
		t.Errorf("ListDeadLetters without an endpoint: %v, want bus.ErrNoDeadLetterEndpoint, not an unknown endpoint", err)
	}
}

// replayToUnknownEndpoint replays dead letters to an endpoint that does
// not exist, named by Replay.To or by the dead letter's failure: the
// replay fails with bus.ErrUnknownEndpoint naming it as a destination,
// replays and removes nothing, and creates no queue. A
// bus.DestinationChecker says the same of it.
func (s *suite) replayToUnknownEndpoint(t *testing.T) {
	ep, name := Name("tt-replay-unknown"), Name("tt.msg")
	tr := s.open(t, ep, name)
	m := s.manager(t, tr)
	ctx := s.ctx(t)
	env := envelope(name, `{"n":1}`)
	s.deadLetter(t, tr, ep, env, bus.Failure{Reason: "x"})
	// A dead letter whose failure names an endpoint gone since (replayed
	// to its own endpoint, it would go there).
	gone, orphan := Name("tt-gone"), envelope(name, `{"n":2}`)
	if err := tr.Send(ctx, orphan, ep); err != nil {
		t.Fatal(err)
	}
	d := s.receive(t, tr)
	if err := tr.Fail(ctx, d, bus.Failure{Reason: "y", Endpoint: gone, Attempts: d.Attempt}); err != nil {
		t.Fatalf("Fail: %v", err)
	}
	s.waitDeadLetters(t, m, ep, 2)
	before, err := m.ListDeadLetters(ctx, bus.DeadLetterFilter{Endpoint: ep})
	if err != nil || len(before) != 2 {
		t.Fatalf("ListDeadLetters = %d dead letters, %v; want 2", len(before), err)
	}
	orphanID := before[slices.IndexFunc(before, func(dl bus.DeadLetter) bool { return dl.Envelope.Attributes.MessageID == orphan.Attributes.MessageID })].ID
	nowhere := Name("tt-nowhere")
	cases := []struct {
		what string
		f    bus.DeadLetterFilter
		r    bus.Replay
		want string
	}{
		{"every dead letter to an unknown endpoint (Replay.To)", bus.DeadLetterFilter{Endpoint: ep}, bus.Replay{To: nowhere}, nowhere},
		{"one dead letter to the unknown endpoint it failed on", bus.DeadLetterFilter{Endpoint: ep, IDs: []string{orphanID}}, bus.Replay{}, gone},
	}
	for _, c := range cases {
		calls := 0
		n, err := m.ReplayDeadLetters(ctx, c.f, c.r, func(bus.DeadLetter) { calls++ })
		if n != 0 || calls != 0 {
			t.Errorf("replay of %s: %d replayed, done called %d times; want none", c.what, n, calls)
		}
		unknownEndpoint(t, m, "replay of "+c.what, err, c.want, ep, true)
		if dc, ok := m.(bus.DestinationChecker); ok {
			unknownEndpoint(t, m, "CheckDestination("+c.want+")", dc.CheckDestination(ctx, c.want), c.want, ep, true)
		}
		s.waitDeadLetters(t, m, ep, 2)
		after, err := m.ListDeadLetters(ctx, bus.DeadLetterFilter{Endpoint: ep})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(ids(after), ids(before)) {
			t.Errorf("after the replay of %s the dead letters are %v, want %v as they were", c.what, ids(after), ids(before))
		}
	}
	for _, dest := range []string{nowhere, gone} {
		_, err := m.QueueDepth(ctx, dest)
		unknownEndpoint(t, m, "QueueDepth of "+dest+" after a replay to it", err, dest, ep, false)
	}
	s.expectNothing(t, tr)
}
