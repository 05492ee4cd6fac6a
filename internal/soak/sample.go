// Package soak samples what a long-running bus holds — heap in use,
// goroutines, open file descriptors, an out-of-process plugin's resident
// memory — writes the samples as CSV and a PNG plot, and fits a line to
// each series to tell a flat run from a leak. Its test (TestSoak, behind
// the -soak flag) runs the realistic mix; docs/reliability.md reports a
// 30-minute run. gonum lives here only, out of the library's and the
// command's import graph.
package soak

import (
	"encoding/csv"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Sample is one reading of the process and its plugin.
type Sample struct {
	Elapsed    time.Duration // since the soak began
	HeapInUse  uint64        // bytes (runtime.MemStats.HeapInuse, right after a GC: the live heap)
	Goroutines int
	FDs        int    // open file descriptors of this process
	PluginRSS  uint64 // resident bytes of the plugin process; 0 when none runs
}

// Take reads a sample now; pluginPID is the plugin process (0: none).
func Take(start time.Time, pluginPID int) (Sample, error) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	s := Sample{Elapsed: time.Since(start), HeapInUse: ms.HeapInuse, Goroutines: runtime.NumGoroutine()}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return s, fmt.Errorf("soak: counting open files (Linux /proc only): %w", err)
	}
	s.FDs = len(fds)
	if pluginPID > 0 {
		if s.PluginRSS, err = rss(pluginPID); err != nil {
			return s, err
		}
	}
	return s, nil
}

// rss reads the resident set size of process pid from /proc.
func rss(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, fmt.Errorf("soak: reading the plugin's memory: %w", err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("soak: VmRSS of %d: %w", pid, err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("soak: no VmRSS in /proc/%d/status", pid)
}

// WriteCSV writes samples with a header row: seconds since the start,
// heap in use (bytes), goroutines, open fds, plugin RSS (bytes).
func WriteCSV(w io.Writer, samples []Sample) error {
	cw := csv.NewWriter(w)
	_ = cw.Write([]string{"elapsed_s", "heap_inuse_bytes", "goroutines", "open_fds", "plugin_rss_bytes"})
	for _, s := range samples {
		_ = cw.Write([]string{strconv.FormatFloat(s.Elapsed.Seconds(), 'f', 1, 64), strconv.FormatUint(s.HeapInUse, 10),
			strconv.Itoa(s.Goroutines), strconv.Itoa(s.FDs), strconv.FormatUint(s.PluginRSS, 10)})
	}
	cw.Flush()
	return cw.Error()
}
