package bus_test

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
)

func TestBackoffCeilingDoublesUpToMax(t *testing.T) {
	b := bus.Backoff{Initial: 100 * time.Millisecond, Max: time.Second}
	want := []time.Duration{100 * time.Millisecond, 100 * time.Millisecond, 100 * time.Millisecond, // n -2, -1, 0 count as 1
		100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, time.Second, time.Second}
	for i, w := range want {
		n := i - 2
		if got := b.Ceiling(n); got != w {
			t.Errorf("Ceiling(%d) = %s, want %s", n, got, w)
		}
	}
}

func TestBackoffDelayStaysWithinItsCeiling(t *testing.T) {
	b := bus.Backoff{Initial: 10 * time.Millisecond, Max: 300 * time.Millisecond}
	for n := 1; n <= 10; n++ {
		for range 1000 {
			if d := b.Delay(n); d < 0 || d > b.Ceiling(n) {
				t.Fatalf("Delay(%d) = %s, want within [0, %s]", n, d, b.Ceiling(n))
			}
		}
	}
}

// The delay is drawn uniformly from [0, ceiling]: each tenth of the range
// gets about a tenth of the draws, and the draws reach both ends.
func TestBackoffDelayIsFullJitter(t *testing.T) {
	b := bus.Backoff{Initial: time.Second, Max: time.Minute}
	const draws = 100_000
	ceiling := b.Ceiling(3) // 4s
	var buckets [10]int
	var sum float64
	lo, hi := ceiling, time.Duration(0)
	for range draws {
		d := b.Delay(3)
		buckets[min(int(10*d/ceiling), 9)]++
		sum += float64(d)
		lo, hi = min(lo, d), max(hi, d)
	}
	for i, n := range buckets {
		// 10% expected; the standard deviation is about 0.1%.
		if share := float64(n) / draws; share < 0.09 || share > 0.11 {
			t.Errorf("tenth %d of [0, %s] got %.1f%% of the delays, want about 10%%: %v", i, ceiling, 100*share, buckets)
		}
	}
	if mean := time.Duration(sum / draws); mean < ceiling*48/100 || mean > ceiling*52/100 {
		t.Errorf("mean delay %s, want about half the ceiling %s", mean, ceiling)
	}
	if lo > ceiling/100 || hi < ceiling*99/100 {
		t.Errorf("delays range over [%s, %s], want close to [0, %s]", lo, hi, ceiling)
	}
}

func TestBackoffDoesNotOverflow(t *testing.T) {
	for _, b := range []bus.Backoff{
		{Initial: time.Millisecond, Max: time.Hour},
		{Initial: time.Nanosecond, Max: math.MaxInt64},
		{Initial: math.MaxInt64, Max: math.MaxInt64},
		{Initial: time.Hour, Max: 3 * time.Hour},
	} {
		for _, n := range []int{30, 62, 63, 64, 65, 100, 1000, math.MaxInt} {
			c := b.Ceiling(n)
			if c <= 0 || c > b.Max || (n >= 64 && c != b.Max) {
				t.Errorf("%+v: Ceiling(%d) = %s, want within (0, Max], Max from n = 64", b, n, c)
			}
			if d := b.Delay(n); d < 0 || d > c {
				t.Errorf("%+v: Delay(%d) = %s, want within [0, %s]", b, n, d, c)
			}
		}
	}
	b := bus.Backoff{Initial: time.Nanosecond, Max: math.MaxInt64}
	if c := b.Ceiling(63); c != 1<<62 {
		t.Errorf("Ceiling(63) = %d, want 2^62", c)
	}
}

func TestBackoffZeroValueWaitsNothing(t *testing.T) {
	var b bus.Backoff
	if b.Ceiling(5) != 0 || b.Delay(5) != 0 {
		t.Fatalf("zero Backoff: Ceiling %s, Delay %s; want 0", b.Ceiling(5), b.Delay(5))
	}
}

func TestBackoffValidateSaysWhatToChange(t *testing.T) {
	if err := (bus.Backoff{Initial: time.Second, Max: time.Second}).Validate(); err != nil {
		t.Fatalf("Validate of a valid back-off: %v", err)
	}
	for _, c := range []struct {
		b    bus.Backoff
		want string
	}{
		{bus.Backoff{Max: time.Second}, "Initial must be positive"},
		{bus.Backoff{Initial: -time.Second, Max: time.Second}, "Initial must be positive"},
		{bus.Backoff{Initial: 2 * time.Second, Max: time.Second}, "raise Max to at least 2s or lower Initial"},
	} {
		if err := c.b.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate(%+v) = %v, want an error saying %q", c.b, err, c.want)
		}
	}
}
