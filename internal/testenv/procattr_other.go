//go:build !linux

package testenv

import "os/exec"

// dieWithParent does nothing here: only Linux kills a child with its
// parent. The test's cleanups stop the processes it started.
func dieWithParent(*exec.Cmd) {}
