//go:build !linux

package main

import (
	"io"
	"net"
	"syscall"
	"time"
)

// setUserTimeout is a no-op outside Linux, which alone has TCP_USER_TIMEOUT.
func setUserTimeout(syscall.RawConn, time.Duration) error { return nil }

// stalledFor is 0 where TCP_INFO is not read: the sweep leaves stalled
// connections to the kernel.
func stalledFor(net.Conn) time.Duration { return 0 }

// memoryLimit is 0, no limit, where cgroups are not read.
func memoryLimit() uint64 { return 0 }

// openFilesLimit is a conservative guess where it is not read.
func openFilesLimit() uint64 { return 1024 }

// copyStream copies src to dst until src ends.
func copyStream(dst, src net.Conn) error {
	_, err := io.Copy(dst, src)
	return err
}

// listenConfig returns a ListenConfig whose accepted sockets have the
// keepalive settings ka.
func listenConfig(ka net.KeepAliveConfig) net.ListenConfig {
	return net.ListenConfig{KeepAliveConfig: ka}
}

// closeWrite half-closes c's sending side, or closes c if it cannot be
// half-closed.
func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	_ = c.Close()
}

// connBroken reports false: without Linux's TCP_INFO a connection's state
// is unknown here, and a failed copy closes both sockets at once.
func connBroken(net.Conn) bool { return false }

// flushThenReset closes cs; only Linux waits for their queues (see the
// Linux version).
func flushThenReset(cs ...net.Conn) {
	for _, c := range cs {
		_ = c.Close()
	}
}
