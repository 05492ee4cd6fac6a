package saga_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugins/saga"
	"github.com/plugbus/plugbus/store"
	"github.com/plugbus/plugbus/store/storetest"
	"github.com/plugbus/plugbus/transports/memory"
)

// refusingSaga's starting handler makes the sends a bus refuses, then one
// it takes, and reports what each returned.
func refusingSaga(st *store.Store, results chan<- []error) *saga.Saga[Order] {
	s := saga.New[Order]("refusing", st)
	saga.StartedBy(s, saga.By(func(m Placed) string { return m.OrderID }), func(c *saga.Context[Order], m Placed) error {
		results <- []error{
			c.Publish(Cancelled{OrderID: m.OrderID}, bus.To("sink")),
			c.Send((*Fulfilled)(nil), bus.To("sink")),
			c.Publish(nil),
			c.RequestTimeout(time.Minute, (*PaymentOverdue)(nil)),
			c.Send(Fulfilled{OrderID: m.OrderID}, bus.To("sink")),
		}
		return nil
	})
	return s
}

// TestSimulatorRefusesWhatTheBusRefuses: a handler run by the simulator
// (sagatest's harness) gets the errors a bus returns for a publish with
// bus.To and for a nil message (sent, published or as a timeout), and nil
// for a send the bus takes.
func TestSimulatorRefusesWhatTheBusRefuses(t *testing.T) {
	st := storetest.New(t, storetest.SQLite).Open(t)
	onBus := make(chan []error, 1)
	b, _ := orderBus(t, st, memTransport(memory.NewBroker()), nil, nil, true, refusingSaga(st, onBus).Option())
	send(t, b, Placed{OrderID: "o-1"})
	var want []error
	select {
	case want = <-onBus:
	case <-time.After(10 * time.Second):
		t.Fatal("the bus did not run the handler within 10s")
	}

	simulated := make(chan []error, 1)
	sim := refusingSaga(nil, simulated).Simulator(time.Now, nil)
	if _, err := sim.Deliver(t.Context(), Placed{OrderID: "o-1"}, bus.Attributes{}); err != nil {
		t.Fatal(err)
	}
	got := <-simulated
	for i, sentinel := range []error{bus.ErrInvalidOption, bus.ErrInvalidMessage, bus.ErrInvalidMessage, bus.ErrInvalidMessage, nil} {
		if fmt.Sprint(got[i]) != fmt.Sprint(want[i]) || !errors.Is(got[i], sentinel) {
			t.Errorf("send %d: the simulator returned %v; want %v, as the bus", i, got[i], want[i])
		}
	}
}
