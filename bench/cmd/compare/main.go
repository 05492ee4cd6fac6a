// Command compare runs the plugbus benchmark workload side by side with
// Watermill and the raw amqp091-go client, in one process and one run, and
// prints a table of messages/s, ns/message, bytes and allocations per
// message and the ratios, followed by the targets and whether they are met.
//
//	cd bench && go run ./cmd/compare              # every suite
//	go run ./cmd/compare -suites memory,depth     # without RabbitMQ
//	go run ./cmd/compare -markdown > table.md     # for the README
//
// Sides alternate round by round so that the load of a shared machine
// falls on all of them; figures are medians of the rounds. RabbitMQ is
// read from PLUGBUS_AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/);
// when it is not reachable the suite is skipped with a message, or fails
// under CI=true.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/plugbus/plugbus/bench"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		os.Exit(1)
	}
}

type config struct {
	suites                []string
	rounds, n             int
	amqpRounds, amqpN     int
	produceRounds         int
	produceN, flushN      int
	depthReps, depthIters int
	concurrency           int
	amqpURL               string
	markdown              bool
	cpuProfile            string
}

func run() error {
	var c config
	suites := flag.String("suites", "memory,amqp,produce,depth", "comma-separated suites to run: memory, amqp, produce, depth")
	flag.IntVar(&c.rounds, "rounds", 9, "rounds of each side in the memory suites")
	flag.IntVar(&c.n, "n", 20000, "messages per round in the memory suites")
	flag.IntVar(&c.amqpRounds, "amqp-rounds", 7, "rounds of each side in the RabbitMQ suite")
	flag.IntVar(&c.amqpN, "amqp-n", 2000, "messages per round in the RabbitMQ suite")
	flag.IntVar(&c.produceRounds, "produce-rounds", 5, "rounds of each side in the producer suite")
	flag.IntVar(&c.produceN, "produce-n", 20000, "messages per round of the producers")
	flag.IntVar(&c.flushN, "flush-n", 300, "handler runs (or single confirmed publishes) per round of the flush comparison")
	flag.IntVar(&c.depthReps, "depth-reps", 200, "passes over the depths in the depth suite")
	flag.IntVar(&c.depthIters, "depth-iters", 500, "operations per sample in the depth suite")
	flag.IntVar(&c.concurrency, "concurrency", 1, "plugbus workers in the memory suites (Watermill's GoChannel hands a subscriber one message at a time)")
	flag.StringVar(&c.amqpURL, "amqp-url", getenv("PLUGBUS_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"), "RabbitMQ URL")
	flag.BoolVar(&c.markdown, "markdown", false, "print Markdown tables")
	flag.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.Parse()
	c.suites = strings.Split(*suites, ",")

	if c.cpuProfile != "" {
		f, err := os.Create(c.cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}

	ctx := context.Background()
	w := os.Stdout
	fmt.Fprintf(w, "%s %s/%s, GOMAXPROCS=%d, %s\n\n", runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.GOMAXPROCS(0), time.Now().UTC().Format(time.RFC3339))
	var checks []check
	for _, s := range c.suites {
		var cs []check
		var err error
		switch strings.TrimSpace(s) {
		case "memory":
			cs, err = memorySuite(ctx, w, c)
		case "amqp":
			cs, err = amqpSuite(ctx, w, c)
		case "produce":
			cs, err = produceSuite(ctx, w, c)
		case "depth":
			cs, err = depthSuite(w, c)
		default:
			err = fmt.Errorf("unknown suite %q: use memory, amqp, produce or depth", s)
		}
		if err != nil {
			return err
		}
		checks = append(checks, cs...)
	}
	return writeChecks(w, checks, c.markdown)
}

// check is one target and the figure measured for it. A target that is
// not met says why when the reason is known (above the raw client's own
// figure, say).
type check struct {
	target   string
	measured string
	met      bool
	why      string
}

// verdict is the met column.
func (c check) verdict() string {
	if c.met || c.why == "" {
		return yes(c.met)
	}
	return "NO: " + c.why
}

func memorySuite(ctx context.Context, w io.Writer, c config) ([]check, error) {
	var checks []check
	for _, layers := range []int{0, 3} {
		sides, err := open(ctx,
			func() (bench.Side, error) { return bench.NewPlugbusMemory(ctx, layers, c.concurrency) },
			func() (bench.Side, error) { return bench.NewWatermillGoChannel(ctx, bench.CQRS, layers) },
			func() (bench.Side, error) { return bench.NewWatermillGoChannel(ctx, bench.Router, layers) },
		)
		if err != nil {
			return nil, err
		}
		rs, err := bench.Compare(ctx, sides, c.rounds, c.n)
		err = errors.Join(err, closeAll(ctx, sides))
		if err != nil {
			return nil, err
		}
		t := bench.Table{
			Title: fmt.Sprintf("in memory, %d no-op middleware per stage", layers),
			Note: fmt.Sprintf("send → decode → typed handler → ack; plugbus memory transport (%d worker) vs Watermill router on GoChannel, %d handler middleware; medians of %d alternating rounds of %d messages",
				c.concurrency, layers, c.rounds, c.n),
			Results: rs,
		}
		if err := t.Write(w, c.markdown); err != nil {
			return nil, err
		}
		pb := rs[0]
		best := bestPeer(rs[1:])
		checks = append(checks,
			check{target: fmt.Sprintf("memory, %d mw: plugbus msgs/s >= 3x Watermill's best", layers),
				measured: fmt.Sprintf("%.2fx (%s)", bench.PairedRatio(pb, best.throughput), best.throughput.Side),
				met:      bench.PairedRatio(pb, best.throughput) >= 3},
			check{target: fmt.Sprintf("memory, %d mw: plugbus allocs/msg <= 1/3 of Watermill's fewest", layers),
				measured: fmt.Sprintf("%.2fx (%.1f vs %.1f, %s)", pb.AllocsPerMsg/best.allocs.AllocsPerMsg, pb.AllocsPerMsg, best.allocs.AllocsPerMsg, best.allocs.Side),
				met:      3*pb.AllocsPerMsg <= best.allocs.AllocsPerMsg},
		)
	}
	return checks, nil
}

type peers struct{ throughput, allocs bench.Result }

// bestPeer picks the fastest and the least allocating of the peers, so that
// plugbus is compared with Watermill at its best on each count.
func bestPeer(rs []bench.Result) peers {
	p := peers{rs[0], rs[0]}
	for _, r := range rs[1:] {
		if r.MsgsPerSec > p.throughput.MsgsPerSec {
			p.throughput = r
		}
		if r.AllocsPerMsg < p.allocs.AllocsPerMsg {
			p.allocs = r
		}
	}
	return p
}

func amqpSuite(ctx context.Context, w io.Writer, c config) ([]check, error) {
	if err := reachable(c.amqpURL); err != nil {
		msg := fmt.Sprintf("RabbitMQ is not reachable (%v); start it with `rabbitmq-server -detached` (or scripts/services.sh) or set PLUGBUS_AMQP_URL", err)
		if os.Getenv("CI") == "true" {
			return nil, errors.New(msg)
		}
		fmt.Fprintf(w, "== RabbitMQ: skipped: %s\n\n", msg)
		return nil, nil
	}
	cfg := bench.DefaultAMQPConfig(c.amqpURL)
	sides, err := open(ctx,
		func() (bench.Side, error) { return bench.NewPlugbusRabbitMQ(ctx, cfg) },
		func() (bench.Side, error) { return bench.NewRawAMQP(ctx, cfg) },
		func() (bench.Side, error) { return bench.NewWatermillAMQP(ctx, cfg, bench.Router, 0) },
		func() (bench.Side, error) {
			return bench.NewWatermillAMQP(ctx, cfg, bench.Router, cfg.PublisherChannels)
		},
		func() (bench.Side, error) { return bench.NewWatermillAMQP(ctx, cfg, bench.Router, cfg.Senders) },
	)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	rs, err := bench.Compare(rctx, sides, c.amqpRounds, c.amqpN)
	err = errors.Join(err, closeAll(ctx, sides))
	if err != nil {
		return nil, err
	}
	t := bench.Table{
		Title: "RabbitMQ, persistent, confirmed publish → consume → ack",
		Note: fmt.Sprintf("%d senders each waiting for its confirm, mandatory, persistent; %d handlers, prefetch %d in all; plugbus and amqp091-go share %d confirm channels (publishes pipelined); watermill-amqp opens a channel per publish (its default, pool=0) or pools %d or %d (one publish per channel at a time); medians of %d alternating rounds of %d messages",
			cfg.Senders, cfg.Concurrency, cfg.Prefetch, cfg.PublisherChannels, cfg.PublisherChannels, cfg.Senders, c.amqpRounds, c.amqpN),
		Results: rs,
	}
	if err := t.Write(w, c.markdown); err != nil {
		return nil, err
	}
	pb, raw := rs[0], rs[1]
	vsRaw := bench.PairedRatio(pb, raw)
	checks := []check{{target: "RabbitMQ: plugbus msgs/s >= 95% of amqp091-go", measured: fmt.Sprintf("%.1f%%", 100*vsRaw), met: vsRaw >= 0.95}}
	for _, wm := range rs[2:] {
		// The raw client's own ratio, in the same run, is the ceiling.
		r, ceiling := bench.PairedRatio(pb, wm), bench.PairedRatio(raw, wm)
		c := check{target: "RabbitMQ: plugbus msgs/s >= 2x " + wm.Side, measured: fmt.Sprintf("%.2fx (amqp091-go: %.2fx)", r, ceiling), met: r >= 2}
		if ceiling < 2 {
			c.why = fmt.Sprintf("above the ceiling, amqp091-go itself is %.2fx", ceiling)
		}
		checks = append(checks, c)
	}
	return checks, nil
}

func depthSuite(w io.Writer, c config) ([]check, error) {
	rs, err := bench.Depth(bench.DepthChains(), bench.DepthLayers, c.depthReps, c.depthIters)
	if err != nil {
		return nil, err
	}
	note := fmt.Sprintf("one synchronous operation per op (plugbus: Bus.Deliver or Bus.Publish; Watermill: the composed handler function); points are medians of %d passes of %d ops per depth; per layer = the median of the passes' least-squares slopes", c.depthReps, c.depthIters)
	if err := bench.WriteDepth(w, "middleware depth: cost of one more no-op layer", note, rs, c.markdown); err != nil {
		return nil, err
	}
	perLayer := map[string]float64{}
	for _, r := range rs {
		perLayer[r.Chain] = r.NsPerLayer
	}
	wm, bare := perLayer[bench.WatermillChain], perLayer[bench.BareChain]
	oneCall, checked := perLayer[bench.OneCallChain], perLayer[bench.OneCallCheckedChain]
	var checks []check
	for _, r := range rs {
		if !strings.HasPrefix(r.Chain, "plugbus") {
			continue
		}
		// Allocations are counted process-wide: allow for a stray one of
		// another goroutine in a sample.
		noAllocs := r.AllocsPerLayer < 0.01 && r.Points[len(r.Points)-1].AllocsPerOp < r.Points[0].AllocsPerOp+0.05
		checks = append(checks, check{
			target:   r.Chain + ": <= 20 ns and 0 allocs per layer",
			measured: fmt.Sprintf("%.1f ns, %.2f allocs", r.NsPerLayer, r.AllocsPerLayer),
			met:      r.NsPerLayer <= 20 && noAllocs,
		})
		if wm > 0 {
			c := check{
				target:   r.Chain + ": per layer <= 2x a Watermill handler middleware's, 0 allocs",
				measured: fmt.Sprintf("%.2fx (%.1f vs %.1f ns; the same shape outside a bus, one-call with its check: %.2fx; a function-typed next, bare: %.2fx)", r.NsPerLayer/wm, r.NsPerLayer, wm, checked/wm, bare/wm),
				met:      r.NsPerLayer <= 2*wm && noAllocs,
			}
			if checked > 2*wm {
				c.why = fmt.Sprintf("below the floor: plugbus's shape outside a bus (one-call, with its check and record) is itself %.2fx (with no check %.2fx)", checked/wm, oneCall/wm)
			}
			checks = append(checks, c)
		}
	}
	return checks, nil
}

func writeChecks(w io.Writer, cs []check, markdown bool) error {
	if len(cs) == 0 {
		return nil
	}
	if markdown {
		fmt.Fprintf(w, "#### targets\n\n| target | measured | met |\n|---|---|---|\n")
		for _, c := range cs {
			fmt.Fprintf(w, "| %s | %s | %s |\n", c.target, c.measured, c.verdict())
		}
		return nil
	}
	fmt.Fprintln(w, "== targets")
	for _, c := range cs {
		fmt.Fprintf(w, "   %-4s %-62s %s\n", yes(c.met), c.target, c.measured)
		if !c.met && c.why != "" {
			fmt.Fprintf(w, "        %s\n", c.why)
		}
	}
	return nil
}

func yes(b bool) string {
	if b {
		return "yes"
	}
	return "NO"
}

func open(ctx context.Context, makers ...func() (bench.Side, error)) ([]bench.Side, error) {
	var sides []bench.Side
	for _, mk := range makers {
		s, err := mk()
		if err != nil {
			return nil, errors.Join(err, closeAll(ctx, sides))
		}
		sides = append(sides, s)
	}
	return sides, nil
}

func closeAll(ctx context.Context, sides []bench.Side) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	var errs []error
	for _, s := range slices.Backward(sides) {
		if err := s.Close(ctx); err != nil {
			errs = append(errs, fmt.Errorf("closing %s: %w", s.Name(), err))
		}
	}
	return errors.Join(errs...)
}

func reachable(amqpURL string) error {
	u, err := url.Parse(amqpURL)
	if err != nil {
		return err
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "5672")
	}
	c, err := net.DialTimeout("tcp", host, 2*time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}

func getenv(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
