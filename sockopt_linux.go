//go:build linux

package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

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

// memoryLimit returns the memory limit of the process's cgroup in bytes, 0
// if it has none or it cannot be read.
func memoryLimit() uint64 { return cgroupMemoryLimit("/proc/self/cgroup", "/sys/fs/cgroup") }

// cgroupMemoryLimit returns the memory limit in force for the cgroup that
// selfCgroup (the format of /proc/self/cgroup) names, under the cgroup file
// system at root: the lowest of memory.max (cgroup v2) or
// memory.limit_in_bytes (v1's memory controller) of that cgroup and of
// each cgroup above it that the file system shows, as a limit on a parent,
// such as a systemd slice's MemoryMax, bounds its children too. A container
// with its own cgroup namespace sees its cgroup at the root of the mount,
// which the walk up reaches as well. 0 means no limit or none found.
func cgroupMemoryLimit(selfCgroup, root string) uint64 {
	b, err := readAtMost(selfCgroup, 64<<10)
	if err != nil {
		return 0
	}
	var limit uint64
	for line := range strings.SplitSeq(string(b), "\n") {
		id, rest, _ := strings.Cut(line, ":")
		controllers, path, ok := strings.Cut(rest, ":")
		switch {
		case !ok:
		case id == "0" && controllers == "":
			limit = lowerLimit(limit, lowestOnPath(root, path, "memory.max"))
		case slices.Contains(strings.Split(controllers, ","), "memory"):
			limit = lowerLimit(limit, lowestOnPath(filepath.Join(root, "memory"), path, "memory.limit_in_bytes"))
		}
	}
	return limit
}

// lowestOnPath returns the lowest limit that file holds in the directory of
// the cgroup path under root and in each directory above it up to root, 0
// if none sets one. The path cannot lead out of root: it is cleaned as an
// absolute path first.
func lowestOnPath(root, path, file string) uint64 {
	root = filepath.Clean(root)
	var limit uint64
	for dir := filepath.Join(root, filepath.Clean("/"+path)); ; dir = filepath.Dir(dir) {
		if v, ok := readMemoryLimit(filepath.Join(dir, file)); ok {
			limit = lowerLimit(limit, v)
		}
		if len(dir) <= len(root) {
			return limit
		}
	}
}

// lowerLimit returns the lower of two memory limits, where 0 is none.
func lowerLimit(a, b uint64) uint64 {
	if a == 0 || (b != 0 && b < a) {
		return b
	}
	return a
}

// readMemoryLimit reads a cgroup memory limit file: "max", or a number of
// bytes, which v1 sets near 2^63 for no limit. ok is false if the file
// cannot be read or parsed.
func readMemoryLimit(path string) (uint64, bool) {
	b, err := readAtMost(path, 64)
	if err != nil {
		return 0, false
	}
	text := strings.TrimSpace(string(b))
	if text == "max" {
		return 0, true
	}
	v, err := strconv.ParseUint(text, 10, 64)
	if err != nil {
		return 0, false
	}
	if v >= 1<<62 {
		return 0, true
	}
	return v, true
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
// pins no buffer and no pipe. A burst of input is read into a buffer from
// readBufs and written out: one system call each, cheaper than two splices
// for the small messages of API traffic. A burst that fills the buffer
// switches to splice(2) for what is queued, so bulk bytes never enter user
// space; Go's splice borrows a pipe (two descriptors) from a pool for one
// call, and copies through user space instead when no pipe can be had.
// (A plain io.Copy would splice too, but keeps a pipe per direction for
// the life of the connection.)
//
// The reads and writes of small bursts, and the half-close at the end of a
// stream (closeWrite), call the kernel with unix.RawSyscall rather than
// through package syscall (or net, which uses it). Those tell Go's
// scheduler that the thread may block, and a call still running when the
// scheduler's monitor next looks (every 20 µs while the process is busy)
// has the thread's P handed to another thread. A write to a socket on the
// same host runs the receiving side's TCP stack inline and often takes that
// long, so on one CPU (GOMAXPROCS=1: a CPU limit or taskset) a 64-byte
// round trip cost four to five thread switches instead of two, and twice
// the CPU time. The sockets are non-blocking, so these calls return at
// once, with EAGAIN instead of waiting: the scheduler need not know about
// them. The buffers they are given are live heap slices, which Go does not
// move.
func copyStream(dst, src net.Conn) error {
	d, dok := dst.(*net.TCPConn)
	s, sok := src.(*net.TCPConn)
	if !dok || !sok {
		_, err := io.Copy(dst, src)
		return err
	}
	c, err := newStreamCopy(d, s)
	if err != nil {
		return err
	}
	return c.run()
}

// newStreamCopy returns the state of a copy from src to dst.
func newStreamCopy(dst, src *net.TCPConn) (*streamCopy, error) {
	rc, err := src.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("copy: %w", err)
	}
	wrc, err := dst.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("copy: %w", err)
	}
	c := &streamCopy{rc: rc, wrc: wrc, dst: dst, lr: &io.LimitedReader{R: src}}
	// One closure each per copy, not per call.
	c.readFn, c.countFn, c.sendFn = c.read, c.count, c.send
	return c, nil
}

