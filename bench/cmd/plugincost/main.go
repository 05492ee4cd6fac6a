// Command plugincost measures what an out-of-process plugbus plugin costs
// against a raw go-plugin gRPC stream on the same transport and settings
// (unix socket, AutoMTLS, static 1 MiB windows): one long-lived
// bidirectional stream per worker echoing a message of the size of
// plugbus's invocation, alone and inside the same bus delivery as
// plugbus's (an in-process middleware echoing on the raw stream), beside
// plugbus's before-only and around incoming stage, with 1 and 16 workers,
// alternating the sides round by round. It prints medians, the paired
// ratios to the raw stream and to the raw stream in a bus, and the
// targets.
//
//	cd bench && go run ./cmd/plugincost
//	go run ./cmd/plugincost -rounds 9 -n 40000 -markdown
//	go run ./cmd/plugincost -codec binary   # the bus's decode a few nanoseconds
//	go run ./cmd/plugincost -cpuprofile cpu.out   # the host process's profile
//	go run ./cmd/plugincost -plugincpuprofile /tmp/p   # the plugin processes' profiles
//	go run ./cmd/plugincost -workers 1 -rounds 1 -trace host.trace -plugintrace /tmp/p   # execution traces
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"runtime/trace"
	"strconv"
	"strings"

	"github.com/plugbus/plugbus/bench"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "plugincost:", err)
		os.Exit(1)
	}
}

func run() error {
	var cfg bench.PluginCostConfig
	workers := flag.String("workers", "1,16", "comma-separated worker counts")
	flag.IntVar(&cfg.Rounds, "rounds", 9, "rounds of each side per worker count")
	flag.IntVar(&cfg.Sessions, "sessions", 3, "sessions the rounds are divided into, each with every side's plugin process started anew")
	flag.IntVar(&cfg.N, "n", 20000, "messages per round (a tenth with one worker)")
	flag.IntVar(&cfg.Streams, "streams", 0, "plugin.WithStreams for the plugbus sides (0: the default)")
	flag.StringVar(&cfg.Codec, "codec", "json", "the message's encoding on the sides with a bus: json (bus.JSON) or binary (bench.DepthCodec)")
	markdown := flag.Bool("markdown", false, "print markdown tables")
	verbose := flag.Bool("v", false, "print every round")
	cpuProfile := flag.String("cpuprofile", "", "write the host process's CPU profile to this file")
	traceFile := flag.String("trace", "", "write the host process's execution trace to this file")
	flag.StringVar(&cfg.PluginCPUProfile, "plugincpuprofile", "", "write each plugin process's CPU profile to PREFIX-SIDE-wWORKERS.prof (PREFIX-SIDE-sSESSION-wWORKERS.prof with more than one session)")
	flag.StringVar(&cfg.PluginTrace, "plugintrace", "", "write each plugin process's execution trace to PREFIX-SIDE-wWORKERS.trace (-sSESSION before -w with more than one session)")
	flag.StringVar(&cfg.PluginMemProfile, "pluginmemprofile", "", "write each plugin process's allocation profile (every allocation) to PREFIX-SIDE-wWORKERS.mprof (-sSESSION before -w with more than one session)")
	flag.Parse()
	for _, w := range strings.Split(*workers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(w))
		if err != nil || n < 1 {
			return fmt.Errorf("-workers: %q is not a positive count", w)
		}
		cfg.Workers = append(cfg.Workers, n)
	}
	if *verbose {
		cfg.Log = os.Stderr
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if *traceFile != "" {
		f, err := os.Create(*traceFile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := trace.Start(f); err != nil {
			return err
		}
		defer trace.Stop()
	}
	res, err := bench.PluginCost(context.Background(), cfg)
	if err != nil {
		return err
	}
	return print(os.Stdout, res, cfg.Codec, *markdown)
}

func print(w io.Writer, res []bench.PluginCostResult, codec string, markdown bool) error {
	note := ""
	if len(res) > 0 {
		note = fmt.Sprintf("message encoded %s; payload: %d bytes each way (the size of plugbus's incoming invocation)", codec, res[0].PayloadBytes)
	}
	rows := [][]string{{"workers", "side", "msg/s", "p50 µs", "p99 µs", "allocs/msg", "B/msg", "host CPU µs/msg", "plugin CPU µs/msg",
		"throughput vs raw", "p50 vs raw", "throughput vs raw in a bus", "p50 vs raw in a bus"}}
	for _, r := range res {
		rows = append(rows, []string{strconv.Itoa(r.Workers), r.Side, fmt.Sprintf("%.0f", r.MsgsPerSec),
			fmt.Sprintf("%.1f", float64(r.P50.Nanoseconds())/1e3), fmt.Sprintf("%.1f", float64(r.P99.Nanoseconds())/1e3),
			fmt.Sprintf("%.1f", r.AllocsPerMsg), fmt.Sprintf("%.0f", r.BytesPerMsg),
			fmt.Sprintf("%.1f", float64(r.HostCPU.Nanoseconds())/1e3), fmt.Sprintf("%.1f", float64(r.PluginCPU.Nanoseconds())/1e3),
			fmt.Sprintf("%.2fx", r.ThroughputRatio), fmt.Sprintf("%.2fx", r.P50Ratio),
			fmt.Sprintf("%.2fx", r.BusThroughputRatio), fmt.Sprintf("%.2fx", r.BusP50Ratio)})
	}
	if err := bench.WriteRows(w, "out-of-process plugin cost against a raw go-plugin stream", note, rows, markdown); err != nil {
		return err
	}
	find := func(side string, workers int) *bench.PluginCostResult {
		for i := range res {
			if res[i].Side == side && res[i].Workers == workers {
				return &res[i]
			}
		}
		return nil
	}
	targets := [][]string{{"target", "measured", "met"}}
	add := func(name string, r *bench.PluginCostResult, f func(*bench.PluginCostResult) (string, bool)) {
		if r == nil {
			return
		}
		v, ok := f(r)
		met := "no"
		if ok {
			met = "yes"
		}
		targets = append(targets, []string{name, v, met})
	}
	add("before-only, 16 workers: throughput >= 0.9x raw", find(bench.BeforeOnlySide, 16), func(r *bench.PluginCostResult) (string, bool) {
		return fmt.Sprintf("%.2fx", r.ThroughputRatio), r.ThroughputRatio >= 0.9
	})
	add("before-only, 16 workers: throughput >= 0.9x the raw stream in a bus (the bus's own work on both sides)", find(bench.BeforeOnlySide, 16), func(r *bench.PluginCostResult) (string, bool) {
		return fmt.Sprintf("%.2fx", r.BusThroughputRatio), r.BusThroughputRatio >= 0.9
	})
	add("before-only, 1 worker: p50 <= 1.15x raw", find(bench.BeforeOnlySide, 1), func(r *bench.PluginCostResult) (string, bool) {
		return fmt.Sprintf("%.2fx", r.P50Ratio), r.P50Ratio <= 1.15
	})
	add("around, 1 worker: p50 <= 2.3x raw", find(bench.AroundSide, 1), func(r *bench.PluginCostResult) (string, bool) {
		return fmt.Sprintf("%.2fx", r.P50Ratio), r.P50Ratio <= 2.3
	})
	add("before-only: allocs/msg <= 16 (host, 1 worker)", find(bench.BeforeOnlySide, 1), func(r *bench.PluginCostResult) (string, bool) {
		return fmt.Sprintf("%.2f", r.AllocsPerMsg), r.AllocsPerMsg <= 16
	})
	return bench.WriteRows(w, "targets", "", targets, markdown)
}
