//go:build linux

package main

// The socket options and TCP_INFO readings the data path and the health
// server use, through golang.org/x/sys/unix's option wrappers.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// setUserTimeout sets TCP_USER_TIMEOUT: how long sent data may stay
// unacknowledged before the kernel drops the connection. Keepalive alone
// does not cover a socket with unacknowledged data, so without it a write
// to a vanished peer hangs for the whole retransmission timeout (about 15
// minutes).
func setUserTimeout(rc syscall.RawConn, d time.Duration) error {
	return setOption(rc, unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(d.Milliseconds()))
}

// setDeferAccept sets TCP_DEFER_ACCEPT on a listener: a connection that
// sends nothing reaches Accept only after about d (the kernel counts SYN-ACK
// retransmissions), and one that sends its request at once, as every
// health client does, without delay.
func setDeferAccept(rc syscall.RawConn, d time.Duration) error {
	return setOption(rc, unix.IPPROTO_TCP, unix.TCP_DEFER_ACCEPT, int(d.Seconds()))
}

// setRcvBuf fixes a socket's receive buffer at n bytes, which the kernel
// doubles for its overhead, and so turns autotuning off: autotuned, the
// upstream socket of a client that does not read queued up to tcp_rmem's
// maximum (6 MiB by default, 32 MiB on some hosts) in the daemon (issue 26).
// It must be set before the handshake, where the kernel picks the window
// scale and the first window from it: on the dialer's socket, and on the
// listener for the sockets it accepts.
func setRcvBuf(rc syscall.RawConn, n int) error {
	return setOption(rc, unix.SOL_SOCKET, unix.SO_RCVBUF, n)
}

// setNotsentLowat caps what a socket queues unsent at about n bytes: the
// send queue to a client that does not read grew to tcp_wmem's maximum (4
// MiB) (issue 26). It does not cap the bytes in flight, so a stream over a
// long path keeps its pace.
func setNotsentLowat(rc syscall.RawConn, n int) error {
	return setOption(rc, unix.IPPROTO_TCP, unix.TCP_NOTSENT_LOWAT, n)
}

func setOption(rc syscall.RawConn, level, opt, value int) (err error) {
	cerr := rc.Control(func(fd uintptr) { err = unix.SetsockoptInt(int(fd), level, opt, value) })
	if err != nil {
		return fmt.Errorf("setsockopt %d: %w", opt, err)
	}
	return cerr // a Control that fails has not run the setsockopt
}

// tcpInfo returns c's TCP_INFO; nil if c is no TCP socket or its
// connection is over: reset or timed out by the kernel, or closed here. One
// that is only half-closed is not. (x/sys names the kernel's TCP states
// after BPF's copy of the list.) Every reading below treats an ended
// connection as one with nothing to read.
func tcpInfo(c net.Conn) *unix.TCPInfo {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return nil
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil
	}
	var ti *unix.TCPInfo
	var gerr error // a Control that fails runs nothing and leaves it nil
	err = rc.Control(func(fd uintptr) { ti, gerr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) })
	if err != nil || gerr != nil || ti.State == unix.BPF_TCP_CLOSE {
		return nil
	}
	return ti
}

// connRTT is the kernel's smoothed round-trip time of c's connection, at
// least a microsecond; 0 if it has none (see tcpInfo).
func connRTT(c net.Conn) time.Duration {
	if ti := tcpInfo(c); ti != nil {
		return max(time.Duration(ti.Rtt)*time.Microsecond, time.Microsecond)
	}
	return 0
}

// connBroken reports whether c's connection is over (see tcpInfo).
func connBroken(c net.Conn) bool { return tcpInfo(c) == nil }

// queued reports whether c has bytes its peer has not acknowledged yet,
// sent or not.
func queued(c net.Conn) bool { return infoQueued(tcpInfo(c)) }

func infoQueued(ti *unix.TCPInfo) bool { return ti != nil && (ti.Unacked > 0 || ti.Notsent_bytes > 0) }

// stalledFor returns how long c's peer has not acknowledged anything while
// c retransmits unacknowledged data (its retransmission timer has fired),
// 0 if c is not retransmitting.
func stalledFor(c net.Conn) time.Duration { return stalledInfo(tcpInfo(c)) }

// stalledInfo is stalledFor from a socket's TCP_INFO, nil for none.
func stalledInfo(ti *unix.TCPInfo) time.Duration {
	if ti == nil || ti.State == unix.BPF_TCP_CLOSE || ti.Unacked == 0 || ti.Backoff == 0 {
		return 0
	}
	return time.Duration(ti.Last_ack_recv) * time.Millisecond
}

// infoAnswered is how long a socket has carried no data either way, when the last
// the peer sent came before c's last data to it or as a reaction to it:
// zero if the peer spoke since, or never, or c is closed or has no
// TCP_INFO. A reaction comes within replyLagMillis: an HTTP/2 client
// acknowledges data with a WINDOW_UPDATE at once, a new request comes
// later.
func infoAnswered(ti *unix.TCPInfo) time.Duration {
	if ti == nil || ti.Bytes_received == 0 || ti.Last_data_recv+replyLagMillis < ti.Last_data_sent {
		return 0
	}
	return infoQuiet(ti)
}