// smallCopy is the size of the read buffer; see copyStream.
//
// An idle connection's copy goroutines keep the runtime's smallest stacks
// (2 KiB) only if nothing they call between bursts grows them: the frames
// from the goroutine's start down to the read and write system calls must
// fit in about 1.1 KiB, as a stack once grown stays grown while it waits.
// Hence the small frames on that path: run apart from copyStream, the
// rare error handling apart from session.copy, no errors.Is in read, and
// no allocation below run (see readBufs).
// TestIdleCopyStacksStaySmall checks it.
const smallCopy = 16 << 10

// readBufs holds read buffers between bursts. Unlike a sync.Pool, which
// allocates when it is first used after a collection, taking a buffer or
// giving one back never allocates, so it is safe deep in a copy goroutine's
// stack (see smallCopy). Buffers given back beyond its capacity are left to
// the collector; an empty list makes run allocate one.
var readBufs = freeList{bufs: make([]*[]byte, 0, 32)}

type freeList struct {
	mu   sync.Mutex
	bufs []*[]byte
}

// get takes a buffer from the list, nil if it is empty.
func (l *freeList) get() *[]byte {
	var b *[]byte
	l.mu.Lock()
	if n := len(l.bufs); n > 0 {
		b, l.bufs = l.bufs[n-1], l.bufs[:n-1]
	}
	l.mu.Unlock()
	return b
}

// put gives b back to the list, or to the collector when the list is full.
func (l *freeList) put(b *[]byte) {
	l.mu.Lock()
	if len(l.bufs) < cap(l.bufs) {
		l.bufs = append(l.bufs, b)
	}
	l.mu.Unlock()
}

// streamCopy is the state of one direction of copyStream.
type streamCopy struct {
	rc      syscall.RawConn // the source
	dst     *net.TCPConn
	lr      *io.LimitedReader // the source, limited to what is queued
	wrc     syscall.RawConn   // dst
	readFn  func(uintptr) bool
	countFn func(uintptr) bool
	sendFn  func(uintptr) bool
	bulk    bool // the last burst filled the buffer: splice what is queued

	// Results of the RawConn.Read callbacks.
	n       int
	err     error
	buf     *[]byte // from readBufs; held only from a read that got bytes until they are written
	starved bool    // read found readBufs empty
	woken   bool    // count ran before in this wait, so the poller reported input since
	peek    [1]byte

	// The bytes the RawConn.Write callback send has still to write, and
	// the error it met.
	out     []byte
	sendErr error
}

