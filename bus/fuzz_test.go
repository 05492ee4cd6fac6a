package bus_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/plugbus/plugbus/bus"
)

// fuzzOrder is the value-typed message of the fuzz tests, with a field of
// most kinds encoding/json decodes.
type fuzzOrder struct {
	ID     string            `json:"id"`
	Total  int               `json:"total"`
	Price  float64           `json:"price"`
	Paid   bool              `json:"paid"`
	Note   *string           `json:"note"`
	Items  []fuzzItem        `json:"items"`
	Meta   map[string]string `json:"meta"`
	At     time.Time         `json:"at"`
	Extra  json.RawMessage   `json:"extra"`
	Counts [2]uint8          `json:"counts"`
	Any    any               `json:"any"`
}

type fuzzItem struct {
	SKU string `json:"sku"`
	Qty int64  `json:"qty"`
}

func (fuzzOrder) MessageName() string { return "fuzz.order" }

// fuzzRefund is the pointer-typed message of the fuzz tests.
type fuzzRefund struct {
	OrderID string   `json:"order_id"`
	Reasons []string `json:"reasons"`
	Nested  *struct {
		Depth int `json:"depth"`
	} `json:"nested"`
}

func (*fuzzRefund) MessageName() string { return "fuzz.refund" }

const fuzzMaxAttempts = 3

// fuzzHandlers are the handlers of a fuzz bus: one order handler that
// fails or panics on request, one that records what it got, and a refund
// handler that records too.
type fuzzHandlers struct {
	mu     sync.Mutex
	orders []fuzzOrder
	refund []*fuzzRefund
}

func (h *fuzzHandlers) options() []bus.Option {
	return []bus.Option{
		bus.WithHandler(func(_ context.Context, m fuzzOrder, _ bus.Attributes) error {
			switch m.ID {
			case "fail":
				return errors.New("fuzz: the handler failed")
			case "panic":
				panic("fuzz: the handler panicked")
			}
			return nil
		}, bus.HandlerName("fuzz.fail-or-panic")),
		bus.WithHandler(func(_ context.Context, m fuzzOrder, _ bus.Attributes) error {
			h.mu.Lock()
			h.orders = append(h.orders, m)
			h.mu.Unlock()
			return nil
		}, bus.HandlerName("fuzz.record-order")),
		bus.WithHandler(func(_ context.Context, m *fuzzRefund, _ bus.Attributes) error {
			h.mu.Lock()
			h.refund = append(h.refund, m)
			h.mu.Unlock()
			return nil
		}, bus.HandlerName("fuzz.record-refund")),
	}
}

// take returns what the recording handlers got since the last take.
func (h *fuzzHandlers) take() ([]fuzzOrder, []*fuzzRefund) {
	h.mu.Lock()
	defer h.mu.Unlock()
	o, r := h.orders, h.refund
	h.orders, h.refund = nil, nil
	return o, r
}

// decodeLikeTheBus decodes body into the Go type of the handlers of name as
// the bus's JSON serializer does: nil and false when name has no handler.
func decodeLikeTheBus(name string, body []byte) (msg any, handled bool, err error) {
	switch name {
	case "fuzz.order":
		var m fuzzOrder
		err := json.Unmarshal(body, &m)
		return m, true, err
	case "fuzz.refund":
		m := new(fuzzRefund)
		err := json.Unmarshal(body, m)
		return m, true, err
	}
	return nil, false, nil
}

// feedSettlement is one Delete, Return or Fail the bus made on a feed
// transport.
type feedSettlement struct {
	op      string // delete, return, fail
	d       *bus.Delivery
	failure bus.Failure
	cause   error
}

// feedTransport hands its bus the deliveries a test feeds it and reports
// how the bus settled each.
type feedTransport struct {
	feed    chan *bus.Delivery
	settled chan feedSettlement
}

func newFeedTransport() *feedTransport {
	return &feedTransport{feed: make(chan *bus.Delivery), settled: make(chan feedSettlement, 16)}
}

