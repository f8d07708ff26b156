//go:build !linux

package main

import (
	"errors"
	"net"
	"syscall"
	"time"
)

// Outside Linux, in a development build, none of the options is set:
// TCP_USER_TIMEOUT, TCP_DEFER_ACCEPT and the buffer bounds, which only the
// Linux memory bound counts on. There is no TCP_INFO either: a failed
// connection's sockets are closed at once (every socket counts as broken),
// the sweep leaves stalled connections to the kernel, and silent
// connections are never closed (see idle.go).

func setUserTimeout(syscall.RawConn, time.Duration) error { return nil }
func setDeferAccept(syscall.RawConn, time.Duration) error { return nil }
func setRcvBuf(syscall.RawConn, int) error                { return nil }
func setNotsentLowat(syscall.RawConn, int) error          { return nil }
func connBroken(net.Conn) bool                            { return true }
func connRTT(net.Conn) time.Duration                      { return 0 }
func queued(net.Conn) bool                                { return false }
func stalledFor(net.Conn) time.Duration                   { return 0 }
func quietFor(net.Conn) (time.Duration, bool, bool)       { return 0, false, false }
func lookAt(*proxyConn) connLook                          { return connLook{} }

// peerCred fails: the daemon hands its sockets over only on Linux.
func peerCred(syscall.RawConn) (uid, gid, pid int, err error) {
	return 0, 0, 0, errors.New("peer credentials are read on Linux only")
}

// socketUIDs cannot ask: no connection gives way to share the slots.
func socketUIDs([]sockPair) []int { return nil }
