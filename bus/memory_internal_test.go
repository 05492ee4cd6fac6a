package bus

import (
	"context"
	"testing"
)

// A receiver that took the queue's wake-up token and leaves without
// popping (its context ended) must pass the token on, or a message waits
// while other receivers of the endpoint sleep.
func TestMemoryReceiverLeavingPassesTheWakeUpOn(t *testing.T) {
	broker := NewMemoryBroker()
	tr := NewMemoryTransport(broker)
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