// run copies until the source ends.
func (c *streamCopy) run() error {
	for {
		var n int
		var err error
		if c.bulk {
			n, err = c.splice()
		} else {
			n, err = c.readWrite()
		}
		if c.starved {
			// No free read buffer: allocate one here, high in the stack,
			// rather than in read (see smallCopy).
			b := make([]byte, smallCopy)
			c.starved, c.buf = false, &b
			continue
		}
		if err != nil || n == 0 {
			return err
		}
	}
}

// readWrite waits for a burst of input, reads it and writes it to dst. It
// returns the bytes moved, 0 at the end of the stream.
func (c *streamCopy) readWrite() (int, error) {
	more, err := c.wait(c.readFn)
	defer c.release()
	if !more {
		return 0, err
	}
	if err := c.write((*c.buf)[:c.n]); err != nil {
		return 0, err
	}
	c.bulk = c.n == smallCopy
	return c.n, nil
}

// write writes b to dst, waiting under the poller while dst's send buffer
// is full.
func (c *streamCopy) write(b []byte) error {
	c.out, c.sendErr = b, nil
	err := c.wrc.Write(c.sendFn)
	c.out = nil
	if err != nil {
		return fmt.Errorf("copy: wait to write: %w", err)
	}
	if c.sendErr != nil {
		return fmt.Errorf("copy: write: %w", c.sendErr)
	}
	return nil
}

// send is the RawConn.Write callback of write: it writes what it can of
// c.out and reports false, to wait for the poller, while the send buffer is
// full. MSG_NOSIGNAL: a peer that has gone away is an EPIPE error, not a
// signal.
func (c *streamCopy) send(fd uintptr) bool {
	for len(c.out) > 0 {
		n, _, errno := unix.RawSyscall6(unix.SYS_SENDTO, fd, uintptr(unsafe.Pointer(&c.out[0])), uintptr(len(c.out)), unix.MSG_NOSIGNAL, 0, 0) //nolint:gosec // a live heap buffer; see copyStream
		switch errno {
		case 0:
			c.out = c.out[n:]
		case unix.EINTR:
		case unix.EAGAIN:
			return false
		default:
			c.sendErr = errno
			return true
		}
	}
	return true
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

// read is the RawConn.Read callback of readWrite: it reads into a buffer
// from readBufs, which it gives back while nothing is queued.
func (c *streamCopy) read(fd uintptr) bool {
	if c.buf == nil {
		if c.buf = readBufs.get(); c.buf == nil {
			c.starved, c.n, c.err = true, 0, nil // run allocates one
			return true
		}
	}
	for {
		n, _, errno := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&(*c.buf)[0])), uintptr(len(*c.buf))) //nolint:gosec // a live heap buffer; see copyStream
		switch errno {
		case 0:
			c.n, c.err = int(n), nil
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			c.release()
			return false
		default:
			c.n, c.err = 0, errno
		}
		return true
	}
}

func (c *streamCopy) release() {
	if c.buf != nil {
		readBufs.put(c.buf)
		c.buf = nil
	}
}

