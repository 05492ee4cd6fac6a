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
	"sync/atomic"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/tracetree"
	"github.com/plugbus/plugbus/plugin"
	"github.com/plugbus/plugbus/plugins/inbox"
	"github.com/plugbus/plugbus/plugins/otel"
	"github.com/plugbus/plugbus/plugins/outbox"
	"github.com/plugbus/plugbus/store"
	"github.com/plugbus/plugbus/store/sqlite"
	"github.com/plugbus/plugbus/transports/memory"
)

// runDemo runs the shop: orders, billing and shipping, three buses on one
// in-memory broker, traced with the otel plugin. Each order is an instance
// of the order saga in the orders service (placed → paid → shipped, with a
// payment timeout). It places the orders (shipping's courier API fails the
// first order's first round: a delayed retry heals it), replays a message
// to show the inbox skipping it, places an order billing declines, which
// the saga's payment timeout cancels, sends
// a message without a tenant to show the tenancy plugin's permanent
// failure dead-lettering it at once, and prints the trace.
func runDemo(ctx context.Context, w io.Writer, args []string) error {
	opts, err := parseDemoFlags(w, args)
	if err != nil {
		return err
	}
	s := newShop(w, opts.verbose)
	defer s.tracing.Shutdown(context.WithoutCancel(ctx))
	if opts.external {
		unload, err := s.loadTenancyPlugin(ctx)
		if err != nil {
			return err
		}
		defer unload()
	}
	closeBillingDB, err := s.openBillingDB(ctx)
	if err != nil {
		return err
	}
	defer closeBillingDB()
	closeOrdersDB, err := s.openOrdersDB()
	if err != nil {
		return err
	}
	defer closeOrdersDB()
	if err := s.startServices(ctx); err != nil {
		return errors.Join(err, s.stop(ctx))
	}
	s.out.printf("plugbus demo: orders → billing → shipping on the in-memory transport, billing and the order saga on SQLite\n\n")
	if err := s.play(ctx, opts.orders); err != nil {
		return errors.Join(err, s.stop(ctx))
	}
	if opts.console != "" {
		if err := s.serveConsole(ctx, opts.console); err != nil {
			return errors.Join(err, s.stop(ctx))
		}
	}
	if err := s.stop(ctx); err != nil {
		return err
	}
	s.out.printf("\ntrace recorded by the otel plugin:\n")
	tracetree.Print(s.out, s.spans.Ended())
	return nil
}

// demoOptions are the demo's flags.
type demoOptions struct {
	orders   int
	external bool
	verbose  bool
	console  string
}

func parseDemoFlags(w io.Writer, args []string) (demoOptions, error) {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(w)
	var o demoOptions
	fs.IntVar(&o.orders, "orders", 1, "how many orders to place")
	fs.BoolVar(&o.external, "external", true, "build and load the example out-of-process plugin (examples/tenancy-plugin; needs the Go toolchain)")
	fs.BoolVar(&o.verbose, "v", false, "print the bus's own debug logs")
	fs.StringVar(&o.console, "console", "", "after the demo, keep the services running with the web console on this address (127.0.0.1:8089) until Ctrl-C")
	return o, fs.Parse(args)
}

// shop is the demo's world: the services' buses on one in-memory broker,
// what they report to the demo, and the spans they record.
type shop struct {
	out     *printer
	logger  *slog.Logger
	spans   *tracetest.SpanRecorder
	tracing *sdktrace.TracerProvider
	broker  *memory.Broker
	plugins []bus.Plugin // the tenancy plugin, when loaded

	billingDB *store.Store
	ordersDB  *store.Store // the order saga's instances, with the orders service's outbox and inbox
	buses     []*bus.Bus   // every bus made, stopped by stop
	front     *bus.Bus     // sends from outside any handler

	ordersClosed   sync.WaitGroup
	closed         sync.Map            // order ids closed, so that a redelivery does not count twice
	cancelled      chan OrderCancelled // orders the saga cancelled
	deadLettered   chan bus.Failure
	billingDeleted chan string // ids of the messages billing handled or skipped
	firstPlaced    firstOrderPlaced
	courierDown    atomic.Int32 // how many more times shipping's courier API fails order-1
}

// firstOrderPlaced is the first OrderPlaced billing handled, to replay.
type firstOrderPlaced struct {
	mu  sync.Mutex
	id  string
	msg OrderPlaced
}

