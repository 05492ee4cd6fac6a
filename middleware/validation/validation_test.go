package validation_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
	"github.com/plugbus/plugbus/middleware/validation"
	"github.com/plugbus/plugbus/transports/memory"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type placeOrder struct{ Quantity int }

func (placeOrder) MessageName() string { return "shop.place_order" }

func (m placeOrder) Validate() error {
	if m.Quantity < 1 {
		return fmt.Errorf("quantity %d: order at least 1", m.Quantity)
	}
	return nil
}

type note struct{} // no Validate

func (note) MessageName() string { return "shop.note" }

// Outgoing: an invalid message is refused with the validation error and
// never reaches next; a valid one, or one without Validate, passes.
func TestOutgoingRefusesInvalidMessages(t *testing.T) {
	mw, err := validation.New().Instantiate(bus.PluginInfo{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		msg   bus.Message
		valid bool
	}{{placeOrder{Quantity: 0}, false}, {placeOrder{Quantity: 2}, true}, {note{}, true}} {
		rec := bustest.RecordNext(nil)
		err := mw.Outgoing(context.Background(), bustest.Outgoing(bus.KindSend, c.msg, bus.Attributes{}), rec.OutgoingNext())
		if c.valid != (err == nil && rec.Called()) {
			t.Fatalf("%#v: err %v, called %v; want valid %v", c.msg, err, rec.Called(), c.valid)
		}
		if !c.valid {
			var ve *validation.Error
			if !errors.As(err, &ve) || ve.Message != "shop.place_order" || !errors.Is(err, validation.ErrInvalid) || bus.IsPermanent(err) ||
				err.Error() != "validation: message shop.place_order is invalid: quantity 0: order at least 1" {
				t.Fatalf("got %v", err)
			}
		}
	}
}

// Handler stage: an invalid message fails permanently before the handler.
func TestHandlerStageFailsInvalidMessagesPermanently(t *testing.T) {
	mw, err := validation.New().Instantiate(bus.PluginInfo{Handler: "place"})
	if err != nil {
		t.Fatal(err)
	}
	if mw.Outgoing != nil {
		t.Fatal("per handler, validation must have the handler stage alone")
	}
	rec := bustest.RecordNext(nil)
	err = mw.Handling(context.Background(), bustest.Handling("place", placeOrder{}, bus.Attributes{}), rec.HandlingNext())
	if rec.Called() || !bus.IsPermanent(err) || !errors.Is(err, validation.ErrInvalid) {
		t.Fatalf("err %v, called %v; want a permanent validation error and no call", err, rec.Called())
	}
}

// On a bus: Send refuses an invalid message and sends nothing; an invalid
// message received (sent by a bus without validation) is dead-lettered on
// its first attempt, its handler never run, also when it takes *T.
func TestOnABus(t *testing.T) {
	broker := memory.NewBroker()
	tr := bustest.NewTransport(memory.WithBroker(broker))
	var handled atomic.Int32
	b := bustest.Start(t, bus.WithEndpoint("shop"), bus.WithTransport(tr),
		bus.WithMiddleware(validation.New()),
		bus.WithHandler(func(context.Context, *placeOrder, bus.Attributes) error { handled.Add(1); return nil }))
	if err := b.Send(t.Context(), placeOrder{Quantity: -1}, bus.To("shop")); !errors.Is(err, validation.ErrInvalid) {
		t.Fatalf("Send: %v, want the validation error", err)
	}
	if sent := tr.Sent(); len(sent) != 0 {
		t.Fatalf("sent %d messages, want none", len(sent))
	}
	unchecked := bustest.Start(t, bus.WithTransport(memory.New(memory.WithBroker(broker))))
	if err := unchecked.Send(t.Context(), placeOrder{Quantity: -1}, bus.To("shop")); err != nil {
		t.Fatal(err)
	}
	settled, err := tr.WaitSettled(t.Context(), 1)
	if err != nil {
		t.Fatal(err)
	}
	s := settled[0]
	if s.Outcome != bustest.DeadLettered || s.Attempt != 1 || handled.Load() != 0 ||
		!strings.Contains(s.Failure.Reason, "validation: message shop.place_order is invalid: quantity -1") || !strings.Contains(s.Failure.Reason, "permanent failure") {
		t.Fatalf("settled %s on attempt %d (%q), handled %d times; want dead-lettered at once as permanent, never handled", s.Outcome, s.Attempt, s.Failure.Reason, handled.Load())
	}
}
