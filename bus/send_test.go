package bus_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
	"github.com/plugbus/plugbus/transports/memory"
)

// A send-only bus sends a message to its route, or to the endpoint given
// with To; a message with neither fails with ErrNoRoute.
func TestSendGoesToTheRouteOrTo(t *testing.T) {
	broker := memory.NewBroker()
	got := make(chan string, 2)
	newEnv(t, broker, bus.WithHandler(func(ctx context.Context, m chargeCard, a bus.Attributes) error { got <- m.OrderID; return nil }))
	sender, err := bus.New(bus.WithTransport(memory.New(memory.WithBroker(broker))), bus.WithRoute("ep", chargeCard{}), bus.WithLogger(discard()))
	if err != nil {
		t.Fatal(err)
	}
	defer sender.Stop(context.Background())
	ctx := t.Context()
	if err := sender.Send(ctx, chargeCard{OrderID: "routed"}); err != nil {
		t.Fatal(err)
	}
	if err := sender.Send(ctx, chargeCard{OrderID: "direct"}, bus.To("ep")); err != nil {
		t.Fatal(err)
	}
	if a, b := await(t, got), await(t, got); a != "routed" || b != "direct" {
		t.Fatalf("got %s, %s", a, b)
	}
	if err := sender.Send(ctx, orderPlaced{}); !errors.Is(err, bus.ErrNoRoute) || !strings.Contains(err.Error(), "bus.To") {
		t.Fatalf("unrouted send: %v", err)
	}
}

// Publish delivers a message to every endpoint whose bus handles its
// name, and to no other.
func TestPublishReachesEveryEndpointThatHandlesIt(t *testing.T) {
	broker := memory.NewBroker()
	shipped := make(chan string, 4)
	start := func(endpoint string, opts ...bus.Option) *bustest.Transport {
		tr := bustest.NewTransport(memory.WithBroker(broker))
		bustest.Start(t, append([]bus.Option{bus.WithEndpoint(endpoint), bus.WithTransport(tr), bus.WithLogger(discard())}, opts...)...)
		return tr
	}
	shipping := bus.WithHandler(func(ctx context.Context, m orderShipped, a bus.Attributes) error {
		b, _, _ := bus.MessageContext(ctx)
		shipped <- b.Endpoint()
		return nil
	})
	warehouse, mail := start("warehouse", shipping), start("mail", shipping)
	billing := start("billing", bus.WithHandler(func(context.Context, chargeCard, bus.Attributes) error { return nil }))
	publisher := bustest.Start(t, bus.WithTransport(memory.New(memory.WithBroker(broker))), bus.WithLogger(discard()))
	if err := publisher.Publish(t.Context(), orderShipped{OrderID: "1"}); err != nil {
		t.Fatal(err)
	}
	got := []string{await(t, shipped), await(t, shipped)}
	slices.Sort(got)
	if !slices.Equal(got, []string{"mail", "warehouse"}) {
		t.Fatalf("handled by %v, want mail and warehouse", got)
	}
	for _, tr := range []*bustest.Transport{warehouse, mail, billing} {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		err := tr.WaitIdle(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := len(billing.Settled()); n != 0 || len(shipped) != 0 {
		t.Fatalf("billing settled %d messages, %d more handled: the event reached an endpoint that does not handle it, or one twice", n, len(shipped))
	}
}

// A header the transport reserves fails the Send that set it, before
// anything is buffered.
func TestHeaderReservedRefusedAtSendTime(t *testing.T) {
	e := newEnv(t, nil,
		bus.WithTransport(reservingTransport{memory.New()}),
		bus.WithMiddleware(bus.Middleware{Name: "sets-reserved", Outgoing: func(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
			out.Headers()["x-reserved"] = "1"
			return next.Call(ctx)
		}}),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error { return nil }))
	err := e.bus.Send(t.Context(), orderPlaced{})
	var hr *bus.HeaderReservedError
	if !errors.Is(err, bus.ErrHeaderReserved) || !errors.As(err, &hr) || hr.Header != "x-reserved" {
		t.Fatalf("Send: %v", err)
	}
}

// reservingTransport is a memory transport that reserves the header x-reserved.
type reservingTransport struct{ *memory.Transport }

func (reservingTransport) ValidateHeaders(h bus.Headers) error {
	if _, ok := h["x-reserved"]; ok {
		return &bus.HeaderReservedError{Transport: "test", Header: "x-reserved"}
	}
	return nil
}

// shipmentNoted names itself through a pointer: a nil *shipmentNoted has
// a name, and would encode as JSON null.
type shipmentNoted struct {
	OrderID string `json:"order_id"`
}

func (*shipmentNoted) MessageName() string { return "shop.shipment_noted" }

// sendResult runs send, reporting a panic as an error for the test.
func sendResult(send func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panicked: %v", p)
		}
	}()
	return send()
}

