package bench_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/plugbus/plugbus/bench"
	"github.com/plugbus/plugbus/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

type maker struct {
	name string
	open func(ctx context.Context) (bench.Side, error)
}

func memoryMakers(layers int) []maker {
	return []maker{
		{"plugbus c=1", func(ctx context.Context) (bench.Side, error) { return bench.NewPlugbusMemory(ctx, layers, 1) }},
		{"plugbus c=8", func(ctx context.Context) (bench.Side, error) { return bench.NewPlugbusMemory(ctx, layers, 8) }},
		{"watermill cqrs", func(ctx context.Context) (bench.Side, error) {
			return bench.NewWatermillGoChannel(ctx, bench.CQRS, layers)
		}},
		{"watermill router", func(ctx context.Context) (bench.Side, error) {
			return bench.NewWatermillGoChannel(ctx, bench.Router, layers)
		}},
	}
}

func amqpMakers(cfg bench.AMQPConfig) []maker {
	wm := func(pool int) func(ctx context.Context) (bench.Side, error) {
		return func(ctx context.Context) (bench.Side, error) {
			return bench.NewWatermillAMQP(ctx, cfg, bench.Router, pool)
		}
	}
	return []maker{
		{"plugbus", func(ctx context.Context) (bench.Side, error) { return bench.NewPlugbusRabbitMQ(ctx, cfg) }},
		{"amqp091-go", func(ctx context.Context) (bench.Side, error) { return bench.NewRawAMQP(ctx, cfg) }},
		{"watermill-amqp pool=0 (default)", wm(0)},
		{"watermill-amqp pool=channels", wm(cfg.PublisherChannels)},
		{"watermill-amqp pool=senders", wm(cfg.Senders)},
	}
}

func open(t testing.TB, m maker) bench.Side {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := m.open(ctx)
	if err != nil {
		t.Fatalf("opening %s: %v", m.name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.Close(ctx); err != nil {
			t.Errorf("closing %s: %v", m.name, err)
		}
	})
	return s
}

func round(t testing.TB, s bench.Side, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.Round(ctx, n); err != nil {
		t.Fatal(err)
	}
}

// TestMemorySides checks that every in-memory side handles every message
// of consecutive rounds.
func TestMemorySides(t *testing.T) {
	for _, m := range memoryMakers(3) {
		t.Run(m.name, func(t *testing.T) {
			s := open(t, m)
			round(t, s, 100)
			round(t, s, 1)
		})
	}
}

func TestRabbitMQSides(t *testing.T) {
	cfg := bench.DefaultAMQPConfig(testenv.RabbitMQ(t))
	for _, m := range amqpMakers(cfg) {
		t.Run(m.name, func(t *testing.T) {
			s := open(t, m)
			round(t, s, 50)
			round(t, s, 1)
		})
	}
}

func TestCompareTable(t *testing.T) {
	ms := memoryMakers(0)
	sides := []bench.Side{open(t, ms[0]), open(t, ms[3])}
	rs, err := bench.Compare(context.Background(), sides, 3, 200)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range rs {
		if r.Side != sides[i].Name() || r.Rounds != 3 || r.MsgsPerSec <= 0 || r.AllocsPerMsg <= 0 {
			t.Errorf("result %d = %+v", i, r)
		}
	}
	for _, md := range []bool{false, true} {
		var buf bytes.Buffer
		if err := (bench.Table{Title: "t", Results: rs}).Write(&buf, md); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(buf.String(), "watermill router") || !strings.Contains(buf.String(), "1.00x") {
			t.Errorf("markdown=%v table:\n%s", md, buf.String())
		}
	}
}

func TestDepthAllocatesNothingPerLayer(t *testing.T) {
	if race {
		t.Skip("sync.Pool drops items at random under -race: allocations are not comparable")
	}
	rs, err := bench.Depth(bench.DepthChains(), []int{0, 4}, 1, 200)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if r.Points[1].AllocsPerOp > r.Points[0].AllocsPerOp {
			t.Errorf("%s: %.1f allocs/op with 4 layers, %.1f with none", r.Chain, r.Points[1].AllocsPerOp, r.Points[0].AllocsPerOp)
		}
	}
}

// The depth suite's codec round-trips an order and refuses what it cannot
// decode, so that every side's handler really receives the message.
func TestDepthCodecRoundTrips(t *testing.T) {
	want := bench.OrderPlaced{ID: 7, Customer: "customer-7", Amount: 12.5}
	body, err := bench.DepthCodec{}.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	var got bench.OrderPlaced
	if err := (bench.DepthCodec{}).Unmarshal(body, &got); err != nil || got != want {
		t.Fatalf("decoded %+v, %v; want %+v", got, err, want)
	}
	if err := (bench.DepthCodec{}).Unmarshal(body[:15], &got); err == nil {
		t.Error("a 15-byte message decoded")
	}
	if _, err := (bench.DepthCodec{}).Marshal("not an order"); err == nil {
		t.Error("a string encoded as an order")
	}
}

