//go:build race

package bench_test

// race reports a -race build, in which sync.Pool drops items at random.
const race = true