// Send, Publish and the batches refuse a nil pointer as a message with an
// error, as they do a nil interface, whatever its MessageName does with
// it: none panics in the caller, and none sends a body of JSON null. A
// nil SendOption is skipped, as bus.New skips a nil Option.
func TestSendRefusesANilPointerMessageAndSkipsANilOption(t *testing.T) {
	e := newEnv(t, nil, bus.WithHandler(func(ctx context.Context, m chargeCard, a bus.Attributes) error { return nil }))
	ctx := t.Context()
	var byValue *chargeCard      // its MessageName dereferences the pointer
	var byPointer *shipmentNoted // its MessageName does not
	for _, tc := range []struct {
		name string
		send func() error
	}{
		{"Send of a nil *T, MessageName on T", func() error { return e.bus.Send(ctx, byValue, bus.To("elsewhere")) }},
		{"Send of a nil *T, MessageName on *T", func() error { return e.bus.Send(ctx, byPointer, bus.To("elsewhere")) }},
		{"Publish of a nil *T", func() error { return e.bus.Publish(ctx, byPointer) }},
	} {
		if err := sendResult(tc.send); !errors.Is(err, bus.ErrInvalidMessage) || !strings.Contains(err.Error(), "nil") {
			t.Errorf("%s: %v, want bus.ErrInvalidMessage for a nil message", tc.name, err)
		}
	}
	err := sendResult(func() error {
		return e.bus.SendBatch(ctx, []bus.Message{chargeCard{OrderID: "1"}, byValue, byPointer, chargeCard{OrderID: "2"}}, bus.To("elsewhere"))
	})
	var be *bus.BatchError
	if !errors.As(err, &be) || len(be.Failures) != 2 || be.Failures[0].Index != 1 || be.Failures[1].Index != 2 || !errors.Is(be.Failures[0].Err, bus.ErrInvalidMessage) {
		t.Errorf("SendBatch with nil pointers at 1 and 2: %v", err)
	}
	if err := sendResult(func() error { return e.bus.Send(ctx, chargeCard{OrderID: "3"}, bus.To("elsewhere"), nil) }); err != nil {
		t.Errorf("Send with a nil option: %v", err)
	}
	if got := e.chargesSentTo("elsewhere"); !slices.Equal(got, []string{"1", "2", "3"}) {
		t.Errorf("sent %v, want [1 2 3]", got)
	}
	for _, s := range e.rec.Sent() {
		if string(s.Envelope.Body) == "null" {
			t.Errorf("sent %s with a body of null", s.Envelope.Name)
		}
	}
}

