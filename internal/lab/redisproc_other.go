//go:build !linux

package lab

import "syscall"

// childAttr: no Pdeathsig outside Linux; Close stops the servers.
func childAttr() *syscall.SysProcAttr { return nil }
