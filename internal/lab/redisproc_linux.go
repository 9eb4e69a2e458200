package lab

import "syscall"

// childAttr makes a started server die with the lab's process.
func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
