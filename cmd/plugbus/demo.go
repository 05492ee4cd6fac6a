package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/tracetree"
	"github.com/plugbus/plugbus/plugin"
	"github.com/plugbus/plugbus/plugins/inbox"
	"github.com/plugbus/plugbus/plugins/otel"
	"github.com/plugbus/plugbus/plugins/outbox"
	"github.com/plugbus/plugbus/store/sqlite"
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
		Outgoing: func(ctx context.Context, out *bus.Outgoing, next bus.Next) error {
			when := "to the transport now"
			if out.InHandler() {
				when = "buffered until the handler succeeds"
			}
			p.printf("%-9s outgoing  %-7s %-20s → %s, %s\n", service, out.Kind(), out.Name(), orDash(out.Destination(), "subscribers"), when)
			return next(ctx)
		},
		Incoming: func(ctx context.Context, in *bus.Incoming, next bus.Next) error {
			p.printf("%-9s incoming  %-28s attempt %d, correlation …%s\n", service, in.Name(), in.Attempt(), short(in.Attributes().CorrelationID))
			return next(ctx)
		},
		Handling: func(ctx context.Context, h *bus.Handling, next bus.Next) error {
			p.printf("%-9s handler   %-28s starts\n", service, h.HandlerName())
			return next(ctx)
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
		Outgoing: func(ctx context.Context, out *bus.Outgoing, next bus.Next) error {
			start := time.Now()
			err := next(ctx)
			report("outgoing", out.Name(), start, err)
			return err
		},
		Incoming: func(ctx context.Context, in *bus.Incoming, next bus.Next) error {
			start := time.Now()
			err := next(ctx)
			report("incoming", in.Name(), start, err)
			return err
		},
		Handling: func(ctx context.Context, h *bus.Handling, next bus.Next) error {
			start := time.Now()
			err := next(ctx)
			report("handler", h.HandlerName(), start, err)
			return err
		},
	}
}

// reportFailures tells the demo when a message is dead-lettered, and when
// one is deleted (handled).
type reportFailures struct {
	bus.Transport
	failed  chan<- bus.Failure
	deleted chan<- string // message ids
}

