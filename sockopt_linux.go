//go:build linux

package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
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
// waits for input holding nothing but the sockets, so an idle connection
// pins no buffer and no pipe. A burst of input is read into a pooled
// buffer and written out: one system call each, cheaper than two splices
// for the small messages of API traffic. A burst that fills the buffer
// switches to splice(2) for what is queued, so bulk bytes never enter user
// space; Go's splice borrows a pipe (two descriptors) from a pool for one
// call, and copies through user space instead when no pipe can be had.
// (A plain io.Copy would splice too, but keeps a pipe per direction for
// the life of the connection.)
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
	c := &streamCopy{rc: rc, dst: d, lr: &io.LimitedReader{R: s}}
	c.readFn, c.countFn = c.read, c.count // one closure each per copy, not per wait
	for {
		var n int
		var err error
		if c.bulk {
			n, err = c.splice()
		} else {
			n, err = c.readWrite()
		}
		if err != nil || n == 0 {
			return err
		}
	}
}

// smallCopy is the size of the read buffer; see copyStream.
const smallCopy = 16 << 10

var smallBufs = sync.Pool{New: func() any { b := make([]byte, smallCopy); return &b }}

// streamCopy is the state of one direction of copyStream.
type streamCopy struct {
	rc      syscall.RawConn // the source
	dst     *net.TCPConn
	lr      *io.LimitedReader // the source, limited to what is queued
	readFn  func(uintptr) bool
	countFn func(uintptr) bool
	bulk    bool // the last burst filled the buffer: splice what is queued

	// Results of the RawConn.Read callbacks.
	n     int
	err   error
	buf   *[]byte // pooled; held only from a read that got bytes until they are written
	woken bool    // count ran before in this wait, so the poller reported input since
	peek  [1]byte
}

// readWrite waits for a burst of input, reads it and writes it to dst. It
// returns the bytes moved, 0 at the end of the stream.
func (c *streamCopy) readWrite() (int, error) {
	more, err := c.wait(c.readFn)
	defer c.release()
	if !more {
		return 0, err
	}
	if _, err := c.dst.Write((*c.buf)[:c.n]); err != nil {
		return 0, err
	}
	c.bulk = c.n == smallCopy
	return c.n, nil
}

// wait runs the callback fn under the poller until input is there, and
// reports whether bytes came: false at the end of the stream or on error.
func (c *streamCopy) wait(fn func(uintptr) bool) (bool, error) {
	if err := c.rc.Read(fn); err != nil {
		return false, fmt.Errorf("copy: wait for data: %w", err)
	}
	if c.err != nil {
		return false, fmt.Errorf("copy: read: %w", c.err)
	}
	return c.n > 0, nil
}

// read is the RawConn.Read callback of readWrite: it reads into a pooled
// buffer, which it gives back while nothing is queued.
func (c *streamCopy) read(fd uintptr) bool {
	if c.buf == nil {
		b, ok := smallBufs.Get().(*[]byte)
		if !ok { // the pool holds nothing else
			nb := make([]byte, smallCopy)
			b = &nb
		}
		c.buf = b
	}
	for {
		n, err := unix.Read(int(fd), *c.buf)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN):
			c.release()
			return false
		}
		c.n, c.err = max(n, 0), err
		return true
	}
}

func (c *streamCopy) release() {
	if c.buf != nil {
		smallBufs.Put(c.buf)
		c.buf = nil
	}
}

// splice waits until input is queued and splices exactly that much to dst.
// It returns the bytes moved, 0 at the end of the stream.
func (c *streamCopy) splice() (int, error) {
	c.woken = false
	if more, err := c.wait(c.countFn); !more {
		return 0, err
	}
	c.lr.N = int64(c.n)
	n, err := c.dst.ReadFrom(c.lr)
	c.bulk = n >= smallCopy
	if err == nil && n == 0 {
		err = io.ErrNoProgress // cannot happen: c.n bytes were queued
	}
	return int(n), err
}

// count is the RawConn.Read callback of splice: it reports false, to wait
// for the poller, while nothing is queued and the stream goes on.
func (c *streamCopy) count(fd uintptr) bool {
	c.n, c.err = queuedNow(int(fd), c.peek[:], c.woken)
	c.woken = true
	return !errors.Is(c.err, unix.EAGAIN)
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
