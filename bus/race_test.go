//go:build race

package bus_test

// raceEnabled: under the race detector sync.Pool drops items at random, so
// whether a pooled object is reused cannot be asserted.
const raceEnabled = true
