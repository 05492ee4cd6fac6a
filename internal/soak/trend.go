package soak

import (
	"fmt"
	"strings"
	"time"

	"gonum.org/v1/gonum/stat"
)

// Series names one measured quantity and how much it may grow over a
// run, after warm-up, before the run counts as a leak.
type Series struct {
	Name  string
	Unit  string
	Value func(Sample) float64
	// Allowed is the growth the fitted line may show across the run:
	// Absolute plus Relative times the series' mean.
	Absolute, Relative float64
}

// Quantities are the four series a soak watches, with their allowances:
// heap and RSS breathe with the garbage collector, goroutines and fds
// with the work in flight (TestSoak's load keeps up to 128 sends and
// requests waiting, each a goroutine, and the database pool opens and
// closes connections with it): a swing between idle and busy is allowed,
// a leak of one per message is not.
var Quantities = []Series{
	{Name: "heap in use", Unit: "MiB", Value: func(s Sample) float64 { return float64(s.HeapInUse) / (1 << 20) }, Absolute: 8, Relative: 0.25},
	{Name: "goroutines", Unit: "", Value: func(s Sample) float64 { return float64(s.Goroutines) }, Absolute: 150, Relative: 0.10},
	{Name: "open fds", Unit: "", Value: func(s Sample) float64 { return float64(s.FDs) }, Absolute: 32, Relative: 0.10},
	{Name: "plugin RSS", Unit: "MiB", Value: func(s Sample) float64 { return float64(s.PluginRSS) / (1 << 20) }, Absolute: 8, Relative: 0.25},
}

// Trend is the straight line fitted to one series after warm-up.
type Trend struct {
	Series  Series
	Mean    float64
	PerHour float64 // slope, in the series' unit per hour
	Growth  float64 // what the line grows across the fitted samples
	Allowed float64
}

// Flat reports whether the series grew no more than allowed.
func (t Trend) Flat() bool { return t.Growth <= t.Allowed }

// String says the trend on one line.
func (t Trend) String() string {
	verdict := "flat"
	if !t.Flat() {
		verdict = "GROWING"
	}
	return fmt.Sprintf("%-11s mean %8.1f %-3s slope %+8.2f %s/h, %+7.2f across the run (allowed %.1f): %s",
		t.Series.Name, t.Mean, t.Series.Unit, t.PerHour, strings.TrimSpace(t.Series.Unit+""), t.Growth, t.Allowed, verdict)
}

// Trends fits a line to each of [Quantities] over the samples taken
// after warmUp.
func Trends(samples []Sample, warmUp time.Duration) ([]Trend, error) {
	var xs []float64
	var kept []Sample
	for _, s := range samples {
		if s.Elapsed >= warmUp {
			xs = append(xs, s.Elapsed.Hours())
			kept = append(kept, s)
		}
	}
	if len(kept) < 5 {
		return nil, fmt.Errorf("soak: %d samples after the %v warm-up: too few to fit a trend", len(kept), warmUp)
	}
	span := xs[len(xs)-1] - xs[0]
	out := make([]Trend, 0, len(Quantities))
	for _, q := range Quantities {
		ys := make([]float64, len(kept))
		for i, s := range kept {
			ys[i] = q.Value(s)
		}
		_, slope := stat.LinearRegression(xs, ys, nil, false)
		mean := stat.Mean(ys, nil)
		out = append(out, Trend{Series: q, Mean: mean, PerHour: slope, Growth: slope * span, Allowed: q.Absolute + q.Relative*mean})
	}
	return out, nil
}
