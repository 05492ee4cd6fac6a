package bench

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Sample is what one round of one side measured.
type Sample struct {
	Messages int
	Elapsed  time.Duration
	Allocs   uint64 // heap allocations in the whole process during the round
	Bytes    uint64 // bytes allocated in the whole process during the round
}

// Result is the median of a side's rounds.
type Result struct {
	Side string
	// Rounds is how many rounds the medians are of.
	Rounds int
	// MsgsPerSec, NsPerMsg, BytesPerMsg and AllocsPerMsg are medians over
	// the rounds.
	MsgsPerSec, NsPerMsg, BytesPerMsg, AllocsPerMsg float64
	Samples                                         []Sample
}

// Resetter is implemented by a side that must be brought back to the
// same state before each round (a producer's queue emptied); Compare
// calls Reset before each round, untimed.
type Resetter interface {
	Reset(ctx context.Context) error
}

// measure runs one round of s and what it allocated in the process.
func measure(ctx context.Context, s Side, n int) (Sample, error) {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	err := s.Round(ctx, n)
	elapsed := time.Since(start)
	runtime.ReadMemStats(&after)
	return Sample{Messages: n, Elapsed: elapsed, Allocs: after.Mallocs - before.Mallocs, Bytes: after.TotalAlloc - before.TotalAlloc}, err
}

// Compare runs rounds rounds of n messages on every side, alternating:
// round r starts with side r mod len(sides) and goes through the others in
// order, so that no side always follows the same one and a change of the
// machine's load falls on all of them. One warm-up round of each side comes
// first and is not counted. Results are in the order of sides.
func Compare(ctx context.Context, sides []Side, rounds, n int) ([]Result, error) {
	for _, s := range sides {
		if err := s.Round(ctx, max(n/4, 1)); err != nil {
			return nil, fmt.Errorf("warming up %s: %w", s.Name(), err)
		}
	}
	samples := make([][]Sample, len(sides))
	for r := range rounds {
		for k := range sides {
			i := (r + k) % len(sides)
			if rs, ok := sides[i].(Resetter); ok {
				if err := rs.Reset(ctx); err != nil {
					return nil, fmt.Errorf("resetting %s: %w", sides[i].Name(), err)
				}
			}
			runtime.GC() // start every round from the same heap state
			sm, err := measure(ctx, sides[i], n)
			if err != nil {
				return nil, fmt.Errorf("round %d of %s: %w", r+1, sides[i].Name(), err)
			}
			samples[i] = append(samples[i], sm)
		}
	}
	results := make([]Result, len(sides))
	for i, s := range sides {
		results[i] = summarize(s.Name(), samples[i])
	}
	return results, nil
}

func summarize(name string, ss []Sample) Result {
	per := func(f func(Sample) float64) float64 {
		v := make([]float64, len(ss))
		for i, s := range ss {
			v[i] = f(s)
		}
		return Median(v)
	}
	return Result{
		Side: name, Rounds: len(ss), Samples: ss,
		MsgsPerSec:   per(func(s Sample) float64 { return float64(s.Messages) / s.Elapsed.Seconds() }),
		NsPerMsg:     per(func(s Sample) float64 { return float64(s.Elapsed.Nanoseconds()) / float64(s.Messages) }),
		BytesPerMsg:  per(func(s Sample) float64 { return float64(s.Bytes) / float64(s.Messages) }),
		AllocsPerMsg: per(func(s Sample) float64 { return float64(s.Allocs) / float64(s.Messages) }),
	}
}

// PairedRatio returns the median over rounds of a's throughput divided by
// b's in the same round. Compare runs the sides of a round back to back,
// so each pair saw about the same machine load: the ratio is steadier than
// the ratio of the medians. Both must come from one Compare.
func PairedRatio(a, b Result) float64 {
	n := min(len(a.Samples), len(b.Samples))
	v := make([]float64, n)
	for i := range n {
		v[i] = b.Samples[i].Elapsed.Seconds() / float64(b.Samples[i].Messages) * float64(a.Samples[i].Messages) / a.Samples[i].Elapsed.Seconds()
	}
	return Median(v)
}

// Median returns the median of v (the mean of the middle two when len(v)
// is even), 0 for none. It does not change v.
func Median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(v))
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}

// Table is one section of the printed comparison: results of sides that
// ran the same workload, compared with a baseline.
type Table struct {
	Title string
	// Note says what exactly ran, printed under the title.
	Note    string
	Results []Result
	// Baseline is the index of the result the others are compared with
	// (throughput and allocations as ratios of it).
	Baseline int
}

// Write prints t, aligned for a terminal, or as a Markdown table.
func (t Table) Write(w io.Writer, markdown bool) error {
	base := t.Results[t.Baseline]
	header := []string{"side", "msgs/s", "ns/msg", "B/msg", "allocs/msg", "msgs/s vs " + base.Side + " (paired)", "allocs vs " + base.Side}
	rows := [][]string{header}
	for _, r := range t.Results {
		rows = append(rows, []string{
			r.Side,
			fmt.Sprintf("%.0f", r.MsgsPerSec),
			fmt.Sprintf("%.0f", r.NsPerMsg),
			fmt.Sprintf("%.0f", r.BytesPerMsg),
			fmt.Sprintf("%.1f", r.AllocsPerMsg),
			fmt.Sprintf("%.2fx", PairedRatio(r, base)),
			ratio(r.AllocsPerMsg, base.AllocsPerMsg),
		})
	}
	return WriteRows(w, t.Title, t.Note, rows, markdown)
}

func ratio(a, b float64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", a/b)
}

// WriteRows prints rows (the first is the header) under title and note,
// aligned for a terminal, or as a Markdown table.
func WriteRows(w io.Writer, title, note string, rows [][]string, markdown bool) error {
	var b strings.Builder
	if markdown {
		fmt.Fprintf(&b, "#### %s\n\n", title)
		if note != "" {
			fmt.Fprintf(&b, "%s\n\n", note)
		}
		for i, r := range rows {
			fmt.Fprintf(&b, "| %s |\n", strings.Join(r, " | "))
			if i == 0 {
				fmt.Fprintf(&b, "|%s\n", strings.Repeat("---|", len(r)))
			}
		}
		b.WriteString("\n")
		_, err := io.WriteString(w, b.String())
		return err
	}
	fmt.Fprintf(&b, "== %s\n", title)
	if note != "" {
		fmt.Fprintf(&b, "   %s\n", note)
	}
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t\n", strings.Join(r, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	b.WriteString("\n")
	_, err := io.WriteString(w, b.String())
	return err
}
