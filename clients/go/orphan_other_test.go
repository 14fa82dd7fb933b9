//go:build !linux

package sidecar_test

import "syscall"

func orphanGuard() *syscall.SysProcAttr { return nil }