// splice waits until input is queued and splices exactly that much to dst.
// It returns the bytes moved, 0 at the end of the stream.
func (c *streamCopy) splice() (int, error) {
	c.woken = false
	if more, err := c.wait(c.countFn); !more {
		if errors.Is(err, errUrgentMark) {
			// splice(2) stops short of TCP urgent data; read(2) steps
			// over the urgent byte and goes on with the stream.
			c.bulk = false
			return c.readWrite()
		}
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

// errUrgentMark says that the next byte queued is TCP urgent data, which
// splice(2) cannot move past.
var errUrgentMark = errors.New("at the TCP urgent mark")

// queuedNow returns the bytes queued on fd without waiting: EAGAIN when
// none are and the stream goes on, 0 at its end. countFirst asks SIOCINQ
// first, as bytes are likely there once the poller reported input; before
// a wait a peek alone tells the usual case, an idle stream, in one call.
// (SIOCINQ tells neither an ended nor a failed stream from an idle one.)
// SIOCINQ counts up to the urgent mark, while the peek skips the urgent
// byte: bytes seen by the peek but not counted mean errUrgentMark.
func queuedNow(fd int, peek []byte, countFirst bool) (int, error) {
	peeked := false
	for {
		if countFirst {
			n, err := unix.IoctlGetInt(fd, unix.SIOCINQ)
			if err != nil || n > 0 {
				return n, err
			}
			if peeked {
				return 0, errUrgentMark
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
		countFirst, peeked = true, true // bytes are queued: count them
	}
}

// closeWrite half-closes c's sending side, passing on the end of the other
// stream, or closes c if it cannot be half-closed. The shutdown(2) is a raw
// system call (see copyStream): it sends a FIN, which the receiving side
// processes inline. A failure is ignored: the socket is broken, and the
// copy reading from it will say so.
func closeWrite(c net.Conn) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		_ = c.Close()
		return
	}
	if rc, err := tc.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) {
			_, _, _ = unix.RawSyscall(unix.SYS_SHUTDOWN, fd, unix.SHUT_WR, 0)
		})
	}
}

// connBroken reports whether c's connection is over, reset or timed out
// by the kernel, or c closed here. One that is only half-closed is not.
func connBroken(c net.Conn) bool {
	ti, ok := tcpInfo(c)
	return !ok || ti.State == unix.BPF_TCP_CLOSE
}

// tcpInfo returns c's TCP_INFO; false if c is no TCP socket or is closed.
func tcpInfo(c net.Conn) (*unix.TCPInfo, bool) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return nil, false
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil, false
	}
	var ti *unix.TCPInfo
	if err := rc.Control(func(fd uintptr) {
		ti, _ = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); err != nil || ti == nil {
		return nil, false
	}
	return ti, true
}

// flushThenReset waits until the peers of cs have acknowledged everything
// queued on them, up to flushTimeout, and then closes cs with a reset.
// Closing at once would throw the queues away: the kernel resets a socket
// closed with input unread, and a peer still sending leaves some. The wait
// polls, from every millisecond up to every 50 ms; a socket closed under it
// (a drain's or shutdown's force close), or whose peer went away, has
// nothing left to wait for.
func flushThenReset(cs ...net.Conn) {
	deadline := time.Now().Add(flushTimeout)
	for pause := time.Millisecond; anyQueued(cs) && time.Now().Before(deadline); pause = min(2*pause, 50*time.Millisecond) {
		time.Sleep(pause)
	}
	for _, c := range cs {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // the close sends a reset
		}
		_ = c.Close()
	}
}

// anyQueued reports whether one of cs has bytes its peer has not yet
// acknowledged, sent or not.
func anyQueued(cs []net.Conn) bool {
	for _, c := range cs {
		ti, ok := tcpInfo(c)
		if ok && ti.State != unix.BPF_TCP_CLOSE && (ti.Unacked > 0 || ti.Notsent_bytes > 0) {
			return true
		}
	}
	return false
}

// stalledFor returns how long c's peer has not acknowledged anything while
// c retransmits unacknowledged data, 0 if c is not retransmitting.
func stalledFor(c net.Conn) time.Duration {
	ti, ok := tcpInfo(c)
	if !ok {
		return 0
	}
	return stalledInfo(ti)
}

// stalledInfo is stalledFor from a socket's TCP_INFO: the time since the
// last ACK if the socket is open, has unacknowledged data and its
// retransmission timer has fired (Backoff), else 0.
func stalledInfo(ti *unix.TCPInfo) time.Duration {
	// x/sys names the kernel's TCP states after BPF's copy of the list.
	if ti.State == unix.BPF_TCP_CLOSE || ti.Unacked == 0 || ti.Backoff == 0 {
		return 0
	}
	return time.Duration(ti.Last_ack_recv) * time.Millisecond
}
