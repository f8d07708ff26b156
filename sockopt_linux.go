//go:build linux

package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// setUserTimeout sets TCP_USER_TIMEOUT: how long sent data may stay
// unacknowledged before the kernel drops the connection. Keepalive alone does
// not cover a socket with unacknowledged data, so without it a write to a
// vanished peer hangs for the full retransmission timeout (about 15 minutes).
func setUserTimeout(rc syscall.RawConn, d time.Duration) error {
	var serr error
	err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(d.Milliseconds()))
	})
	if err != nil {
		return fmt.Errorf("set TCP_USER_TIMEOUT: %w", err)
	}
	if serr != nil {
		return fmt.Errorf("set TCP_USER_TIMEOUT: %w", serr)
	}
	return nil
}

// listenConfig returns a ListenConfig whose accepted sockets have the
// keepalive settings ka. Linux copies a listening socket's keepalive
// settings to each socket accepted from it, so they are set once on the
// listener rather than with four system calls per accepted connection.
// (TCP_USER_TIMEOUT is not copied; handle sets it.)
func listenConfig(ka net.KeepAliveConfig) net.ListenConfig {
	return net.ListenConfig{
		KeepAlive: -1, // no per-connection setup by net
		Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) {
				for _, o := range []struct{ level, opt, v int }{
					{unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1},
					{unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, int(ka.Idle / time.Second)},
					{unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, int(ka.Interval / time.Second)},
					{unix.IPPROTO_TCP, unix.TCP_KEEPCNT, ka.Count},
				} {
					if serr == nil {
						serr = unix.SetsockoptInt(int(fd), o.level, o.opt, o.v)
					}
				}
			})
			if err == nil && serr != nil {
				err = serr
			}
			if err != nil {
				return fmt.Errorf("listener keepalive: %w", err)
			}
			return nil
		},
	}
}

// openFilesLimit returns the soft RLIMIT_NOFILE. Go raises it to the hard
// limit at start-up, so this is usually the hard limit.
func openFilesLimit() uint64 {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return 1024
	}
	return rl.Cur
}

// copyStream copies src to dst until src ends. Between two TCP sockets it
// waits for bytes without holding anything but the sockets, then moves
// exactly the bytes queued with splice(2). Go's splice borrows a pipe (two
// descriptors) from a pool for one call and keeps it while the call waits
// for more input, so a plain io.Copy would pin two pipes to every idle
// connection. When no pipe can be had (descriptors exhausted), Go copies
// through user space instead.
func copyStream(dst, src net.Conn) error {
	d, dok := dst.(*net.TCPConn)
	s, sok := src.(*net.TCPConn)
	if !dok || !sok {
		_, err := io.Copy(dst, src)
		return err
	}
	rc, err := s.SyscallConn()
	if err != nil {
		return fmt.Errorf("copy: %w", err)
	}
	var q queue
	ready := q.ready // one closure per copy, not one per wait
	lr := &io.LimitedReader{R: s}
	for {
		q.woken = false
		if err := rc.Read(ready); err != nil {
			return fmt.Errorf("copy: wait for data: %w", err)
		}
		if q.err != nil {
			return fmt.Errorf("copy: read: %w", q.err)
		}
		if q.n == 0 {
			return nil // end of stream
		}
		lr.N = int64(q.n)
		if _, err := d.ReadFrom(lr); err != nil {
			return err
		}
	}
}

// queue is what a wait for input found on a socket: n bytes queued (0 at
// the end of the stream), or the error that failed the socket (reset, or
// timed out by keepalive or TCP_USER_TIMEOUT).
type queue struct {
	n     int
	err   error
	woken bool // ready ran before in this wait, so the poller reported input since
	peek  [1]byte
}

// ready is the syscall.RawConn.Read callback: it reports false, to wait
// for the poller, while nothing is queued and the stream goes on.
func (q *queue) ready(fd uintptr) bool {
	q.n, q.err = queuedNow(int(fd), q.peek[:], q.woken)
	q.woken = true
	return !errors.Is(q.err, unix.EAGAIN)
}

// queuedNow returns the bytes queued on fd without waiting: EAGAIN when
// none are and the stream goes on, 0 at its end. countFirst asks SIOCINQ
// first, as bytes are likely there once the poller reported input; before
// a wait a peek alone tells the usual case, an idle stream, in one call.
// (SIOCINQ tells neither an ended nor a failed stream from an idle one.)
func queuedNow(fd int, peek []byte, countFirst bool) (int, error) {
	for {
		if countFirst {
			n, err := unix.IoctlGetInt(fd, unix.SIOCINQ)
			if err != nil || n > 0 {
				return n, err
			}
		}
		m, _, err := unix.Recvfrom(fd, peek, unix.MSG_PEEK|unix.MSG_DONTWAIT)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return 0, err
		case m == 0:
			return 0, nil
		}
		countFirst = true // bytes are queued: count them
	}
}