func newShop(w io.Writer, verbose bool) *shop {
	out := &printer{w: w}
	level := slog.LevelError
	if verbose {
		level = slog.LevelDebug
	}
	spans := tracetest.NewSpanRecorder()
	s := &shop{out: out, logger: slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: level})),
		spans: spans, tracing: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)), broker: memory.NewBroker(),
		deadLettered: make(chan bus.Failure, 1), billingDeleted: make(chan string, 64), cancelled: make(chan OrderCancelled, 16)}
	s.courierDown.Store(int32(demoRetry().Immediate + 1)) // the first order's first round
	return s
}

// loadTenancyPlugin builds examples/tenancy-plugin, pins it to its
// checksum and loads it like any other plugin. It stamps x-tenant on
// outgoing messages and rejects incoming ones without it. A plugin that
// cannot be built or loaded is reported and left out.
func (s *shop) loadTenancyPlugin(ctx context.Context) (unload func(), err error) {
	dir, err := os.MkdirTemp("", "plugbus-demo-")
	if err != nil {
		return nil, err
	}
	tenancy, err := plugin.BuildAndLoad(ctx, "github.com/plugbus/plugbus/examples/tenancy-plugin", filepath.Join(dir, "tenancy-plugin"),
		plugin.WithConfig([]byte(`{"tenant":"acme"}`)), plugin.WithLogger(s.logger))
	if err != nil {
		s.out.printf("external plugin not loaded (%v); run with -external=false to skip it\n", err)
		return func() { os.RemoveAll(dir) }, nil
	}
	d := tenancy.Describe()
	s.out.printf("loaded external plugin %s %s (pid %d, stages: %s)\n", d.Name, d.Version, tenancy.PID(), d.Stages)
	s.plugins = append(s.plugins, tenancy)
	return func() {
		tenancy.Close()
		os.RemoveAll(dir)
	}, nil
}

