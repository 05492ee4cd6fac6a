package rabbitmq

import (
	"strings"
	"testing"
	"time"
)

// The routing key of a delay: its units in binary, one word per level,
// the most significant first, entering at the level of the highest set
// bit; never fewer units than the delay (plus the clock margin) needs.
func TestDelayedRouteWritesTheDelayInBinary(t *testing.T) {
	for _, c := range []struct {
		delay time.Duration
		units uint64
		entry string
	}{
		{time.Nanosecond, 1, DelayPrefix + "00"},
		{9 * time.Millisecond, 1, DelayPrefix + "00"},
		{10 * time.Millisecond, 2, DelayPrefix + "01"},
		{time.Second, 101, DelayPrefix + "06"},
		{time.Hour, 360001, DelayPrefix + "18"},
		{maxDelay, 1<<delayLevels - 1, DelayPrefix + "28"},
	} {
		r, err := delayedRoute(c.delay, delayToQueue, "orders")
		if err != nil {
			t.Fatalf("delayedRoute(%v): %v", c.delay, err)
		}
		words := strings.Split(r.key, ".")
		if len(words) != delayLevels+2 || words[delayLevels] != "q" || words[delayLevels+1] != "orders" {
			t.Fatalf("delayedRoute(%v) key %q: want %d bits, q, orders", c.delay, r.key, delayLevels)
		}
		var units uint64
		for _, w := range words[:delayLevels] {
			units = units<<1 | uint64(w[0]-'0')
		}
		if units != c.units || r.exchange != c.entry {
			t.Errorf("delayedRoute(%v) = %d units entering at %s, want %d at %s", c.delay, units, r.exchange, c.units, c.entry)
		}
		if time.Duration(units)*delayUnit < c.delay+delayClockMargin && c.delay < maxDelay {
			t.Errorf("delayedRoute(%v): %d units are shorter than the delay and its margin", c.delay, units)
		}
	}
	if _, err := delayedRoute(maxDelay+1, delayToQueue, "orders"); err == nil {
		t.Error("delayedRoute beyond maxDelay: no error")
	}
	if _, err := delayedRoute(time.Second, delayToQueue, strings.Repeat("q", 196)); err == nil {
		t.Error("delayedRoute to a 196-byte queue name: no error, want the routing key refused as too long")
	}
	if _, err := delayedRoute(time.Second, delayToQueue, strings.Repeat("q", 195)); err != nil {
		t.Errorf("delayedRoute to a 195-byte queue name: %v", err)
	}
}

func TestEscapeWordLeavesNoWildcardNorSeparator(t *testing.T) {
	for _, c := range []struct {
		in   string
		dots bool
		want string
	}{
		{"orders", true, "orders"},
		{"orders.eu", false, "orders.eu"},
		{"plugbus.events", true, "plugbus%2Eevents"},
		{"a.#.*", false, "a.%23.%2A"},
		{"100%", true, "100%25"},
		{"é.x", true, "é%2Ex"},
	} {
		if got := escapeWord(c.in, c.dots); got != c.want {
			t.Errorf("escapeWord(%q, %v) = %q, want %q", c.in, c.dots, got, c.want)
		}
	}
}

// BenchmarkDelayedRoute measures what a delay costs before it is sent:
// its routing key.
func BenchmarkDelayedRoute(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := delayedRoute(1500*time.Millisecond, delayToQueue, escapeWord("orders.eu", false)); err != nil {
			b.Fatal(err)
		}
	}
}
