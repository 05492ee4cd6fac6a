package bench_test

import (
	"context"
	"testing"

	"github.com/plugbus/plugbus/bench"
)

// PluginCost measures every side at every concurrency, with the raw stream
// and the raw stream in a bus as the references of the ratios.
func TestPluginCostMeasuresEverySide(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two plugin binaries")
	}
	res, err := bench.PluginCost(context.Background(), bench.PluginCostConfig{Workers: []int{1, 4}, Rounds: 1, N: 400})
	if err != nil {
		t.Fatal(err)
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
