package soak_test

import (
	"context"
	"flag"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.uber.org/goleak"
	"golang.org/x/time/rate"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/soak"
	"github.com/plugbus/plugbus/internal/testenv"
	"github.com/plugbus/plugbus/plugin"
	"github.com/plugbus/plugbus/plugins/inbox"
	"github.com/plugbus/plugbus/plugins/otel"
	"github.com/plugbus/plugbus/plugins/outbox"
	"github.com/plugbus/plugbus/plugins/requestreply"
	"github.com/plugbus/plugbus/store/storetest"
	"github.com/plugbus/plugbus/transports/rabbitmq"
	"github.com/plugbus/plugbus/transports/transporttest"
)

var (
	soakFor    = flag.Duration("soak", 0, "run TestSoak for this long (2m in CI, 30m for docs/reliability.md); 0 skips it")
	soakOut    = flag.String("soak.out", "", "directory to write soak.csv and soak.png to (default: the test's temporary directory)")
	soakRate   = flag.Float64("soak.rate", 40, "orders placed per second, and as many requests")
	soakSample = flag.Duration("soak.sample", 0, "time between samples (default: the duration/60, from 1s to 5s)")
	soakHeap   = flag.String("soak.heapprofile", "", "file to write a heap profile to at the last sample, before the backlog drains")
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type placeOrder struct {
	ID int64 `json:"id"`
}

func (placeOrder) MessageName() string { return "soak.PlaceOrder" }

type orderPlaced struct {
	ID int64 `json:"id"`
}

func (orderPlaced) MessageName() string { return "soak.OrderPlaced" }

type getQuote struct {
	SKU int64 `json:"sku"`
}

func (getQuote) MessageName() string { return "soak.GetQuote" }

type quote struct {
	SKU   int64 `json:"sku"`
	Cents int64 `json:"cents"`
}

func (quote) MessageName() string { return "soak.Quote" }

// discard is a span exporter that drops what it is given: the spans are
// made, batched and exported, and nothing piles up.
type discard struct{}

func (discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discard) Shutdown(context.Context) error                             { return nil }

// TestSoak runs a realistic mix for -soak (RabbitMQ; outbox and inbox on
// PostgreSQL; OpenTelemetry tracing and metrics; the tenancy plugin out of
// process; request/reply) at a steady rate, samples heap in use (after a
// GC), goroutines, open fds and the plugin's RSS, writes soak.csv and
// soak.png, and fails when a series grows after warm-up.
//
//	go test -run '^TestSoak$' ./internal/soak -soak=30m -soak.out=docs
func TestSoak(t *testing.T) {
	if *soakFor <= 0 {
		t.Skip("the soak runs with -soak=DURATION (make test runs -soak=2m)")
	}
	d := *soakFor
	interval := *soakSample
	if interval <= 0 {
		interval = min(max(d/60, time.Second), 5*time.Second)
	}
	warmUp := max(30*time.Second, d/10)
	brokerURL := testenv.RabbitMQ(t)
	db := storetest.New(t, storetest.Postgres)
	st := db.Open(t)
	storetest.Exec(t, st.DB(), "CREATE TABLE "+db.Table("orders")+" (id BIGINT NOT NULL)")
	insert := db.Rebind("INSERT INTO " + db.Table("orders") + " (id) VALUES (?)")

	ctx := context.Background()
	warnings := &counter{}
	logger := slog.New(warnings)
	tenancy, err := plugin.BuildAndLoad(ctx, "github.com/plugbus/plugbus/examples/tenancy-plugin", filepath.Join(t.TempDir(), "tenancy-plugin"),
		plugin.WithConfig([]byte(`{"tenant": "soak"}`)), plugin.WithLogger(logger))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tenancy.Close() })
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discard{}))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	t.Cleanup(func() { _ = tp.Shutdown(ctx); _ = mp.Shutdown(ctx) })

	exchange, endpoint := transporttest.Name("soak"), transporttest.Name("soak")
	tr, err := rabbitmq.New(brokerURL, rabbitmq.WithExchange(exchange), rabbitmq.WithLogger(logger))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testenv.DeleteRabbitMQ(t, brokerURL, exchange, endpoint, rabbitmq.DeadLetterQueue(endpoint)) })
	var placed, quoted atomic.Int64
	b, err := bus.New(bus.WithEndpoint(endpoint), bus.WithTransport(tr), bus.WithConcurrency(16), bus.WithLogger(logger),
		bus.WithMiddleware(otel.New(otel.WithTracerProvider(tp), otel.WithMeterProvider(mp)), tenancy, requestreply.New(),
			outbox.New(st, outbox.WithPollInterval(200*time.Millisecond), outbox.WithCleanupInterval(10*time.Second), outbox.WithRetention(30*time.Second)),
			inbox.New(st, inbox.WithCleanupInterval(10*time.Second), inbox.WithRetention(time.Minute))),
		bus.WithHandler(func(ctx context.Context, o placeOrder, _ bus.Attributes) error {
			tx, err := outbox.Tx(ctx)
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, insert, o.ID); err != nil {
				return err
			}
			self, _, _ := bus.MessageContext(ctx)
			return self.Publish(ctx, orderPlaced(o))
		}),
		bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error {
			placed.Add(1)
			return nil
		}),
		bus.WithHandler(func(ctx context.Context, q getQuote, _ bus.Attributes) error {
			return requestreply.Reply(ctx, quote{SKU: q.SKU, Cents: 100 + q.SKU%900})
		}))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		stopCtx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if err := b.Stop(stopCtx); err != nil {
			t.Errorf("Stop: %v", err)
		}
		if err := tr.Close(stopCtx); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
	t.Cleanup(stop)

	// The load: every tick places an order and asks for a quote, each
	// from a goroutine of its own (at most 128 at once).
	start := time.Now()
	loadCtx, stopLoad := context.WithTimeout(ctx, d)
	defer stopLoad()
	var orders, requests, failures atomic.Int64
	var firstFailure atomic.Value
	fail := func(err error) {
		failures.Add(1)
		firstFailure.CompareAndSwap(nil, err.Error())
	}
	var load sync.WaitGroup
	load.Go(func() {
		limiter := rate.NewLimiter(rate.Limit(*soakRate), 1)
		slots := make(chan struct{}, 128)
		var inFlight sync.WaitGroup
		defer inFlight.Wait()
		for id := int64(0); limiter.Wait(loadCtx) == nil; id++ {
			select {
			case slots <- struct{}{}:
			case <-loadCtx.Done():
				return
			}
			inFlight.Go(func() {
				defer func() { <-slots }()
				if err := b.Send(ctx, placeOrder{ID: id}, bus.To(endpoint)); err != nil {
					fail(err)
				} else {
					orders.Add(1)
				}
				q, err := requestreply.Request[quote](ctx, b, getQuote{SKU: id}, requestreply.To(endpoint), requestreply.WithTimeout(30*time.Second))
				switch {
				case err != nil:
					fail(err)
				case q.SKU != id:
					t.Errorf("quote for SKU %d answered request %d", q.SKU, id)
				default:
					quoted.Add(1)
				}
				requests.Add(1)
			})
		}
	})

	var samples []soak.Sample
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for sampling := true; sampling; {
		select {
		case <-tick.C:
			s, err := soak.Take(start, tenancy.PID())
			if err != nil {
				t.Fatal(err)
			}
			samples = append(samples, s)
		case <-loadCtx.Done():
			sampling = false
		}
	}
	if *soakHeap != "" {
		writeFile(t, *soakHeap, func(f *os.File) error { return pprof.Lookup("heap").WriteTo(f, 0) })
	}
	load.Wait()
	// Every order placed is published through the outbox and handled.
	drained, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for placed.Load() < orders.Load() && drained.Err() == nil {
		select { // nothing to wait on but the counter: poll it
		case <-drained.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	stop()

	dir := *soakOut
	if dir == "" {
		dir = t.TempDir()
	}
	writeFile(t, filepath.Join(dir, "soak.csv"), func(f *os.File) error { return soak.WriteCSV(f, samples) })
	title := "plugbus soak, " + d.String()
	writeFile(t, filepath.Join(dir, "soak.png"), func(f *os.File) error { return soak.WritePNG(f, title, samples, warmUp) })
	t.Logf("%v at %.0f orders/s and as many requests: %d orders placed, %d handled (at least once), %d of %d requests answered, %d failures, %d warnings logged; %d samples every %v, %v warm-up; written to %s",
		d, *soakRate, orders.Load(), placed.Load(), quoted.Load(), requests.Load(), failures.Load(), warnings.n.Load(), len(samples), interval, warmUp, dir)
	if f := firstFailure.Load(); f != nil {
		t.Logf("first failure: %v", f)
	}
	if w := warnings.first.Load(); w != nil {
		t.Logf("first warning: %v", w)
	}
	trends, err := soak.Trends(samples, warmUp)
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range trends {
		t.Log(tr)
		if !tr.Flat() {
			t.Errorf("%s grows after warm-up: %+.2f across the run, more than the %.1f allowed", tr.Series.Name, tr.Growth, tr.Allowed)
		}
	}
	if placed.Load() < orders.Load() {
		t.Errorf("%d orders placed, only %d handled", orders.Load(), placed.Load())
	}
	if n := failures.Load(); n*100 > requests.Load() {
		t.Errorf("%d of %d sends and requests failed", n, requests.Load())
	}
}

func writeFile(t *testing.T, path string, write func(*os.File) error) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := write(f); err != nil {
		f.Close()
		t.Fatalf("writing %s: %v", path, err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// counter is a slog.Handler counting warnings and errors and keeping the
// first: a soak logs little, and what it logs is worth a look.
type counter struct {
	n     atomic.Int64
	first atomic.Value
}

func (c *counter) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (c *counter) Handle(_ context.Context, r slog.Record) error {
	c.n.Add(1)
	msg := r.Message
	r.Attrs(func(a slog.Attr) bool { msg += " " + a.String(); return true })
	c.first.CompareAndSwap(nil, msg)
	return nil
}
func (c *counter) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *counter) WithGroup(string) slog.Handler      { return c }
