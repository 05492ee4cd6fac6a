//go:build race

package saga_test

const raceEnabled = true
