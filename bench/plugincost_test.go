package bench_test

import (
	"context"
	"testing"

	"github.com/plugbus/plugbus/bench"
)

// PluginCost measures every side at every concurrency, with the raw stream
// as the reference of the ratios.
func TestPluginCostMeasuresEverySide(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two plugin binaries")
	}
	res, err := bench.PluginCost(context.Background(), bench.PluginCostConfig{Workers: []int{1, 4}, Rounds: 1, N: 400})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 6 {
		t.Fatalf("%d results, want 3 sides × 2 concurrencies", len(res))
	}
	for _, r := range res {
		if r.MsgsPerSec <= 0 || r.P50 <= 0 || r.PayloadBytes < 100 {
			t.Fatalf("result %+v: nothing measured", r)
		}
		if r.Side == "raw go-plugin stream" && (r.ThroughputRatio != 1 || r.P50Ratio != 1) {
			t.Fatalf("raw stream ratios %+v, want 1", r)
		}
	}
}
