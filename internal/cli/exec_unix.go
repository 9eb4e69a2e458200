//go:build unix

package cli

import (
	"os/exec"
	"syscall"
	"time"
)

// stopGroupOnCancel runs cmd in a process group of its own and, when its
// context ends, sends the group SIGTERM, then SIGKILL killAfter later, so
// that the command's own children stop too.
func stopGroupOnCancel(cmd *exec.Cmd, killAfter time.Duration) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		pgid := -cmd.Process.Pid
		if killAfter <= 0 {
			return syscall.Kill(pgid, syscall.SIGKILL)
		}
		time.AfterFunc(killAfter, func() { _ = syscall.Kill(pgid, syscall.SIGKILL) })
		return syscall.Kill(pgid, syscall.SIGTERM)
	}
}
