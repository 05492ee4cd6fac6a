package bench

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	goplugin "github.com/hashicorp/go-plugin"
	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/pluginproto"
	"github.com/plugbus/plugbus/plugin"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// NewPassPlugin returns the plugbus side's middleware: an incoming stage
// that calls next. around adds code after next (it wraps next's error), so
// that the stage costs two crossings; otherwise the stage ends with
// `return next.Call(ctx)` and the binary declares it before-only.
func NewPassPlugin(around bool) bus.Plugin {
	if !around {
		return bus.Middleware{Name: "pass", Incoming: func(ctx context.Context, _ *bus.Incoming, next *bus.IncomingNext) error { return next.Call(ctx) }}
	}
	return bus.Middleware{Name: "pass", Incoming: func(ctx context.Context, _ *bus.Incoming, next *bus.IncomingNext) error {
		if err := next.Call(ctx); err != nil {
			return fmt.Errorf("pass: %w", err)
		}
		return nil
	}}
}

// PluginCostConfig configures [PluginCost].
type PluginCostConfig struct {
	// Workers are the concurrencies measured (default 1 and 16).
	Workers []int
	// Rounds of each side per concurrency (default 9), N messages per
	// round and worker count (default 20000; a tenth with one worker).
	Rounds, N int
	// Sessions (default 3, at most Rounds) divide the rounds: each
	// session starts every side's plugin process anew, so that where
	// the scheduler happens to run one process does not tilt a whole
	// run's ratios.
	Sessions int
	// Streams is plugin.WithStreams for the plugbus sides (0: default).
	Streams int
	// Dir holds the built binaries (default: a temporary directory).
	Dir string
	// Log receives progress lines; nil discards them.
	Log io.Writer
	// PluginCPUProfile, PluginTrace and PluginMemProfile, when set, are
	// the prefixes of the plugin processes' CPU profiles, execution traces
	// and allocation profiles: each side writes PREFIX-SIDE-wWORKERS.prof
	// (.trace, .mprof; PREFIX-SIDE-sSESSION-wWORKERS.prof with more than
	// one session) when its plugin stops.
	PluginCPUProfile, PluginTrace, PluginMemProfile string
	// Codec is the message's encoding on the sides that run a bus:
	// "json" (the default, bus.JSON) or "binary" ([DepthCodec], through
	// bus.WithSerializer), which leaves the bus's decode a few
	// nanoseconds. The raw stream echoes as many bytes as plugbus's
	// invocation of the message has on the wire either way.
	Codec string
}

// PluginCostResult is one side at one concurrency: medians over rounds.
type PluginCostResult struct {
	Side    string
	Workers int
	// MsgsPerSec and P50 are medians of the rounds' throughput and p50
	// latency; AllocsPerMsg and BytesPerMsg of the host process.
	MsgsPerSec   float64
	P50, P99     time.Duration
	AllocsPerMsg float64
	BytesPerMsg  float64
	// HostCPU and PluginCPU are the CPU time per message of the host
	// process and of the plugin process (medians; the plugin's from
	// /proc, in clock ticks, so coarse for short rounds).
	HostCPU, PluginCPU time.Duration
	// ThroughputRatio and P50Ratio are the medians over rounds of this
	// side's figure divided by the raw stream's in the same round.
	ThroughputRatio, P50Ratio float64
	// BusThroughputRatio and BusP50Ratio are the same against the raw
	// stream in a bus (RawInBusSide): the bus's own work on both sides.
	BusThroughputRatio, BusP50Ratio float64
	// PayloadBytes is the size of the gRPC message the raw stream echoes:
	// that of plugbus's incoming invocation of the benchmark message.
	PayloadBytes int
}

// costSide is one side of the plugin cost benchmark at one concurrency.
type costSide struct {
	name  string
	pid   int // the plugin process
	round func(ctx context.Context, n int) ([]time.Duration, error)
	close func()
}

type costSample struct {
	hostCPU    time.Duration // per message
	pluginCPU  time.Duration // per message
	msgsPerSec float64
	p50, p99   time.Duration
	allocs     float64
	bytes      float64
}