func infoQuiet(ti *unix.TCPInfo) time.Duration {
	return time.Duration(min(ti.Last_data_recv, ti.Last_data_sent)) * time.Millisecond
}

// replyLagMillis is how soon after data a peer's data counts as its
// reaction to it, in TCP_INFO's milliseconds.
const replyLagMillis = 10

// quietFor returns how long c has carried no data either way, and whether
// its peer ever sent any; false if c is closed or has no TCP_INFO. A socket
// that has carried nothing counts from its handshake, also while it waited
// in the listen backlog.
func quietFor(c net.Conn) (quiet time.Duration, spoke, ok bool) {
	if ti := tcpInfo(c); ti != nil {
		return infoQuiet(ti), ti.Bytes_received > 0, true
	}
	return 0, false, false
}

// lookAt reads pc's sockets once each for the closer (see connLook).
func lookAt(pc *proxyConn) connLook {
	ci := tcpInfo(pc.client)
	if ci == nil {
		return connLook{}
	}
	return connLook{quiet: infoQuiet(ci), answered: infoAnswered(ci), spoke: ci.Bytes_received > 0,
		queued: infoQueued(ci) || infoQueued(tcpInfo(pc.upstream)), ok: true}
}

// peerCred returns the user, group and process ID of the process that made
// or accepted the unix connection rc, as the kernel recorded them.
func peerCred(rc syscall.RawConn) (uid, gid, pid int, err error) {
	var cred *unix.Ucred
	cerr := rc.Control(func(fd uintptr) { cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) })
	if err = errors.Join(cerr, err); err != nil {
		return 0, 0, 0, err
	}
	return int(cred.Uid), int(cred.Gid), int(cred.Pid), nil
}

// socketUIDs returns the uid of the socket of this network namespace that
// each of socks names, -1 where there is none, or none a process holds (a
// socket its process closed reads uid 0); nil if the kernel could not be
// asked. It asks the kernel's sock_diag for one socket at a time by its
// addresses, as `ss -e` shows them: unlike a read of /proc/net/tcp, which
// lists every socket of the node (4.5 ms per look with 2,000), it costs
// what len(socks) does.
func socketUIDs(socks []sockPair) []int {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return nil
	}
	defer unix.Close(fd)
	// The kernel answers within the send; the timeout only bounds the wait.
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 1})
	buf := make([]byte, 1024)
	out := make([]int, len(socks))
	for i, sp := range socks {
		if !sp.local.IsValid() {
			out[i] = -1
		} else if out[i], err = diagUID(fd, sp, uint32(i+1), buf); err != nil {
			return nil
		}
	}
	return out
}

// diagUID sends one inet_diag_req_v2 (linux/inet_diag.h) for the TCP
// socket sp names and reads the uid from the inet_diag_msg of the answer;
// -1 for none (ENOENT), a listener (the kernel's lookup falls back to
// one), or a socket no process holds (inode 0).
func diagUID(fd int, sp sockPair, seq uint32, buf []byte) (int, error) {
	const reqLen = unix.NLMSG_HDRLEN + 56
	req := make([]byte, reqLen)
	ne := binary.NativeEndian
	ne.PutUint32(req[0:], reqLen)
	ne.PutUint16(req[4:], unix.SOCK_DIAG_BY_FAMILY)
	ne.PutUint16(req[6:], unix.NLM_F_REQUEST)
	ne.PutUint32(req[8:], seq)
	r := req[unix.NLMSG_HDRLEN:]
	r[0], r[1] = unix.AF_INET, unix.IPPROTO_TCP
	if sp.local.Addr().Is6() {
		r[0] = unix.AF_INET6
	}
	ne.PutUint32(r[4:], ^uint32(0)) // any state
	binary.BigEndian.PutUint16(r[8:], sp.local.Port())
	binary.BigEndian.PutUint16(r[10:], sp.remote.Port())
	copy(r[12:28], sp.local.Addr().AsSlice())
	copy(r[28:44], sp.remote.Addr().AsSlice())
	ne.PutUint64(r[48:], ^uint64(0)) // INET_DIAG_NOCOOKIE: by addresses alone
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("sock_diag request: %w", err)
	}
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil || n < unix.NLMSG_HDRLEN+4 || ne.Uint32(buf[8:]) != seq {
		return 0, fmt.Errorf("sock_diag answer of %d bytes: %w", n, err)
	}
	m := buf[unix.NLMSG_HDRLEN:n]
	// An error answer: NLMSG_ERROR, then the negated errno as an int32.
	if typ := ne.Uint16(buf[4:]); typ == unix.NLMSG_ERROR && ne.Uint32(m) == ^uint32(unix.ENOENT)+1 {
		return -1, nil
	} else if typ != unix.SOCK_DIAG_BY_FAMILY || len(m) < 72 {
		return 0, fmt.Errorf("sock_diag answer of type %d, %d bytes", typ, n)
	}
	// A socket: inet_diag_msg, its state at 1, uid at 64, inode at 68.
	if m[1] == unix.BPF_TCP_LISTEN || ne.Uint32(m[68:]) == 0 {
		return -1, nil
	}
	return int(ne.Uint32(m[64:])), nil
}
