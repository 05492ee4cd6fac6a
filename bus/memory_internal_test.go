package bus

import (
	"context"
	"testing"
)

// A receiver that took the queue's wake-up token and leaves without
// popping (its context ended) must pass the token on, or a message waits
// while other receivers of the endpoint sleep.
func TestMemoryReceiverLeavingPassesTheWakeUpOn(t *testing.T) {
	broker := newMemBroker()
	tr := newMemTransport(broker)
	if err := tr.Setup(context.Background(), Topology{Endpoint: "ep"}); err != nil {
		t.Fatal(err)
	}
	defer tr.Close(context.Background())
	q := broker.queue("ep")
	q.push(&memItem{env: Envelope{Name: "m"}, attempt: 1, q: q}, false)
	<-q.signal // this receiver took the token …
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := tr.Receive(ctx); err == nil { // … and leaves without popping
		t.Fatal("Receive with a cancelled context returned a message")
	}
	if len(q.signal) != 1 {
		t.Fatal("the wake-up token was lost: other receivers sleep while a message waits")
	}
}

// A receiver woken by the endpoint queue's token takes from the instance
// queue first: it must pass the endpoint's token on.
func TestMemoryReceiverTakingAnInstanceMessagePassesTheWakeUpOn(t *testing.T) {
	broker := newMemBroker()
	tr := newMemTransport(broker)
	if err := tr.Setup(context.Background(), Topology{Endpoint: "ep", Instance: true}); err != nil {
		t.Fatal(err)
	}
	defer tr.Close(context.Background())
	if err := tr.Send(context.Background(), &Envelope{Name: "a"}, "ep"); err != nil {
		t.Fatal(err)
	}
	if err := tr.Send(context.Background(), &Envelope{Name: "b"}, tr.InstanceAddress()); err != nil {
		t.Fatal(err)
	}
	<-tr.q.signal // this receiver took the endpoint queue's token …
	d, err := tr.Receive(context.Background())
	if err != nil || d.Name != "b" { // … and the instance message
		t.Fatalf("Receive = %v, %v; want the instance message b", d, err)
	}
	if broker.Depth("ep") != 1 || len(tr.q.signal) != 1 {
		t.Fatalf("endpoint queue depth %d with %d wake-up tokens: other receivers sleep while a message waits", broker.Depth("ep"), len(tr.q.signal))
	}
}