// PluginCost measures, in one run, a raw go-plugin gRPC stream echo (one
// long-lived bidirectional stream per worker) against plugbus's
// before-only and around incoming stage out of process, at each
// concurrency, alternating the sides round by round; it returns medians
// and the paired ratios to the raw stream.
func PluginCost(ctx context.Context, cfg PluginCostConfig) ([]PluginCostResult, error) {
	if cfg.Workers == nil {
		cfg.Workers = []int{1, 16}
	}
	cfg.Rounds = max(cfg.Rounds, 0)
	if cfg.Rounds == 0 {
		cfg.Rounds = 9
	}
	if cfg.Sessions <= 0 {
		cfg.Sessions = 3
	}
	cfg.Sessions = min(cfg.Sessions, cfg.Rounds)
	if cfg.N == 0 {
		cfg.N = 20000
	}
	// Every side delivers with a context that can end, as a running bus's
	// handler context can: an out-of-process stage watches it.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	d, serializer, err := costDelivery(cfg.Codec)
	if err != nil {
		return nil, err
	}
	payload := invocationSize(d)
	logw := cfg.Log
	if logw == nil {
		logw = io.Discard
	}
	dir := cfg.Dir
	if dir == "" {
		tmp, err := os.MkdirTemp("", "plugbus-plugincost")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(tmp)
		dir = tmp
	}
	raw, pass := filepath.Join(dir, "rawecho-plugin"), filepath.Join(dir, "pass-plugin")
	rawSum, err := plugin.Build(ctx, "github.com/plugbus/plugbus/bench/cmd/rawecho-plugin", raw)
	if err != nil {
		return nil, err
	}
	passSum, err := plugin.Build(ctx, "github.com/plugbus/plugbus/bench/cmd/pass-plugin", pass)
	if err != nil {
		return nil, err
	}

	var out []PluginCostResult
	for _, workers := range cfg.Workers {
		n := cfg.N
		if workers == 1 {
			n = max(cfg.N/10, 1)
		}
		var (
			names   []string
			samples [][]costSample
		)
		// Each session starts every side's processes anew: where the
		// scheduler puts a process (and its threads beside the host's)
		// favours or hinders that side for as long as it runs.
		for session := range cfg.Sessions {
			rounds := cfg.Rounds / cfg.Sessions
			if session < cfg.Rounds%cfg.Sessions {
				rounds++
			}
			sides, err := openCostSides(ctx, workers, raw, rawSum, pass, passSum, payload, d, serializer, cfg, session)
			if err != nil {
				return nil, err
			}
			for _, s := range sides {
				fmt.Fprintf(logw, "workers=%d session %d %s: pid %d\n", workers, session+1, s.name, s.pid)
			}
			if names == nil {
				samples = make([][]costSample, len(sides))
				for _, s := range sides {
					names = append(names, s.name)
				}
			}
			err = sampleCostSides(ctx, sides, samples, rounds, n, logw, workers)
			for _, s := range sides {
				s.close()
			}
			if err != nil {
				return nil, err
			}
		}
		res := summarizeCost(names, samples, workers)
		for i := range res {
			res[i].PayloadBytes = payload
		}
		out = append(out, res...)
	}
	return out, nil
}

