//go:build !race

package bench_test

const race = false
