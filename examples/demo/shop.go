package main

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/tracetree"
	"github.com/plugbus/plugbus/transports/memory"
)

// The shop's messages.

// PlaceOrder asks the orders service to take an order.
type PlaceOrder struct {
	OrderID string `json:"order_id"`
	Amount  int    `json:"amount_cents"`
}

// MessageName implements bus.Message.
func (PlaceOrder) MessageName() string { return "shop.place_order" }

// OrderPlaced is published once an order is taken.
type OrderPlaced struct {
	OrderID string `json:"order_id"`
	Amount  int    `json:"amount_cents"`
}

// MessageName implements bus.Message.
func (OrderPlaced) MessageName() string { return "shop.order_placed" }

// PaymentTaken is published by billing.
type PaymentTaken struct {
	OrderID string `json:"order_id"`
}

// MessageName implements bus.Message.
func (PaymentTaken) MessageName() string { return "shop.payment_taken" }

// OrderShipped is published by shipping.
type OrderShipped struct {
	OrderID string `json:"order_id"`
}

// MessageName implements bus.Message.
func (OrderShipped) MessageName() string { return "shop.order_shipped" }

// OrderCancelled is published by the order saga when the payment did not
// arrive in time.
type OrderCancelled struct {
	OrderID string `json:"order_id"`
	Reason  string `json:"reason"`
}

// MessageName implements bus.Message.
func (OrderCancelled) MessageName() string { return "shop.order_cancelled" }

// PaymentOverdue is the order saga's payment timeout.
type PaymentOverdue struct {
	OrderID string `json:"order_id"`
}

// MessageName implements bus.Message.
func (PaymentOverdue) MessageName() string { return "shop.payment_overdue" }

// printer serialises the demo's output lines.
type printer struct {
	mu sync.Mutex
	w  io.Writer
}

// Write lets the logger share the printer's lock.
func (p *printer) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.w.Write(b)
}

func (p *printer) printf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, format, args...)
}

// logging prints what each stage is about to do, on all three stages.
func logging(p *printer, service string) bus.Middleware {
	return bus.Middleware{
		Name: "logging",
		Outgoing: func(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
			when := "to the transport now"
			if out.InHandler() {
				when = "buffered until the handler succeeds"
			}
			p.printf("%-9s outgoing  %-7s %-20s → %s, %s\n", service, out.Kind(), out.Name(), orDash(out.Destination(), "subscribers"), when)
			return next.Call(ctx)
		},
		Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
			p.printf("%-9s incoming  %-28s attempt %d, correlation …%s\n", service, in.Name(), in.Attempt(), short(in.Attributes().CorrelationID))
			return next.Call(ctx)
		},
		Handling: func(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
			p.printf("%-9s handler   %-28s starts\n", service, h.HandlerName())
			return next.Call(ctx)
		},
	}
}

// timing reports how long each stage took once it returns, on all three stages.
func timing(p *printer, service string) bus.Middleware {
	report := func(stage, what string, start time.Time, err error) {
		status := "ok"
		if err != nil {
			status = "failed: " + err.Error()
		}
		p.printf("%-9s %-9s %-28s %s in %s\n", service, stage, what, status, tracetree.Duration(time.Since(start)))
	}
	return bus.Middleware{
		Name: "timing",
		Outgoing: func(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
			start := time.Now()
			err := next.Call(ctx)
			report("outgoing", out.Name(), start, err)
			return err
		},
		Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
			start := time.Now()
			err := next.Call(ctx)
			report("incoming", in.Name(), start, err)
			return err
		},
		Handling: func(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
			start := time.Now()
			err := next.Call(ctx)
			report("handler", h.HandlerName(), start, err)
			return err
		},
	}
}

// reportFailures tells the demo when a message is dead-lettered, and when
// one is deleted (handled), and prints the delayed retries it carries.
type reportFailures struct {
	*memory.Transport
	out        *printer
	service    string
	failed     chan<- bus.Failure
	deletedIDs chan<- string // nil: not reported
}

func (r *reportFailures) ReturnAfter(ctx context.Context, d *bus.Delivery, cause error, delay time.Duration) error {
	r.out.printf("%-9s retry     %-28s attempt %d failed; delayed retry %d in %s (the bus's retry policy)\n", r.service, d.Name, d.Attempt, d.Retries.Delayed, tracetree.Duration(delay))
	return r.Transport.ReturnAfter(ctx, d, cause, delay)
}

func (r *reportFailures) Delete(ctx context.Context, d *bus.Delivery) error {
	err := r.Transport.Delete(ctx, d)
	if r.deletedIDs != nil {
		select {
		case r.deletedIDs <- d.Attributes.MessageID:
		default:
		}
	}
	return err
}

func (r *reportFailures) Fail(ctx context.Context, d *bus.Delivery, f bus.Failure) error {
	err := r.Transport.Fail(ctx, d, f)
	select {
	case r.failed <- f:
	default:
	}
	return err
}

func orDash(s, alt string) string {
	if s == "" {
		return alt
	}
	return s
}

func short(id string) string {
	if len(id) > 8 {
		return id[len(id)-8:]
	}
	return id
}