// sampleCostSides runs rounds rounds of every side after a warm-up,
// alternating the sides, and appends each side's samples to samples.
func sampleCostSides(ctx context.Context, sides []costSide, samples [][]costSample, rounds, n int, logw io.Writer, workers int) error {
	for _, s := range sides { // warm-up, not counted
		if _, err := s.round(ctx, max(n/4, 1)); err != nil {
			return fmt.Errorf("warming up %s: %w", s.name, err)
		}
	}
	first := len(samples[0])
	for r := first; r < first+rounds; r++ {
		for k := range sides {
			i := (r + k) % len(sides)
			runtime.GC()
			var err error
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			hostBefore, pluginBefore := processCPU(0), processCPU(sides[i].pid)
			start := time.Now()
			var lat []time.Duration
			// The label and the log events mark the side's round in a
			// profile (-tagfocus side=...) and in a trace.
			pprof.Do(ctx, pprof.Labels("side", sides[i].name), func(ctx context.Context) {
				trace.Log(ctx, "plugincost", "begin "+sides[i].name)
				lat, err = sides[i].round(ctx, n)
				trace.Log(ctx, "plugincost", "end "+sides[i].name)
			})
			elapsed := time.Since(start)
			hostAfter, pluginAfter := processCPU(0), processCPU(sides[i].pid)
			runtime.ReadMemStats(&after)
			if err != nil {
				return fmt.Errorf("round %d of %s: %w", r+1, sides[i].name, err)
			}
			slices.Sort(lat)
			sm := costSample{msgsPerSec: float64(len(lat)) / elapsed.Seconds(), p50: lat[len(lat)/2], p99: lat[len(lat)*99/100],
				allocs: float64(after.Mallocs-before.Mallocs) / float64(len(lat)), bytes: float64(after.TotalAlloc-before.TotalAlloc) / float64(len(lat))}
			sm.hostCPU = (hostAfter - hostBefore) / time.Duration(len(lat))
			sm.pluginCPU = (pluginAfter - pluginBefore) / time.Duration(len(lat))
			samples[i] = append(samples[i], sm)
			fmt.Fprintf(logw, "workers=%d round %d %-22s %8.0f msg/s p50 %6.1f µs\n", workers, r+1, sides[i].name, sm.msgsPerSec, float64(sm.p50.Nanoseconds())/1e3)
		}
	}
	return nil
}

// summarizeCost makes each side's result from its samples: medians, and
// the medians of the paired ratios to the raw stream (names[0]) and to
// the raw stream in a bus.
func summarizeCost(names []string, samples [][]costSample, workers int) []PluginCostResult {
	res := make([]PluginCostResult, len(names))
	for i, name := range names {
		ss := samples[i]
		med := func(f func(costSample) float64) float64 {
			v := make([]float64, len(ss))
			for j, x := range ss {
				v[j] = f(x)
			}
			return Median(v)
		}
		ratio := func(f func(costSample) float64, ref int) float64 {
			v := make([]float64, len(ss))
			for j := range ss {
				v[j] = f(ss[j]) / f(samples[ref][j])
			}
			return Median(v)
		}
		throughput := func(x costSample) float64 { return x.msgsPerSec }
		p50 := func(x costSample) float64 { return float64(x.p50) }
		res[i] = PluginCostResult{Side: name, Workers: workers,
			MsgsPerSec:      med(func(x costSample) float64 { return x.msgsPerSec }),
			P50:             time.Duration(med(func(x costSample) float64 { return float64(x.p50) })),
			P99:             time.Duration(med(func(x costSample) float64 { return float64(x.p99) })),
			AllocsPerMsg:    med(func(x costSample) float64 { return x.allocs }),
			BytesPerMsg:     med(func(x costSample) float64 { return x.bytes }),
			HostCPU:         time.Duration(med(func(x costSample) float64 { return float64(x.hostCPU) })),
			PluginCPU:       time.Duration(med(func(x costSample) float64 { return float64(x.pluginCPU) })),
			ThroughputRatio: ratio(throughput, 0),
			P50Ratio:        ratio(p50, 0),
		}
		if bus := slices.Index(names, RawInBusSide); bus >= 0 {
			res[i].BusThroughputRatio, res[i].BusP50Ratio = ratio(throughput, bus), ratio(p50, bus)
		}
	}
	return res
}

// The sides of [PluginCost], in the order it measures them.
const (
	RawSide        = "raw go-plugin stream"
	RawInBusSide   = "raw stream in a bus"
	BeforeOnlySide = "plugbus before-only"
	AroundSide     = "plugbus around"
)

