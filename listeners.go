package main

// The daemon's listening sockets. openSockets opens them at start; with no
// socket passed or handed over, listen opens its own, and the rest of this
// file and handover.go, beyond the spec, can be skipped: listening sockets
// that outlive the process, so that a restart or an upgrade refuses no
// connection.
//
// Socket activation (sd_listen_fds(3)): systemd, or another service
// manager that speaks the protocol, opens the listening sockets and passes
// them to the daemon. A passed socket outlives the process, so while the
// daemon restarts, a client's connection waits in its backlog for the next
// process instead of being refused. The protocol: the sockets are
// descriptors 3 and up, LISTEN_FDS says how many, and LISTEN_PID names the
// process they are meant for (a child would see its parent's).
//
// The graceful stop, a deliberate difference from the spec, which closes
// every connection at once on SIGTERM: when the listening socket outlives
// the process (socket activation: systemd holds it), the next process
// serves new connections, so cutting the open ones buys nothing and fails
// every request in flight on them. Instead the daemon closes each one once
// its client has been answered: the last data on the client socket went to
// the client (or came back at once, as an HTTP/2 client's acknowledgement
// does), and it has been quiet since for stopQuiet. A client between
// requests then reconnects, into the next process; a request still
// outstanding keeps its connection until it is answered or stopWindow
// passes, when the spec's force-close takes the rest. New connections
// wait in the backlog meanwhile, so the window is short.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

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
			closeAll(lns...)
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

// closeAll closes each of lns that is not a nil interface.
func closeAll[L io.Closer](lns ...L) {
	for _, ln := range lns {
		if any(ln) != nil {
			_ = ln.Close()
		}
	}
}

// sockets are the daemon's listeners, and what keeps them beyond the
// process.
type sockets struct {
	lb, health *steadyListener
	// lbPassed says the proxy's socket was passed: by the service
	// manager, or, with predecessor set, by the instance that handed the
	// sockets over.
	lbPassed bool
	handover *handover // nil without --handover-socket
	// predecessor is the hand-over connection to the instance that handed
	// the sockets over, nil if none did; follow owns it.
	predecessor *net.UnixConn
}

// openSockets opens the daemon's listeners: those the service manager
// passed, else those the running instance hands over (handover.go), else
// its own. With --handover-socket it serves hand-overs of them too. A
// proxy socket shared with the instance that handed it over is not
// accepted on until openShared or follow opens its gate.
func openSockets(ctx context.Context, cfg *config, getenv func(string) string, log *slog.Logger) (s sockets, err error) {
	passed, err := activatedListeners(getenv, listenFDsStart)
	if err != nil {
		return s, err
	}
	for _, ln := range passed {
		log.Info("using the listening socket the service manager passed", "address", ln.Addr().String())
	}
	if len(passed) > 0 || cfg.HandoverSocket == "" {
		s, err = listen(ctx, cfg, passed, log)
	} else {
		s, err = takeOverOrListen(ctx, cfg, log)
	}
	if err != nil || cfg.HandoverSocket == "" {
		return s, err
	}
	ln, err := bindOver(cfg.HandoverSocket)
	if err != nil {
		closeAll(s.lb, s.health)
		if s.predecessor != nil {
			_ = s.predecessor.Close()
		}
		return s, fmt.Errorf("%s: %w", flagRef("handover-socket"), err)
	}
	s.handover = &handover{path: cfg.HandoverSocket, ln: ln, log: log.With("component", "handover"), lb: s.lb, health: s.health}
	return s, nil
}

