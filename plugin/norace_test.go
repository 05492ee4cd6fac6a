//go:build !race

package plugin_test

const raceEnabled = false
