package sidecar_test

import "syscall"

// A test binary that dies without running TestMain's cleanup (a panic, go test's timeout)
// takes its sidecar with it.
func orphanGuard() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