// openCostSides opens the raw stream side (first: the ratios' reference),
// the raw stream in a bus and the two plugbus sides for workers
// concurrent workers.
func openCostSides(ctx context.Context, workers int, raw, rawSum, pass, passSum string, payload int, d *bus.Delivery, serializer bus.Serializer, cfg PluginCostConfig, session int) ([]costSide, error) {
	profileArgs := func(side string) (args []string) {
		if cfg.Sessions > 1 {
			side = fmt.Sprintf("%s-s%d", side, session+1)
		}
		if cfg.PluginCPUProfile != "" {
			args = append(args, fmt.Sprintf("-cpuprofile=%s-%s-w%d.prof", cfg.PluginCPUProfile, side, workers))
		}
		if cfg.PluginTrace != "" {
			args = append(args, fmt.Sprintf("-trace=%s-%s-w%d.trace", cfg.PluginTrace, side, workers))
		}
		if cfg.PluginMemProfile != "" {
			args = append(args, fmt.Sprintf("-memprofile=%s-%s-w%d.mprof", cfg.PluginMemProfile, side, workers))
		}
		return args
	}
	rs, err := openRawEcho(ctx, workers, raw, rawSum, payload, profileArgs("raw"))
	if err != nil {
		return nil, err
	}
	sides := []costSide{rs}
	rb, err := openRawEchoInBus(ctx, workers, raw, rawSum, payload, d, serializer, profileArgs("rawbus"))
	if err != nil {
		rs.close()
		return nil, err
	}
	sides = append(sides, rb)
	for _, around := range []bool{false, true} {
		side := "before-only"
		if around {
			side = "around"
		}
		s, err := openPlugbusSide(workers, pass, passSum, around, d, serializer, cfg.Streams, profileArgs(side))
		if err != nil {
			for _, o := range sides {
				o.close()
			}
			return nil, err
		}
		sides = append(sides, s)
	}
	return sides, nil
}

// rawEcho is a running raw echo plugin and one stream per worker.
type rawEcho struct {
	client  *goplugin.Client
	streams []grpc.ClientStream
	body    []byte // the payload: a BytesValue of the invocation's size on the wire
	cancel  context.CancelFunc
	pid     int
}

// echo sends the payload on stream w and reads the echo.
func (r *rawEcho) echo(w int) error {
	out, in := &wrapperspb.BytesValue{Value: r.body}, new(wrapperspb.BytesValue)
	if err := r.streams[w].SendMsg(out); err != nil {
		return err
	}
	return r.streams[w].RecvMsg(in)
}

func (r *rawEcho) close() {
	for _, s := range r.streams {
		_ = s.CloseSend()
	}
	r.cancel()
	r.client.Kill()
}

// openRawEcho opens the raw stream side.
func openRawEcho(ctx context.Context, workers int, path, sum string, payload int, args []string) (costSide, error) {
	r, err := startRawEcho(ctx, workers, path, sum, payload, args)
	if err != nil {
		return costSide{}, err
	}
	round := func(_ context.Context, n int) ([]time.Duration, error) { return runWorkers(workers, n, r.echo) }
	return costSide{name: RawSide, pid: r.pid, round: round, close: r.close}, nil
}

// openRawEchoInBus opens the raw stream in a bus: Bus.Deliver of the
// message through an in-process incoming middleware that echoes the
// payload on the worker's raw stream and calls next — the plugbus sides'
// bus, handler and message, with the raw stream for the plugin.
func openRawEchoInBus(ctx context.Context, workers int, path, sum string, payload int, d *bus.Delivery, serializer bus.Serializer, args []string) (costSide, error) {
	r, err := startRawEcho(ctx, workers, path, sum, payload, args)
	if err != nil {
		return costSide{}, err
	}
	type workerKey struct{}
	echo := bus.Middleware{Name: "raw-echo", Incoming: func(ctx context.Context, _ *bus.Incoming, next *bus.IncomingNext) error {
		if err := r.echo(ctx.Value(workerKey{}).(int)); err != nil {
			return err
		}
		return next.Call(ctx)
	}}
	quiet := slog.New(slog.DiscardHandler)
	b, err := bus.New(bus.WithEndpoint("bench"), bus.WithMiddleware(echo), bus.WithLogger(quiet), bus.WithSerializer(serializer),
		bus.WithHandler(func(context.Context, OrderPlaced, bus.Attributes) error { return nil }))
	if err != nil {
		r.close()
		return costSide{}, err
	}
	ctxs := make([]context.Context, workers) // made before the rounds: a context per delivery would count against this side
	for w := range ctxs {
		ctxs[w] = context.WithValue(ctx, workerKey{}, w)
	}
	round := func(_ context.Context, n int) ([]time.Duration, error) {
		return runWorkers(workers, n, func(w int) error { return b.Deliver(ctxs[w], d) })
	}
	return costSide{name: RawInBusSide, pid: r.pid, round: round, close: func() {
		_ = b.Stop(context.Background())
		r.close()
	}}, nil
}

