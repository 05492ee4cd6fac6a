package testenv

import (
	"os/exec"
	"syscall"
)

// dieWithParent has Linux kill cmd when the test process dies, even
// without running its cleanups (a test binary killed at its timeout).
// Linux sends the signal when the thread that started cmd ends; the Go
// runtime ends a thread only under a goroutine that exits locked to it,
// which the tests never do.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
