//go:build !linux

package main

import (
	"syscall"
	"time"
)

// setUserTimeout is a no-op outside Linux, which alone has TCP_USER_TIMEOUT.
func setUserTimeout(syscall.RawConn, time.Duration) error { return nil }

// openFilesLimit is a conservative guess where it is not read.
func openFilesLimit() uint64 { return 1024 }
