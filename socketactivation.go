package main

// Socket activation (sd_listen_fds(3)): systemd, or another service
// manager that speaks the protocol, opens the listening sockets and passes
// them to the daemon. A passed socket outlives the process, so while the
// daemon restarts, a client's connection waits in its backlog for the next
// process instead of being refused. The protocol: the sockets are
// descriptors 3 and up, LISTEN_FDS says how many, and LISTEN_PID names the
// process they are meant for (a child would see its parent's).

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// listenFDsStart is the first passed descriptor.
const listenFDsStart = 3

// activatedListeners returns the TCP listeners the service manager passed
// to this process, the descriptors first and up; none when LISTEN_FDS is
// unset or LISTEN_PID names another process.
func activatedListeners(getenv func(string) string, first int) ([]*net.TCPListener, error) {
	fds := getenv("LISTEN_FDS")
	if fds == "" || getenv("LISTEN_PID") != strconv.Itoa(os.Getpid()) {
		return nil, nil
	}
	n, err := strconv.Atoi(fds)
	if err != nil || n < 1 || n > 2 {
		return nil, fmt.Errorf("LISTEN_FDS=%q: want 1 or 2 sockets (the proxy's and the health server's)", fds)
	}
	names := strings.Split(getenv("LISTEN_FDNAMES"), ":")
	var lns []*net.TCPListener
	for i := range n {
		name := "socket " + strconv.Itoa(first+i)
		if i < len(names) && names[i] != "" {
			name += " (" + names[i] + ")"
		}
		tl, err := tcpListenerFrom(uintptr(first+i), name+" passed by the service manager")
		if err != nil {
			closeAll(lns)
			return nil, err
		}
		lns = append(lns, tl)
	}
	return lns, nil
}

// tcpListenerFrom makes a listener of the passed descriptor fd, which it
// closes, named name in errors. Only a listening stream socket will do:
// net.FileListener takes a connected one too (systemd's Accept=yes passes
// one), on which every accept fails with EINVAL for ever.
func tcpListenerFrom(fd uintptr, name string) (*net.TCPListener, error) {
	f := os.NewFile(fd, name)
	defer f.Close()
	typ, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TYPE)
	listening, lerr := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ACCEPTCONN)
	switch {
	case errors.Join(err, lerr) != nil:
		return nil, fmt.Errorf("%s: want a listening TCP socket: %w", name, errors.Join(err, lerr))
	case typ != unix.SOCK_STREAM:
		return nil, fmt.Errorf("%s: want a listening TCP socket, not a datagram or other socket (type %d)", name, typ)
	case listening == 0:
		return nil, fmt.Errorf("%s: want a listening TCP socket, not one that does not listen, "+
			"such as the connection a service manager passes with Accept=yes (want Accept=no)", name)
	}
	ln, err := net.FileListener(f) // a duplicate; the passed descriptor is closed on return
	tl, ok := ln.(*net.TCPListener)
	if err == nil && !ok {
		_ = ln.Close()
		err = errors.New("not a TCP socket")
	}
	if err != nil {
		return nil, fmt.Errorf("%s: want a listening TCP socket: %w", name, err)
	}
	return tl, nil
}

// takeActivated removes from lns the listener on port and returns it; ok
// false if there is none. A listener on that port but another address than
// host (when host is an address) is an error: the unit and the flags
// disagree.
func takeActivated(lns *[]*net.TCPListener, host string, port int, flags string) (ln *net.TCPListener, ok bool, err error) {
	for i, ln := range *lns {
		tcp, isTCP := ln.Addr().(*net.TCPAddr)
		if !isTCP || tcp.Port != port {
			continue
		}
		if want, err := netip.ParseAddr(host); err == nil && want.Unmap() != tcp.AddrPort().Addr().Unmap() {
			return nil, false, fmt.Errorf("the socket passed on %s is not where %s say: %s", tcp, flags, net.JoinHostPort(host, strconv.Itoa(port)))
		}
		*lns = append((*lns)[:i], (*lns)[i+1:]...)
		return ln, true, nil
	}
	return nil, false, nil
}

func closeAll(lns []*net.TCPListener) {
	for _, ln := range lns {
		_ = ln.Close()
	}
}
