//go:build race

package testenv

// RaceEnabled reports whether the race detector is on. Under it sync.Pool
// drops items at random, so a test cannot assert that a pooled object is
// reused or count the allocations pooling saves; it also slows pure-Go
// SQLite and a broker's clients enough to change what a test can expect
// in a given time.
const RaceEnabled = true