func (r *reportFailures) Delete(ctx context.Context, d *bus.Delivery) error {
	err := r.Transport.Delete(ctx, d)
	if r.deleted != nil {
		select {
		case r.deleted <- d.Attributes.MessageID:
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

// runDemo runs the shop: orders, billing and shipping, three buses on one
// in-memory broker, traced with the otel plugin.
func runDemo(ctx context.Context, w io.Writer, args []string) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(w)
	orders := fs.Int("orders", 1, "how many orders to place")
	external := fs.Bool("external", true, "build and load the example out-of-process plugin (examples/tenancy-plugin; needs the Go toolchain)")
	verbose := fs.Bool("v", false, "print the bus's own debug logs")
	if err := fs.Parse(args); err != nil {
		return err
	}
	p := &printer{w: w}
	level := slog.LevelError
	if *verbose {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(p, &slog.HandlerOptions{Level: level}))

	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(context.WithoutCancel(ctx))

	// The out-of-process tenancy plugin: built from examples/tenancy-plugin,
	// pinned to its checksum and loaded like any other plugin. It stamps
	// x-tenant on outgoing messages and rejects incoming ones without it.
	var plugins []bus.Plugin
	if *external {
		dir, err := os.MkdirTemp("", "plugbus-demo-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		tenancy, err := plugin.BuildAndLoad(ctx, "github.com/plugbus/plugbus/examples/tenancy-plugin", filepath.Join(dir, "tenancy-plugin"),
			plugin.WithConfig([]byte(`{"tenant":"acme"}`)), plugin.WithLogger(logger))
		if err != nil {
			p.printf("external plugin not loaded (%v); run with -external=false to skip it\n", err)
		} else {
			defer tenancy.Close()
			d := tenancy.Describe()
			p.printf("loaded external plugin %s %s (pid %d, stages %v)\n", d.Name, d.Version, tenancy.PID(), d.Stages)
			plugins = append(plugins, tenancy)
		}
	}

	broker := memory.NewBroker()
	deadLettered := make(chan bus.Failure, 1)
	var wg sync.WaitGroup
	wg.Add(*orders)
	billingDeleted := make(chan string, 64)
	newService := func(name string, opts ...bus.Option) (*bus.Bus, error) {
		rep := &reportFailures{Transport: memory.New(memory.WithBroker(broker)), failed: deadLettered}
		if name == "billing" {
			rep.deleted = billingDeleted
		}
		base := []bus.Option{
			bus.WithEndpoint(name), bus.WithLogger(logger), bus.WithMaxAttempts(3),
			bus.WithTransport(rep),
			bus.WithMiddleware(otel.New(otel.WithTracerProvider(tp)), logging(p, name), timing(p, name)),
			bus.WithMiddleware(plugins...),
		}
		return bus.New(append(base, opts...)...)
	}

	var svcs []*bus.Bus
	ordersBus, err := newService("orders",
		bus.WithHandler(func(ctx context.Context, m PlaceOrder, a bus.Attributes) error {
			b, _, _ := bus.MessageContext(ctx)
			return b.Publish(ctx, OrderPlaced(m))
		}, bus.HandlerName("take-order")),
		bus.WithHandler(func(ctx context.Context, m OrderShipped, a bus.Attributes) error {
			wg.Done()
			return nil
		}, bus.HandlerName("close-order")))
	if err != nil {
		return err
	}
	// Billing keeps its payments in SQLite, the embedded store: each
	// handler runs in a transaction that also holds what it publishes (the
	// outbox) and the record that it processed the message (the inbox).
	dbDir, err := os.MkdirTemp("", "plugbus-demo-db-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dbDir)
	st, err := sqlite.Open(filepath.Join(dbDir, "billing.db"))
	if err != nil {
		return err
	}
	defer st.DB().Close()
	if _, err := st.DB().ExecContext(ctx, `CREATE TABLE payments (order_id TEXT PRIMARY KEY, amount_cents INTEGER NOT NULL)`); err != nil {
		return err
	}
	var firstPlaced struct {
		sync.Mutex
		id  string
		msg OrderPlaced
	}
	billing, err := newService("billing",
		bus.WithMiddleware(outbox.New(st), inbox.New(st)),
		bus.WithHandler(func(ctx context.Context, m OrderPlaced, a bus.Attributes) error {
			firstPlaced.Lock()
			if firstPlaced.id == "" {
				firstPlaced.id, firstPlaced.msg = a.MessageID, m
			}
			firstPlaced.Unlock()
			if _, err := outbox.Tx(ctx).ExecContext(ctx, `INSERT INTO payments (order_id, amount_cents) VALUES (?, ?)`, m.OrderID, m.Amount); err != nil {
				return err
			}
			b, _, _ := bus.MessageContext(ctx)
			return b.Publish(ctx, PaymentTaken{OrderID: m.OrderID}) // stored in the same transaction
		}, bus.HandlerName("charge-card")))
	if err != nil {
		return err
	}
	shipping, err := newService("shipping",
		bus.WithHandler(func(ctx context.Context, m PaymentTaken, a bus.Attributes) error {
			b, _, _ := bus.MessageContext(ctx)
			return b.Publish(ctx, OrderShipped(m))
		}, bus.HandlerName("ship-parcel")))
	if err != nil {
		return err
	}
	svcs = append(svcs, ordersBus, billing, shipping)
	for _, b := range svcs {
		if err := b.Start(ctx); err != nil {
			return err
		}
	}
	stopAll := func() error {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		var errs []error
		for _, b := range svcs {
			errs = append(errs, b.Stop(sctx))
		}
		return errors.Join(errs...)
	}

	p.printf("plugbus demo: orders → billing → shipping on the in-memory transport, billing on SQLite\n\n")
	// A front end sends the command from outside any handler.
	front, err := bus.New(bus.WithLogger(logger), bus.WithTransport(memory.New(memory.WithBroker(broker))),
		bus.WithRoute("orders", PlaceOrder{}),
		bus.WithMiddleware(otel.New(otel.WithTracerProvider(tp)), logging(p, "frontend"), timing(p, "frontend")),
		bus.WithMiddleware(plugins...))
	if err != nil {
		return err
	}
	svcs = append(svcs, front)
	for i := range *orders {
		if err := front.Send(ctx, PlaceOrder{OrderID: fmt.Sprintf("order-%d", i+1), Amount: 4200}); err != nil {
			return errors.Join(err, stopAll())
		}
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		return errors.Join(errors.New("demo: orders did not complete within 10s"), stopAll())
	case <-ctx.Done():
		return errors.Join(ctx.Err(), stopAll())
	}
	// Replay the first OrderPlaced with its original message id, as a broker
	// would after a lost acknowledgement: billing's inbox skips it.
	firstPlaced.Lock()
	dupID, dupMsg := firstPlaced.id, firstPlaced.msg
	firstPlaced.Unlock()
	for len(billingDeleted) > 0 {
		<-billingDeleted
	}
	p.printf("\nreplaying OrderPlaced %s with its message id …%s:\n", dupMsg.OrderID, short(dupID))
	if err := front.Publish(ctx, dupMsg, bus.WithMessageID(dupID)); err != nil {
		return errors.Join(err, stopAll())
	}
	for id := range billingDeleted {
		if id == dupID {
			break
		}
	}
	var payments int
	if err := st.DB().QueryRowContext(ctx, `SELECT count(*) FROM payments`).Scan(&payments); err != nil {
		return errors.Join(err, stopAll())
	}
	if payments != *orders {
		return errors.Join(fmt.Errorf("demo: billing.db holds %d payments for %d orders: the duplicate was applied", payments, *orders), stopAll())
	}
	p.printf("→ billing.db holds %d payment(s) for %d order(s): the duplicate was skipped by the inbox\n", payments, *orders)

	if len(plugins) > 0 {
		// A legacy sender without the tenancy plugin: its message has no
		// tenant, the plugin in the orders service rejects it on every
		// attempt, and it ends in the dead-letter queue with the reason.
		legacy, err := bus.New(bus.WithLogger(logger), bus.WithTransport(memory.New(memory.WithBroker(broker))), bus.WithRoute("orders", PlaceOrder{}))
		if err != nil {
			return errors.Join(err, stopAll())
		}
		svcs = append(svcs, legacy)
		p.printf("\nlegacy  sends PlaceOrder without a tenant:\n")
		if err := legacy.Send(ctx, PlaceOrder{OrderID: "legacy-1"}); err != nil {
			return errors.Join(err, stopAll())
		}
		select {
		case f := <-deadLettered:
			p.printf("→ dead-lettered by %s after %d attempts: %s\n", f.Endpoint, f.Attempts, f.Reason)
		case <-time.After(10 * time.Second):
			return errors.Join(errors.New("demo: the legacy message was not dead-lettered within 10s"), stopAll())
		}
	}
	if err := stopAll(); err != nil {
		return err
	}
	p.printf("\ntrace recorded by the otel plugin:\n")
	tracetree.Print(p, spans.Ended())
	return nil
}