func TestMedianSlope(t *testing.T) {
	if got := bench.Median([]float64{3, 1, 2}); got != 2 {
		t.Errorf("Median = %v, want 2", got)
	}
	if got := bench.Median([]float64{4, 1, 2, 3}); got != 2.5 {
		t.Errorf("Median = %v, want 2.5", got)
	}
	a := bench.Result{Samples: []bench.Sample{{Messages: 10, Elapsed: time.Second}, {Messages: 10, Elapsed: 2 * time.Second}}}
	b := bench.Result{Samples: []bench.Sample{{Messages: 10, Elapsed: 2 * time.Second}, {Messages: 10, Elapsed: 4 * time.Second}}}
	if got := bench.PairedRatio(a, b); got != 2 {
		t.Errorf("PairedRatio = %v, want 2", got)
	}
	if got := bench.Slope([]float64{0, 1, 2, 4}, []float64{10, 12, 14, 18}); got != 2 {
		t.Errorf("Slope = %v, want 2", got)
	}
}

// runSide measures one side alone: one op is one message.
func runSide(b *testing.B, m maker, warm int) {
	s := open(b, m)
	round(b, s, warm)
	b.ReportAllocs()
	b.ResetTimer()
	round(b, s, b.N)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkMemory measures each in-memory side alone with 0 and 3 no-op
// middleware per stage.
func BenchmarkMemory(b *testing.B) {
	for _, layers := range []int{0, 3} {
		for _, m := range memoryMakers(layers) {
			b.Run(fmt.Sprintf("%s/middleware=%d", strings.ReplaceAll(m.name, " ", "-"), layers), func(b *testing.B) { runSide(b, m, 1000) })
		}
	}
}

// compare alternates rounds of sides, b.N rounds of n messages each, and
// reports every side's median msgs/s and allocs/msg and the ratios of the
// first side to the others.
func compare(b *testing.B, ms []maker, n int) {
	sides := make([]bench.Side, len(ms))
	for i, m := range ms {
		sides[i] = open(b, m)
	}
	b.ResetTimer()
	rs, err := bench.Compare(context.Background(), sides, b.N, n)
	if err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	for i, r := range rs {
		name := strings.NewReplacer(" ", "-", "=", "").Replace(r.Side)
		b.ReportMetric(r.MsgsPerSec, name+"-msgs/s")
		b.ReportMetric(r.AllocsPerMsg, name+"-allocs/msg")
		if i > 0 {
			b.ReportMetric(bench.PairedRatio(rs[0], r), "speed-vs-"+name)
		}
	}
}

// BenchmarkMemoryCompare alternates plugbus and Watermill (cqrs and
// router) in one run; one op is one round of 5,000 messages of each.
func BenchmarkMemoryCompare(b *testing.B) {
	for _, layers := range []int{0, 3} {
		b.Run(fmt.Sprintf("middleware=%d", layers), func(b *testing.B) {
			ms := memoryMakers(layers)
			compare(b, []maker{ms[0], ms[2], ms[3]}, 5000)
		})
	}
}

// BenchmarkRabbitMQ measures each RabbitMQ side alone: one op is one message.
func BenchmarkRabbitMQ(b *testing.B) {
	cfg := bench.DefaultAMQPConfig(testenv.RabbitMQ(b))
	for _, m := range amqpMakers(cfg) {
		b.Run(strings.ReplaceAll(m.name, " ", "-"), func(b *testing.B) { runSide(b, m, 200) })
	}
}

// BenchmarkRabbitMQCompare alternates plugbus, amqp091-go and
// watermill-amqp in one run; one op is one round of 1,000 messages of each.
func BenchmarkRabbitMQCompare(b *testing.B) {
	compare(b, amqpMakers(bench.DefaultAMQPConfig(testenv.RabbitMQ(b))), 1000)
}

// BenchmarkDepth measures one synchronous operation through each chain
// with 0 to 16 no-op layers: the difference between depths is the cost of
// the layers.
func BenchmarkDepth(b *testing.B) {
	for _, c := range bench.DepthChains() {
		for _, n := range bench.DepthLayers {
			b.Run(fmt.Sprintf("%s/layers=%d", strings.ReplaceAll(c.Name, " ", "-"), n), func(b *testing.B) {
				op, err := c.Build(n)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				for b.Loop() {
					if err := op(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