// startRawEcho starts the raw echo plugin as plugin.Load starts a plugbus
// plugin and opens one stream per worker.
func startRawEcho(ctx context.Context, workers int, path, sum string, payload int, args []string) (*rawEcho, error) {
	want, _ := hex.DecodeString(sum)
	client := goplugin.NewClient(&goplugin.ClientConfig{
		HandshakeConfig:  rawEchoHandshake,
		VersionedPlugins: map[int]goplugin.PluginSet{1: {rawEchoKey: rawEchoPlugin{}}},
		Cmd:              exec.Command(path, args...),
		SecureConfig:     &goplugin.SecureConfig{Checksum: want, Hash: sha256.New()},
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		AutoMTLS:         true,
		GRPCDialOptions:  pluginproto.DialOptions(),
		SkipHostEnv:      true,
		Logger:           pluginproto.NewHCLogger(slog.New(slog.DiscardHandler)),
	})
	rpc, err := client.Client()
	if err != nil {
		client.Kill()
		return nil, fmt.Errorf("starting the raw echo plugin: %w", err)
	}
	rawConn, err := rpc.Dispense(rawEchoKey)
	if err != nil {
		client.Kill()
		return nil, err
	}
	conn := rawConn.(*grpc.ClientConn)
	sctx, cancel := context.WithCancel(ctx)
	streams := make([]grpc.ClientStream, workers)
	for i := range streams {
		if streams[i], err = conn.NewStream(sctx, &rawEchoDesc.Streams[0], "/plugbus.bench.Echo/Echo"); err != nil {
			cancel()
			client.Kill()
			return nil, err
		}
	}
	pid := 0
	if rc := client.ReattachConfig(); rc != nil {
		pid = rc.Pid
	}
	// A BytesValue of payload bytes on the wire.
	return &rawEcho{client: client, streams: streams, body: make([]byte, payload-2), cancel: cancel, pid: pid}, nil
}

// openPlugbusSide loads the pass plugin and runs deliveries through a bus.
func openPlugbusSide(workers int, path, sum string, around bool, d *bus.Delivery, serializer bus.Serializer, streams int, args []string) (costSide, error) {
	quiet := slog.New(slog.DiscardHandler)
	opts := []plugin.Option{plugin.WithSHA256(sum), plugin.WithLogger(quiet)}
	name := BeforeOnlySide
	if around {
		args = append(args, "around")
		name = AroundSide
	}
	if len(args) > 0 {
		opts = append(opts, plugin.WithArgs(args...))
	}
	if streams > 0 {
		opts = append(opts, plugin.WithStreams(streams))
	}
	p, err := plugin.Load(path, opts...)
	if err != nil {
		return costSide{}, err
	}
	b, err := bus.New(bus.WithEndpoint("bench"), bus.WithMiddleware(p), bus.WithLogger(quiet), bus.WithSerializer(serializer),
		bus.WithHandler(func(context.Context, OrderPlaced, bus.Attributes) error { return nil }))
	if err != nil {
		p.Close()
		return costSide{}, err
	}
	round := func(ctx context.Context, n int) ([]time.Duration, error) {
		return runWorkers(workers, n, func(int) error { return b.Deliver(ctx, d) })
	}
	return costSide{name: name, pid: p.PID(), round: round, close: func() {
		_ = b.Stop(context.Background())
		p.Close()
	}}, nil
}