// listen opens the proxy's and the health server's listeners, or adopts
// those among passed, the sockets the service manager passed or the running
// instance handed over, so that a bind error surfaces, naming its flags,
// before anything else starts, and makes their accept loops (log is the
// daemon's). lbPassed reports that the proxy's listener is one of passed.
// Each of passed must be one of the two. It closes passed on error.
func listen(ctx context.Context, cfg *config, passed []*net.TCPListener, log *slog.Logger) (sockets, error) {
	lb, lbTCP, err := openOr(ctx, passed, cfg.BindAddress, cfg.BindPort, "load balancer listener", "--bind-address, --bind-port",
		listenTCP, activatedProxyListener)
	var health net.Listener
	var healthTCP *net.TCPListener
	if err == nil {
		health, healthTCP, err = openOr(ctx, passed, cfg.HealthBindAddress, cfg.HealthPort, "health server listener",
			"--health-bind-address, --health-port", listenHealth, activatedHealthListener)
	}
	for _, ln := range passed {
		if err == nil && ln != lbTCP && ln != healthTCP {
			err = fmt.Errorf("the socket passed on %s is on neither --bind-port %d nor --health-port %d", ln.Addr(), cfg.BindPort, cfg.HealthPort)
		}
	}
	if err != nil {
		closeAll(passed...)
		closeAll(lb, health)
		return sockets{}, err
	}
	return sockets{lb: newSteadyListener(lb, log.With("component", "proxy"), "", new(atomic.Int64)),
		health: newSteadyListener(health, log, "health server ", new(atomic.Int64)), lbPassed: lbTCP != nil}, nil
}

// openOr adopts the first of passed on port, if any, and returns it as
// adopted too, or opens a listener on host:port, what and flags naming it in
// errors. A passed socket must be on host too when host is an address:
// else the unit and the flags disagree.
func openOr(ctx context.Context, passed []*net.TCPListener, host string, port int, what, flags string,
	open func(context.Context, string) (net.Listener, error), adopt func(*net.TCPListener) net.Listener,
) (ln net.Listener, adopted *net.TCPListener, err error) {
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	for _, p := range passed {
		if listenPort(p) != port {
			continue
		}
		got, _ := netip.ParseAddrPort(p.Addr().String())
		if want, err := netip.ParseAddr(host); err == nil && want.Unmap() != got.Addr().Unmap() {
			return nil, nil, fmt.Errorf("the socket passed on %s is not where %s say: %s", p.Addr(), flags, addr)
		}
		return adopt(p), p, nil
	}
	if ln, err = open(ctx, addr); err != nil {
		return nil, nil, fmt.Errorf("%s (%s): %w", what, flags, err)
	}
	return ln, nil, nil
}

const (
	// stopQuiet is longer than a client's pause between the requests it
	// has ready, and short next to stopWindow.
	stopQuiet = 100 * time.Millisecond
	// stopWindow bounds the stop: new connections wait for it.
	stopWindow = time.Second
	// stopPoll: how often the stop looks for connections that handlers
	// still dialling attach, and for the last handler's end.
	stopPoll = 10 * time.Millisecond
)

// stopGracefully closes the connections whose clients have been answered
// when another process serves the listening socket after this one: the
// next one systemd starts, within stopWindow, or the successor a hand-over
// gave the socket to, spread over handoverSpread. Otherwise the spec's
// force-close in shutdown takes every connection at once. serve must have
// returned.
func (d *daemon) stopGracefully() {
	var spread time.Duration
	switch {
	case d.lbPassed && d.predecessor == nil: // the service manager passed it
	case d.handover != nil && d.handover.given.Load():
		spread = handoverSpread
	default:
		return
	}
	start := time.Now()
	n := d.proxy.closeAnswered(stopQuiet, spread, spread+stopWindow)
	d.log.Info("closed the answered connections; the process serving the socket after this one takes new ones",
		"closed", n, "left", len(d.proxy.pool.conns()), "after", time.Since(start).Round(time.Millisecond))
}

// closeAnswered closes, until every handler has ended or window has
// passed, every connection whose client was answered at least quiet ago
// and whose moment has come, a random one within spread of the start, and
// returns how many it closed. serve must have returned; handlers still
// dialling attach meanwhile and are judged as the others.
func (p *proxy) closeAnswered(quiet, spread, window time.Duration) int {
	start := time.Now()
	at := map[*proxyConn]time.Time{} // the closer's alone
	j := p.pool.closer.add(&closeJob{reason: connEndShutdown, conns: p.pool.allConns, deadline: start.Add(window),
		over: func() bool { return len(p.slots) == 0 }, every: stopPoll,
		due: func(pc *proxyConn, now time.Time, look func() connLook) (bool, time.Time) {
			t, seen := at[pc]
			if !seen {
				t = start.Add(rand.N(spread + 1)) //nolint:gosec // spreading needs no unpredictability
				at[pc] = t
			}
			if now.Before(t) {
				return false, t
			}
			return answeredDue(quiet, now, look)
		}})
	<-j.done
	return j.n
}
