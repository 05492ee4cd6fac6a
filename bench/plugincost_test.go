package bench_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/plugbus/plugbus/bench"
)

// PluginCost measures every side at every concurrency, with the raw stream
// and the raw stream in a bus as the references of the ratios.
func TestPluginCostMeasuresEverySide(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two plugin binaries")
	}
	var log strings.Builder
	res, err := bench.PluginCost(context.Background(), bench.PluginCostConfig{Workers: []int{1, 4}, Rounds: 2, Sessions: 2, N: 400, Log: &log})
	if err != nil {
		t.Fatal(err)
	}
	// Two sessions of one round each: every side's rounds 1 and 2, at
	// both concurrencies, each session with plugin processes of its own.
	for _, side := range []string{bench.RawSide, bench.RawInBusSide, bench.BeforeOnlySide, bench.AroundSide} {
		for _, workers := range []int{1, 4} {
			var pids [2]int
			for session := range pids {
				prefix := fmt.Sprintf("workers=%d session %d %s: pid ", workers, session+1, side)
				i := strings.Index(log.String(), prefix)
				if i < 0 {
					t.Fatalf("no %q in the log:\n%s", prefix, log.String())
				}
				fmt.Sscan(log.String()[i+len(prefix):], &pids[session])
			}
			if pids[0] == 0 || pids[0] == pids[1] {
				t.Errorf("%s, %d workers: plugin processes %v, want one per session", side, workers, pids)
			}
		}
		for _, round := range []string{"round 1 ", "round 2 "} {
			if n := strings.Count(log.String(), round+fmt.Sprintf("%-22s", side)); n != 2 {
				t.Errorf("%s%s logged %d times, want 2 (one per concurrency):\n%s", round, side, n, log.String())
			}
		}
	}
	if len(res) != 8 {
		t.Fatalf("%d results, want 4 sides × 2 concurrencies", len(res))
	}
	for _, r := range res {
		if r.MsgsPerSec <= 0 || r.P50 <= 0 || r.PayloadBytes < 100 {
			t.Fatalf("result %+v: nothing measured", r)
		}
		if r.Side == bench.RawSide && (r.ThroughputRatio != 1 || r.P50Ratio != 1) {
			t.Fatalf("raw stream ratios %+v, want 1", r)
		}
		if r.Side == bench.RawInBusSide && (r.BusThroughputRatio != 1 || r.BusP50Ratio != 1) {
			t.Fatalf("raw stream in a bus: ratios to itself %+v, want 1", r)
		}
		if r.BusThroughputRatio <= 0 || r.BusP50Ratio <= 0 {
			t.Fatalf("result %+v: no ratio to the raw stream in a bus", r)
		}
	}
}

// With the binary codec every bus side decodes the message with it (a
// decode error would fail the round), and the raw stream echoes the size
// of that smaller invocation.
func TestPluginCostWithTheBinaryCodec(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two plugin binaries")
	}
	if _, err := bench.PluginCost(context.Background(), bench.PluginCostConfig{Codec: "yaml"}); err == nil {
		t.Fatal("codec yaml accepted")
	}
	res, err := bench.PluginCost(context.Background(), bench.PluginCostConfig{Workers: []int{2}, Rounds: 1, N: 200, Codec: "binary"})
	if err != nil {
		t.Fatal(err)
	}
	jsonRes, err := bench.PluginCost(context.Background(), bench.PluginCostConfig{Workers: []int{2}, Rounds: 1, N: 200})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 4 || res[0].PayloadBytes >= jsonRes[0].PayloadBytes {
		t.Fatalf("binary: %d results, payload %d bytes (json: %d); want 4 sides and a smaller payload", len(res), res[0].PayloadBytes, jsonRes[0].PayloadBytes)
	}
}
