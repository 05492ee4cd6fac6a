//go:build race

package plugin_test

// raceEnabled: under the race detector sync.Pool drops items at random, so
// allocation counts that rely on pooling cannot be asserted.
const raceEnabled = true
