package transporttest

import (
	"context"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
)

// Scheduling: a transport that implements bus.Delayer delivers an
// envelope whose Due is set no earlier than Due (bus.Delay, bus.At), with
// the mechanism of its delayed retries.

// Scheduled sends arrive no earlier than their due time; one due in the
// past, or with no due time, goes at once and overtakes them.
func (s *suite) scheduledSendNoneEarly(t *testing.T) {
	ep, name := Name("tt-sched"), Name("tt.msg")
	tr := s.open(t, ep, name)
	ctx := s.ctx(t)
	start := time.Now()
	due := map[string]time.Time{
		`"u5"`:   start.Add(5 * s.f.DelayUnit),
		`"u2"`:   start.Add(2 * s.f.DelayUnit),
		`"past"`: start.Add(-time.Hour),
		`"now"`:  {},
	}
	for _, body := range []string{`"u5"`, `"u2"`, `"past"`, `"now"`} {
		env := envelope(name, body)
		env.Due = due[body]
		if err := tr.Send(ctx, env, ep); err != nil {
			t.Fatalf("Send %s: %v", body, err)
		}
	}
	var order []string
	for range due {
		d := s.receive(t, tr)
		at := time.Now()
		body := string(d.Body)
		order = append(order, body)
		if early := due[body].Sub(at); early > 0 {
			t.Errorf("%s delivered %v before it was due", body, early)
		}
		if d.Attempt != 1 {
			t.Errorf("%s delivered with attempt %d, want 1", body, d.Attempt)
		}
		if err := tr.Delete(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	if order[2] != `"u2"` || order[3] != `"u5"` {
		t.Errorf("delivered in the order %v, want the undelayed two, then u2, then u5", order)
	}
	s.expectNothing(t, tr)
}

// A scheduled publish reaches each of three subscribing endpoints once,
// no earlier than its due time.
func (s *suite) scheduledPublishOncePerSubscriber(t *testing.T) {
	name := Name("tt.sched-evt")
	subs := []bus.Transport{s.open(t, Name("tt-sched-a"), name), s.open(t, Name("tt-sched-b"), name), s.open(t, Name("tt-sched-c"), name)}
	ctx := s.ctx(t)
	env := envelope(name, `{"scheduled":true}`)
	env.Due = time.Now().Add(3 * s.f.DelayUnit)
	if err := subs[0].Publish(ctx, env); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	for i, tr := range subs {
		d := s.receive(t, tr)
		if early := time.Until(env.Due); early > 0 {
			t.Errorf("subscriber %d got it %v before it was due", i, early)
		}
		if d.Attributes.MessageID != env.Attributes.MessageID || string(d.Body) != `{"scheduled":true}` {
			t.Errorf("subscriber %d got id %s body %s", i, d.Attributes.MessageID, d.Body)
		}
		if err := tr.Delete(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	for _, tr := range subs {
		s.expectNothing(t, tr)
	}
}

// A scheduled message is kept by the broker, not by the transport that
// sent it nor by the one that will receive it: both close before it is
// due, and a new transport of the endpoint receives it.
func (s *suite) scheduledSurvivesTransportRestart(t *testing.T) {
	ep, name := Name("tt-sched-restart"), Name("tt.msg")
	receiver := s.open(t, ep, name)
	sender := s.newTransport(t)
	ctx := s.ctx(t)
	env := envelope(name, `"restart"`)
	env.Due = time.Now().Add(4 * s.f.DelayUnit)
	if err := sender.Send(ctx, env, ep); err != nil {
		t.Fatal(err)
	}
	for _, tr := range []bus.Transport{sender, receiver} {
		if err := tr.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	again := s.open(t, ep, name)
	d := s.receive(t, again)
	if early := time.Until(env.Due); early > 0 {
		t.Errorf("delivered %v before it was due", early)
	}
	if d.Attributes.MessageID != env.Attributes.MessageID {
		t.Errorf("got id %s, want %s", d.Attributes.MessageID, env.Attributes.MessageID)
	}
	if err := again.Delete(ctx, d); err != nil {
		t.Fatal(err)
	}
}