func (*feedTransport) Setup(context.Context, bus.Topology) error { return nil }
func (*feedTransport) Send(context.Context, *bus.Envelope, string) error {
	return errors.New("fuzz: nothing is sent")
}
func (*feedTransport) Publish(context.Context, *bus.Envelope) error {
	return errors.New("fuzz: nothing is published")
}
func (*feedTransport) Close(context.Context) error { return nil }

func (f *feedTransport) Receive(ctx context.Context) (*bus.Delivery, error) {
	select {
	case d := <-f.feed:
		return d, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (f *feedTransport) Delete(_ context.Context, d *bus.Delivery) error {
	f.settled <- feedSettlement{op: "delete", d: d}
	return nil
}

func (f *feedTransport) Return(_ context.Context, d *bus.Delivery, cause error) error {
	f.settled <- feedSettlement{op: "return", d: d, cause: cause}
	return nil
}

func (f *feedTransport) Fail(_ context.Context, d *bus.Delivery, fl bus.Failure) error {
	f.settled <- feedSettlement{op: "fail", d: d, failure: fl}
	return nil
}

// startFuzzBus starts a bus on a feed transport with the fuzz handlers,
// stopped when f ends.
func startFuzzBus(f *testing.F, h *fuzzHandlers) *feedTransport {
	tr := newFeedTransport()
	opts := append([]bus.Option{bus.WithEndpoint("fuzz"), bus.WithTransport(tr), bus.WithConcurrency(1),
		bus.WithMaxAttempts(fuzzMaxAttempts), bus.WithLogger(slog.New(slog.DiscardHandler)),
		bus.WithMiddleware(bus.Middleware{Name: "pass", Incoming: func(ctx context.Context, _ *bus.Incoming, next *bus.IncomingNext) error { return next.Call(ctx) }})},
		h.options()...)
	b, err := bus.New(opts...)
	if err != nil {
		f.Fatal(err)
	}
	if err := b.Start(context.Background()); err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() {
		if err := b.Stop(context.Background()); err != nil {
			f.Errorf("Stop: %v", err)
		}
	})
	return tr
}

// FuzzReceive feeds a bus with handlers deliveries of any name, content
// type, body and attempt, some of which the transport could not read. No
// panic escapes, each delivery is settled exactly once, and how is
// decided by what the delivery holds: a message the bus cannot process
// (unreadable, unnamed, unhandled, undecodable) is dead-lettered at once
// with a valid UTF-8 reason; a handler's failure is retried until the
// maximum attempts; the rest is deleted, its handlers having received
// exactly what the serializer decodes.
func FuzzReceive(f *testing.F) {
	seeds := []struct {
		name, contentType, body string
		attempt                 int
		unreadable              bool
	}{
		{"fuzz.order", "application/json", `{"id":"o-1","total":3,"items":[{"sku":"a","qty":2}],"meta":{"k":"v"},"at":"2026-01-02T03:04:05Z"}`, 1, false},
		{"fuzz.order", "", `{"id":"fail"}`, 1, false},
		{"fuzz.order", "application/json", `{"id":"fail"}`, fuzzMaxAttempts, false},
		{"fuzz.order", "application/json", `{"id":"panic"}`, 2, false},
		{"fuzz.order", "application/json", `{"id":1}`, 1, false},
		{"fuzz.order", "application/json", `{"at":"yesterday"}`, 1, false},
		{"fuzz.order", "application/json", `{"counts":[1,2,3],"total":1e400}`, 1, false},
		{"fuzz.order", "application/json", `null`, 1, false},
		{"fuzz.order", "application/json", ``, 1, false},
		{"fuzz.order", "application/json", `{"any":` + strings.Repeat("[", 10001) + strings.Repeat("]", 10001) + `}`, 1, false},
		{"fuzz.order", "text/plain", `{"id":"o-1"}`, 1, false},
		{"fuzz.order", "application/json; charset=UTF-8", `{"id":"o-1"}`, 1, false},
		{"fuzz.order", "application/json; charset=latin1", `{"id":"o-1"}`, 1, false},
		{"fuzz.order", "application/json", "{\"id\":\"\xff\xfe\"}", 1, false},
		{"fuzz.refund", "application/json", `{"order_id":"o-1","reasons":["late"],"nested":{"depth":1}}`, 1, false},
		{"fuzz.refund", "application/json", `{"nested":"deep"}`, 1, false},
		{"fuzz.unknown", "application/json", `{}`, 1, false},
		{"fuzz.\xff\xfeorder", "application/json", `{}`, 1, false},
		{"", "application/json", `{}`, 1, false},
		{"fuzz.order", "application/json", `{"id":"o-1"}`, 0, false},
		{"fuzz.order", "application/json", `{"id":"fail"}`, -5, false},
		{"fuzz.order", "application/json", `{"id":"fail"}`, 99, false},
		{"fuzz.order", "application/json", `{"id":"o-1"}`, 1, true},
		{"\xff", "\x00", "\xff", -1 << 62, true},
	}
	for _, s := range seeds {
		f.Add(s.name, s.contentType, []byte(s.body), s.attempt, s.unreadable)
	}
	h := &fuzzHandlers{}
	tr := startFuzzBus(f, h)
	f.Fuzz(func(t *testing.T, name, contentType string, body []byte, attempt int, unreadable bool) {
		d := &bus.Delivery{Envelope: bus.Envelope{Name: name, ContentType: contentType, Body: body,
			Attributes: bus.NewAttributes("fuzz-id", "fuzz-corr", fixedTime(), nil, nil)}, Attempt: attempt}
		if unreadable {
			d.Err = errors.New("fuzz: the transport could not read the message")
		}
		select {
		case tr.feed <- d:
		case <-time.After(10 * time.Second):
			t.Fatal("the bus did not take the delivery within 10s")
		}
		var s feedSettlement
		select {
		case s = <-tr.settled:
		case <-time.After(10 * time.Second):
			t.Fatal("the delivery was not settled within 10s")
		}
		if s.d != d {
			t.Fatalf("settled a delivery of %q, want the one fed (%q): a delivery was settled twice", s.d.Name, name)
		}
		orders, refunds := h.take()
		want := max(attempt, 1)
		msg, handled, decodeErr := decodeLikeTheBus(name, body)
		poison := unreadable || name == "" || !handled || !bus.ContentTypeMatches(contentType, "application/json") || decodeErr != nil
		if poison {
			if s.op != "fail" || s.failure.Attempts != want || s.failure.Endpoint != "fuzz" || s.failure.Reason == "" {
				t.Fatalf("poison message settled with %s %+v, want fail at attempt %d with a reason", s.op, s.failure, want)
			}
			if !utf8.ValidString(s.failure.Reason) {
				t.Fatalf("reason is not valid UTF-8: %q", s.failure.Reason)
			}
			if !unreadable && name != "" && !handled && !strings.Contains(s.failure.Reason, "no handler for message "+strconv.Quote(name)) {
				t.Fatalf("reason %q does not name the unhandled message %q", s.failure.Reason, name)
			}
			if len(orders)+len(refunds) > 0 {
				t.Fatalf("a handler ran for a poison message: %v %v", orders, refunds)
			}
			return
		}
		failing := false
		if o, ok := msg.(fuzzOrder); ok {
			failing = o.ID == "fail" || o.ID == "panic"
		}
		switch {
		case failing && want >= fuzzMaxAttempts:
			if s.op != "fail" || s.failure.Attempts != want {
				t.Fatalf("failing last attempt settled with %s %+v, want fail", s.op, s.failure)
			}
		case failing:
			if s.op != "return" {
				t.Fatalf("failing attempt %d settled with %s (%v), want return", want, s.op, s.failure)
			}
		default:
			if s.op != "delete" {
				t.Fatalf("handled message settled with %s (cause %v, failure %+v), want delete", s.op, s.cause, s.failure)
			}
		}
		// Each recording handler received exactly what the serializer decodes.
		switch m := msg.(type) {
		case fuzzOrder:
			if len(orders) != 1 || !reflect.DeepEqual(orders[0], m) || len(refunds) != 0 {
				t.Fatalf("order handler got %#v, want %#v", orders, m)
			}
		case *fuzzRefund:
			if len(refunds) != 1 || !reflect.DeepEqual(refunds[0], m) || len(orders) != 0 {
				t.Fatalf("refund handler got %#v, want %#v", refunds, m)
			}
		}
	})
}

// FuzzDeliver pushes bodies of a handled message name through Deliver
// (the pushed path, AWS Lambda's). Deliver returns nil exactly when the
// body decodes and the handlers succeed, a poison *bus.DecodeError
// exactly when it does not decode (and then no handler runs), and never
// lets a panic out.
func FuzzDeliver(f *testing.F) {
	for _, body := range []string{
		`{"id":"o-1","price":1.5,"paid":true,"note":"n","extra":{"a":[1,2]},"counts":[255,0]}`,
		`{"id":"o-1","counts":[256]}`,
		`{"id":"panic"}`,
		`{"id":"fail"}`,
		`[]`, `"x"`, `{"id":"o-1"}garbage`, `{"meta":{"k":1}}`, `{"items":[{"qty":"1"}]}`,
		`{"any":{"a":{"b":{"c":[1,"x",null,true,{"d":1e308}]}}}}`,
	} {
		f.Add("fuzz.order", []byte(body))
	}
	f.Add("fuzz.refund", []byte(`{"order_id":"o-1","nested":{"depth":2}}`))
	f.Add("fuzz.refund", []byte(`{"reasons":[1]}`))
	h := &fuzzHandlers{}
	tr := newFeedTransport()
	b, err := bus.New(append([]bus.Option{bus.WithEndpoint("fuzz"), bus.WithTransport(tr), bus.WithLogger(slog.New(slog.DiscardHandler))}, h.options()...)...)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = b.Stop(context.Background()) })
	f.Fuzz(func(t *testing.T, name string, body []byte) {
		if name != "fuzz.refund" {
			name = "fuzz.order"
		}
		d := &bus.Delivery{Envelope: bus.Envelope{Name: name, ContentType: "application/json", Body: body,
			Attributes: bus.NewAttributes("fuzz-id", "fuzz-corr", fixedTime(), nil, nil)}, Attempt: 1}
		err := b.Deliver(t.Context(), d)
		orders, refunds := h.take()
		msg, _, decodeErr := decodeLikeTheBus(name, body)
		if decodeErr != nil {
			var de *bus.DecodeError
			if !errors.As(err, &de) || !bus.IsPermanent(err) {
				t.Fatalf("Deliver of an undecodable body: %v, want a poison *bus.DecodeError", err)
			}
			if len(orders)+len(refunds) > 0 {
				t.Fatalf("a handler ran for an undecodable body: %v %v", orders, refunds)
			}
			return
		}
		if o, ok := msg.(fuzzOrder); ok && (o.ID == "fail" || o.ID == "panic") {
			if !errors.Is(err, bus.ErrHandlerDispatchRejected) || bus.IsPermanent(err) {
				t.Fatalf("Deliver with a failing handler: %v, want a retryable *bus.HandlerDispatchRejectedError", err)
			}
		} else if err != nil {
			t.Fatalf("Deliver: %v", err)
		}
		switch m := msg.(type) {
		case fuzzOrder:
			if len(orders) != 1 || !reflect.DeepEqual(orders[0], m) {
				t.Fatalf("order handler got %#v, want %#v", orders, m)
			}
		case *fuzzRefund:
			if len(refunds) != 1 || !reflect.DeepEqual(refunds[0], m) {
				t.Fatalf("refund handler got %#v, want %#v", refunds, m)
			}
		}
	})
}