// runWorkers runs op n times over workers goroutines and returns each
// operation's latency.
func runWorkers(workers, n int, op func(worker int) error) ([]time.Duration, error) {
	lat := make([][]time.Duration, workers)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := range workers {
		lat[w] = make([]time.Duration, 0, n/workers+1)
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				t0 := time.Now()
				if err := op(w); err != nil {
					errs[w] = err
					return
				}
				lat[w] = append(lat[w], time.Since(t0))
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return slices.Concat(lat...), nil
}

// ProfilePlugin starts the CPU profile, the execution trace and the
// allocation profile (of every allocation) a plugin binary of the
// benchmark was asked for with "-cpuprofile=FILE", "-trace=FILE" and
// "-memprofile=FILE" arguments, and returns the other arguments and a function
// that writes them (the binary calls it once serving returned, when the
// host stops the plugin).
func ProfilePlugin(args []string) (rest []string, stop func()) {
	var stops []func()
	for _, a := range args {
		name, file, _ := strings.Cut(a, "=")
		var start func(io.Writer) error
		var end func()
		switch name {
		case "-cpuprofile":
			start, end = pprof.StartCPUProfile, pprof.StopCPUProfile
		case "-trace":
			start, end = trace.Start, trace.Stop
		case "-memprofile":
			runtime.MemProfileRate = 1
			var w io.Writer
			start = func(f io.Writer) error { w = f; return nil }
			end = func() { _ = pprof.Lookup("allocs").WriteTo(w, 0) }
		default:
			rest = append(rest, a)
			continue
		}
		f, err := os.Create(file)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			continue
		}
		if err := start(f); err != nil {
			fmt.Fprintln(os.Stderr, err)
			f.Close()
			continue
		}
		stops = append(stops, func() {
			end()
			f.Close()
		})
	}
	return rest, func() {
		for _, s := range stops {
			s()
		}
	}
}

// costDelivery is the benchmark's received message in codec ("json" or
// "" for bus.JSON, "binary" for DepthCodec), and the serializer of the
// buses that receive it.
func costDelivery(codec string) (*bus.Delivery, bus.Serializer, error) {
	var serializer bus.Serializer
	switch codec {
	case "", "json":
		serializer = bus.JSON{}
	case "binary":
		serializer = DepthCodec{}
	default:
		return nil, nil, fmt.Errorf("codec %q: want json or binary", codec)
	}
	body, err := serializer.Marshal(OrderPlaced{ID: 1, Customer: "customer-0001", Amount: 42})
	if err != nil {
		return nil, nil, err
	}
	return &bus.Delivery{Envelope: bus.Envelope{Name: OrderPlaced{}.MessageName(), ContentType: serializer.ContentType(), Body: body,
		Attributes: bus.Attributes{MessageID: "0190a8f5-7c1e-7b3a-9d2f-1a2b3c4d5e6f", CorrelationID: "0190a8f5-7c1e-7b3a-9d2f-1a2b3c4d5e6f", SentAt: time.Now().UTC()}}, Attempt: 1}, serializer, nil
}

// invocationSize is the size on the wire of plugbus's invocation of the
// incoming stage for d.
func invocationSize(d *bus.Delivery) int {
	b := &pluginproto.HostBatch{Frames: []*pluginproto.HostFrame{{Call: 1 << 20, Kind: &pluginproto.HostFrame_Invoke{Invoke: &pluginproto.Invoke{
		Instance: 1, Stage: pluginproto.Stage_STAGE_INCOMING, Subject: &pluginproto.Invoke_Incoming{Incoming: &pluginproto.IncomingMessage{
			Name: d.Name, ContentType: d.ContentType, Body: d.Body, Attributes: pluginproto.FromAttributes(d.Attributes), Attempt: 1, Endpoint: "bench"}}}}}}}
	return proto.Size(b)
}

// processCPU returns the user and system CPU time of process pid (this
// process for 0), or 0 when it cannot be read.
func processCPU(pid int) time.Duration {
	if pid == 0 {
		var ru syscall.Rusage
		if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
			return 0
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// Fields after the command (which may hold spaces) start after ") ".
	i := bytes.LastIndexByte(raw, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(raw[i+1:]))
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	const ticksPerSecond = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / ticksPerSecond
}