// bus.To names one endpoint; a publish goes to every subscriber. Publish
// and PublishBatch refuse it with bus.ErrInvalidOption and publish
// nothing, rather than ignore it and publish what the caller meant for
// one endpoint; a batch's one WithMessageID is refused the same way.
func TestPublishRefusesTo(t *testing.T) {
	e := newEnv(t, nil, bus.WithHandler(func(ctx context.Context, m chargeCard, a bus.Attributes) error { return nil }))
	ctx := t.Context()
	for name, publish := range map[string]func() error{
		"Publish": func() error { return e.bus.Publish(ctx, chargeCard{OrderID: "1"}, bus.To("billing")) },
		"PublishBatch": func() error {
			return e.bus.PublishBatch(ctx, []bus.Message{chargeCard{OrderID: "2"}}, bus.To("billing"))
		},
	} {
		err := publish()
		if !errors.Is(err, bus.ErrInvalidOption) || !strings.Contains(err.Error(), `bus.To("billing")`) {
			t.Errorf("%s with bus.To: %v, want bus.ErrInvalidOption naming it", name, err)
		}
		var be *bus.BatchError
		if errors.As(err, &be) {
			t.Errorf("%s with bus.To: a batch error %v, want the call refused as a whole", name, err)
		}
	}
	err := e.bus.SendBatch(ctx, []bus.Message{chargeCard{OrderID: "3"}, chargeCard{OrderID: "4"}}, bus.To("billing"), bus.WithMessageID("one"))
	if !errors.Is(err, bus.ErrInvalidOption) {
		t.Errorf("SendBatch of two with one WithMessageID: %v, want bus.ErrInvalidOption", err)
	}
	if sent := e.rec.Sent(); len(sent) != 0 {
		t.Errorf("sent %d messages, want none", len(sent))
	}
}

// bus.ValidateSend returns the error Send or Publish returns for what
// every bus refuses (a nil message, a name that is empty or panics, To on
// a publish), the same text and sentinel, and nil for what a bus takes.
func TestValidateSendRefusesWhatSendRefuses(t *testing.T) {
	e := newEnv(t, nil, bus.WithHandler(func(ctx context.Context, m chargeCard, a bus.Attributes) error { return nil }))
	for _, tc := range []struct {
		name     string
		kind     bus.Kind
		msg      bus.Message
		opts     []bus.SendOption
		sentinel error
	}{
		{"publish to an endpoint", bus.KindPublish, chargeCard{OrderID: "1"}, []bus.SendOption{bus.To("billing")}, bus.ErrInvalidOption},
		{"send of nil", bus.KindSend, nil, []bus.SendOption{bus.To("billing")}, bus.ErrInvalidMessage},
		{"publish of a nil pointer", bus.KindPublish, (*shipmentNoted)(nil), nil, bus.ErrInvalidMessage},
		{"send of an unnamed message", bus.KindSend, unnamed{}, []bus.SendOption{bus.To("billing")}, bus.ErrInvalidMessage},
		{"publish of a message whose name panics", bus.KindPublish, panicky{}, nil, bus.ErrInvalidMessage},
		{"send to an endpoint", bus.KindSend, chargeCard{OrderID: "2"}, []bus.SendOption{bus.To("billing"), nil}, nil},
		{"publish", bus.KindPublish, chargeCard{OrderID: "3"}, []bus.SendOption{bus.WithAttribute("k", "v")}, nil},
	} {
		got := bus.ValidateSend(tc.kind, tc.msg, tc.opts...)
		var sent error
		if tc.kind == bus.KindPublish {
			sent = e.bus.Publish(t.Context(), tc.msg, tc.opts...)
		} else {
			sent = e.bus.Send(t.Context(), tc.msg, tc.opts...)
		}
		if !errors.Is(got, tc.sentinel) || fmt.Sprint(got) != fmt.Sprint(sent) {
			t.Errorf("%s: ValidateSend = %v, %s = %v; want both %v", tc.name, got, tc.kind, sent, tc.sentinel)
		}
	}
}

// tagsSet is a message whose type is a map: its nil value has a name and
// comes back as sent (JSON null decodes to a nil map).
type tagsSet map[string]string

func (tagsSet) MessageName() string { return "shop.tags_set" }

// Only a nil pointer is refused: a nil map or slice is a value of its
// message type, named without a panic and decoded as it was sent, as
// before Send refused nil pointers.
func TestSendTakesANilMapMessage(t *testing.T) {
	handled := make(chan tagsSet, 1)
	e := newEnv(t, nil, bus.WithHandler(func(ctx context.Context, m tagsSet, a bus.Attributes) error {
		handled <- m
		return nil
	}))
	if err := e.bus.Send(t.Context(), tagsSet(nil)); err != nil {
		t.Fatalf("Send of a nil map message: %v", err)
	}
	e.expect(bustest.Deleted)
	if m := <-handled; m != nil {
		t.Errorf("handled %v, want the nil map sent", m)
	}
}