// openBillingDB opens billing's SQLite database, the embedded store, with
// its payments table.
func (s *shop) openBillingDB(ctx context.Context) (closeDB func(), err error) {
	dir, err := os.MkdirTemp("", "plugbus-demo-db-")
	if err != nil {
		return nil, err
	}
	st, err := sqlite.Open(filepath.Join(dir, "billing.db"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	closeDB = func() {
		st.Close()
		os.RemoveAll(dir)
	}
	if _, err := st.DB().ExecContext(ctx, `CREATE TABLE payments (order_id TEXT PRIMARY KEY, amount_cents INTEGER NOT NULL)`); err != nil {
		closeDB()
		return nil, err
	}
	s.billingDB = st
	return closeDB, nil
}

// openOrdersDB opens the orders service's SQLite database: the order
// saga's instances, its outbox and its inbox.
func (s *shop) openOrdersDB() (closeDB func(), err error) {
	dir, err := os.MkdirTemp("", "plugbus-demo-orders-")
	if err != nil {
		return nil, err
	}
	st, err := sqlite.Open(filepath.Join(dir, "orders.db"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s.ordersDB = st
	return func() {
		st.Close()
		os.RemoveAll(dir)
	}, nil
}

// newBus returns a bus on the shop's broker that prints its stages, is
// traced, and runs the tenancy plugin when it is loaded.
func (s *shop) newBus(service string, transport bus.Transport, opts ...bus.Option) (*bus.Bus, error) {
	base := []bus.Option{
		bus.WithLogger(s.logger), bus.WithTransport(transport),
		bus.WithMiddleware(otel.New(otel.WithTracerProvider(s.tracing)), logging(s.out, service), timing(s.out, service)),
		bus.WithMiddleware(s.plugins...),
	}
	b, err := bus.New(append(base, opts...)...)
	if err == nil {
		s.buses = append(s.buses, b)
	}
	return b, err
}

// demoRetry is the services' retry policy: the default's shape (2
// immediate retries, then delayed rounds with back-off), with delays short
// enough for a demo.
func demoRetry() bus.RetryPolicy {
	return bus.RetryPolicy{Immediate: 2, Delayed: 3, Backoff: bus.Backoff{Initial: 50 * time.Millisecond, Max: 200 * time.Millisecond}}
}

// newService returns the bus of the endpoint service, which reports its
// dead letters (and billing its deleted messages) to the demo.
func (s *shop) newService(service string, opts ...bus.Option) (*bus.Bus, error) {
	tr := &reportFailures{Transport: memory.New(memory.WithBroker(s.broker)), out: s.out, service: service, failed: s.deadLettered}
	if service == "billing" {
		tr.deletedIDs = s.billingDeleted
	}
	return s.newBus(service, tr, append([]bus.Option{bus.WithEndpoint(service), bus.WithRetry(demoRetry())}, opts...)...)
}

// startServices starts orders, billing and shipping. Billing keeps its
// payments in SQLite: each handler runs in a transaction that also holds
// what it publishes (the outbox) and the record that it processed the
// message (the inbox).
func (s *shop) startServices(ctx context.Context) error {
	publisher := func(ctx context.Context) *bus.Bus { b, _, _ := bus.MessageContext(ctx); return b }
	if _, err := s.newService("orders",
		bus.WithMiddleware(outbox.New(s.ordersDB), inbox.New(s.ordersDB)),
		s.orderSaga(s.ordersDB).Option(), // PlaceOrder, PaymentTaken, OrderShipped and the payment timeout
		bus.WithHandler(func(_ context.Context, m OrderShipped, _ bus.Attributes) error {
			if _, again := s.closed.LoadOrStore(m.OrderID, true); !again {
				s.ordersClosed.Done()
			}
			return nil
		}, bus.HandlerName("close-order")),
		bus.WithHandler(func(_ context.Context, m OrderCancelled, _ bus.Attributes) error {
			select {
			case s.cancelled <- m:
			default:
			}
			return nil
		}, bus.HandlerName("notify-customer"))); err != nil {
		return err
	}
	if _, err := s.newService("billing",
		bus.WithMiddleware(outbox.New(s.billingDB), inbox.New(s.billingDB)),
		bus.WithHandler(func(ctx context.Context, m OrderPlaced, a bus.Attributes) error {
			if m.Amount == 0 {
				s.out.printf("%-9s declines  %-28s no amount to charge: no payment\n", "billing", m.OrderID)
				return nil
			}
			s.firstPlaced.keep(a.MessageID, m)
			tx, err := outbox.Tx(ctx) // the handler's transaction
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO payments (order_id, amount_cents) VALUES (?, ?)`, m.OrderID, m.Amount); err != nil {
				return err
			}
			return publisher(ctx).Publish(ctx, PaymentTaken{OrderID: m.OrderID}) // stored in the same transaction
		}, bus.HandlerName("charge-card"))); err != nil {
		return err
	}
	if _, err := s.newService("shipping",
		bus.WithHandler(func(ctx context.Context, m PaymentTaken, _ bus.Attributes) error {
			if m.OrderID == "order-1" && s.courierDown.Add(-1) >= 0 {
				return errors.New("courier API: 503 Service Unavailable") // a transient failure: healed by a delayed retry
			}
			return publisher(ctx).Publish(ctx, OrderShipped(m))
		}, bus.HandlerName("ship-parcel"))); err != nil {
		return err
	}
	for _, b := range s.buses {
		if err := b.Start(ctx); err != nil {
			return err
		}
	}
	return nil
}

// keep records the first OrderPlaced it is given.
func (f *firstOrderPlaced) keep(id string, m OrderPlaced) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.id == "" {
		f.id, f.msg = id, m
	}
}

func (f *firstOrderPlaced) get() (string, OrderPlaced) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.id, f.msg
}

// play places the orders, replays one, and, with the tenancy plugin,
// sends one without a tenant.
func (s *shop) play(ctx context.Context, orders int) error {
	if err := s.placeOrders(ctx, orders); err != nil {
		return err
	}
	if err := s.replayFirstOrderPlaced(ctx, orders); err != nil {
		return err
	}
	if err := s.placeUnpaidOrder(ctx); err != nil {
		return err
	}
	if len(s.plugins) > 0 {
		return s.sendWithoutTenant(ctx)
	}
	return nil
}

// placeOrders sends n PlaceOrder from a front end, outside any handler,
// and waits until every order is closed.
func (s *shop) placeOrders(ctx context.Context, n int) error {
	front, err := s.newBus("frontend", memory.New(memory.WithBroker(s.broker)), bus.WithRoute("orders", PlaceOrder{}))
	if err != nil {
		return err
	}
	s.front = front
	s.ordersClosed.Add(n)
	for i := range n {
		if err := front.Send(ctx, PlaceOrder{OrderID: fmt.Sprintf("order-%d", i+1), Amount: 4200}); err != nil {
			return err
		}
	}
	closed := make(chan struct{})
	go func() { s.ordersClosed.Wait(); close(closed) }()
	select {
	case <-closed:
		return nil
	case <-time.After(10 * time.Second):
		return errors.New("demo: orders did not complete within 10s")
	case <-ctx.Done():
		return ctx.Err()
	}
}

// replayFirstOrderPlaced publishes the first OrderPlaced again with its
// original message id, as a broker would after a lost acknowledgement,
// and checks that billing's inbox skipped it: billing.db holds one
// payment per order.
func (s *shop) replayFirstOrderPlaced(ctx context.Context, orders int) error {
	dupID, dupMsg := s.firstPlaced.get()
	for len(s.billingDeleted) > 0 {
		<-s.billingDeleted
	}
	s.out.printf("\nreplaying OrderPlaced %s with its message id …%s:\n", dupMsg.OrderID, short(dupID))
	if err := s.front.Publish(ctx, dupMsg, bus.WithMessageID(dupID)); err != nil {
		return err
	}
	for id := range s.billingDeleted {
		if id == dupID {
			break
		}
	}
	var payments int
	if err := s.billingDB.DB().QueryRowContext(ctx, `SELECT count(*) FROM payments`).Scan(&payments); err != nil {
		return err
	}
	if payments != orders {
		return fmt.Errorf("demo: billing.db holds %d payments for %d orders: the duplicate was applied", payments, orders)
	}
	s.out.printf("→ billing.db holds %d payment(s) for %d order(s): the duplicate was skipped by the inbox\n", payments, orders)
	return nil
}

// placeUnpaidOrder places an order billing declines: no payment comes,
// and the order saga's payment timeout cancels it.
func (s *shop) placeUnpaidOrder(ctx context.Context) error {
	s.out.printf("\nplacing order-unpaid, which billing declines:\n")
	placed := time.Now()
	if err := s.front.Send(ctx, PlaceOrder{OrderID: "order-unpaid"}); err != nil {
		return err
	}
	select {
	case m := <-s.cancelled:
		s.out.printf("→ %s cancelled by the order saga after %s: %s\n", m.OrderID, time.Since(placed).Round(100*time.Millisecond), m.Reason)
	case <-time.After(10 * time.Second):
		return errors.New("demo: the unpaid order was not cancelled within 10s")
	case <-ctx.Done():
		return ctx.Err()
	}
	active, err := s.ordersDB.ActiveSagas(ctx, "order")
	if err != nil {
		return err
	}
	s.out.printf("→ orders.db: %d order saga(s) still running\n", active)
	return nil
}

// sendWithoutTenant sends PlaceOrder from a legacy sender without the
// tenancy plugin: its message has no tenant, the plugin in the orders
// service rejects it with a permanent failure, and it goes to the
// dead-letter queue at once, on its first attempt, with the reason.
func (s *shop) sendWithoutTenant(ctx context.Context) error {
	legacy, err := bus.New(bus.WithLogger(s.logger), bus.WithTransport(memory.New(memory.WithBroker(s.broker))), bus.WithRoute("orders", PlaceOrder{}))
	if err != nil {
		return err
	}
	s.buses = append(s.buses, legacy)
	s.out.printf("\nlegacy  sends PlaceOrder without a tenant:\n")
	if err := legacy.Send(ctx, PlaceOrder{OrderID: "legacy-1"}); err != nil {
		return err
	}
	select {
	case f := <-s.deadLettered:
		when := fmt.Sprintf("after %d attempts", f.Attempts)
		if f.Attempts == 1 {
			when = "on its first attempt"
		}
		s.out.printf("→ dead-lettered by %s %s: %s\n", f.Endpoint, when, f.Reason)
		return nil
	case <-time.After(10 * time.Second):
		return errors.New("demo: the legacy message was not dead-lettered within 10s")
	}
}

// stop stops every bus the shop made, draining what they handle.
func (s *shop) stop(ctx context.Context) error {
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	var errs []error
	for _, b := range s.buses {
		errs = append(errs, b.Stop(stopCtx))
	}
	return errors.Join(errs...)
}
