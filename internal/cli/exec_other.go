//go:build !unix

package cli

import (
	"os/exec"
	"time"
)

// stopGroupOnCancel kills the command when its context ends (exec's
// default); killAfter only applies on Unix.
func stopGroupOnCancel(*exec.Cmd, time.Duration) {}
