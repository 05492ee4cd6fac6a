package transporttest

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
)

// Batches: a transport with Features.Batch implements bus.Batcher. Its
// SendBatch delivers what Send and Publish would, reports each message it
// could not send by index in a *bus.BatchError, and honours Envelope.Due.

func (s *suite) batcher(t *testing.T, tr bus.Transport) bus.Batcher {
	t.Helper()
	b, ok := tr.(bus.Batcher)
	if !ok {
		t.Fatalf("Features.Batch is set but %T does not implement bus.Batcher", tr)
	}
	return b
}

// A batch of sends and publishes reaches each destination once,
// unchanged, with nil: every message confirmed.
func (s *suite) batchDeliversEach(t *testing.T) {
	cmd, evt := Name("tt.batch-cmd"), Name("tt.batch-evt")
	epA, epB := Name("tt-batch-a"), Name("tt-batch-b")
	a := s.open(t, epA, cmd, evt)
	b := s.open(t, epB, evt)
	ctx := s.ctx(t)
	var batch []bus.Outbound
	for i := range 12 { // more than one SQS call of 10
		env := envelope(cmd, `{"n":`+strconv.Itoa(i)+`}`)
		env.Headers = bus.Headers{"x-n": strconv.Itoa(i)}
		batch = append(batch, bus.Outbound{Kind: bus.KindSend, Envelope: env, Destination: epA})
	}
	evtEnv := envelope(evt, `{"evt":true}`)
	batch = append(batch, bus.Outbound{Kind: bus.KindPublish, Envelope: evtEnv})
	if err := s.batcher(t, a).SendBatch(ctx, batch); err != nil {
		t.Fatalf("SendBatch: %v", err)
	}
	want := map[string]*bus.Envelope{}
	for _, m := range batch {
		want[m.Envelope.Attributes.MessageID] = m.Envelope
	}
	for range batch {
		d := s.receive(t, a)
		env, ok := want[d.Attributes.MessageID]
		if !ok {
			t.Fatalf("endpoint a received %s id %s: not in the batch or twice", d.Name, d.Attributes.MessageID)
		}
		delete(want, d.Attributes.MessageID)
		if d.Name != env.Name || string(d.Body) != string(env.Body) || d.Headers["x-n"] != env.Headers["x-n"] {
			t.Errorf("received %s %s headers %v, sent %s %s headers %v", d.Name, d.Body, d.Headers, env.Name, env.Body, env.Headers)
		}
		if err := a.Delete(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	d := s.receive(t, b)
	if d.Attributes.MessageID != evtEnv.Attributes.MessageID {
		t.Errorf("endpoint b received id %s, want the published %s", d.Attributes.MessageID, evtEnv.Attributes.MessageID)
	}
	if err := b.Delete(ctx, d); err != nil {
		t.Fatal(err)
	}
	s.expectNothing(t, a)
	s.expectNothing(t, b)
}

// A send without a destination fails alone: the BatchError names its
// index, and the messages around it arrive.
func (s *suite) batchFailsAlone(t *testing.T) {
	ep, name := Name("tt-batch-fail"), Name("tt.msg")
	tr := s.open(t, ep, name)
	ctx := s.ctx(t)
	first, last := envelope(name, `"first"`), envelope(name, `"last"`)
	batch := []bus.Outbound{
		{Kind: bus.KindSend, Envelope: first, Destination: ep},
		{Kind: bus.KindSend, Envelope: envelope(name, `"nowhere"`)},
		{Kind: bus.KindSend, Envelope: last, Destination: ep},
	}
	err := s.batcher(t, tr).SendBatch(ctx, batch)
	var be *bus.BatchError
	if !errors.As(err, &be) {
		t.Fatalf("SendBatch = %v, want a *bus.BatchError", err)
	}
	if len(be.Failures) != 1 || be.Failures[0].Index != 1 || !errors.Is(be.Failures[0].Err, bus.ErrNoRoute) {
		t.Fatalf("failures %+v, want index 1 alone, wrapping bus.ErrNoRoute", be.Failures)
	}
	if !errors.Is(err, bus.ErrBatchIncomplete) || !errors.Is(err, bus.ErrNoRoute) {
		t.Errorf("%v does not match bus.ErrBatchIncomplete and bus.ErrNoRoute", err)
	}
	got := map[string]bool{}
	for range 2 {
		d := s.receive(t, tr)
		got[string(d.Body)] = true
		if err := tr.Delete(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	if !got[`"first"`] || !got[`"last"`] {
		t.Errorf("received %v, want first and last", got)
	}
	s.expectNothing(t, tr)
}

// After Close no message of a batch is reported as sent.
func (s *suite) batchAfterClose(t *testing.T) {
	ep, name := Name("tt-batch-closed"), Name("tt.msg")
	tr := s.open(t, ep, name)
	if err := tr.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	batch := []bus.Outbound{
		{Kind: bus.KindSend, Envelope: envelope(name, `{}`), Destination: ep},
		{Kind: bus.KindPublish, Envelope: envelope(name, `{}`)},
	}
	err := s.batcher(t, tr).SendBatch(s.ctx(t), batch)
	if !errors.Is(err, bus.ErrClosed) {
		t.Fatalf("SendBatch after Close = %v, want an error matching bus.ErrClosed", err)
	}
	var be *bus.BatchError
	if errors.As(err, &be) && len(be.Failures) != len(batch) {
		t.Fatalf("SendBatch after Close reports %d of %d messages failed: %v", len(be.Failures), len(batch), err)
	}
}

// A message of a batch with a due time goes through the delay path: it
// arrives no earlier than due, after its undelayed neighbour.
func (s *suite) batchHonoursDue(t *testing.T) {
	ep, name := Name("tt-batch-due"), Name("tt.msg")
	tr := s.open(t, ep, name)
	ctx := s.ctx(t)
	later, now := envelope(name, `"later"`), envelope(name, `"now"`)
	later.Due = time.Now().Add(3 * s.f.DelayUnit)
	batch := []bus.Outbound{
		{Kind: bus.KindSend, Envelope: later, Destination: ep},
		{Kind: bus.KindSend, Envelope: now, Destination: ep},
	}
	if err := s.batcher(t, tr).SendBatch(ctx, batch); err != nil {
		t.Fatalf("SendBatch: %v", err)
	}
	for _, want := range []string{`"now"`, `"later"`} {
		d := s.receive(t, tr)
		if string(d.Body) != want {
			t.Fatalf("received %s, want %s (the delayed one last)", d.Body, want)
		}
		if want == `"later"` {
			if early := time.Until(later.Due); early > 0 {
				t.Errorf("the delayed message arrived %v before it was due", early)
			}
		}
		if err := tr.Delete(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	s.expectNothing(t, tr)
}
