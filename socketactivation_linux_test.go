package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// passAt duplicates files onto consecutive descriptors from 1000 up, as a
// service manager lays sockets out from 3, and returns the first.
func passAt(t *testing.T, files ...*os.File) int {
	t.Helper()
	first := -1
	for i, f := range files {
		want := 1000
		if i > 0 {
			want = first + i
		}
		fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, want)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = fd
		} else if fd != first+i {
			_ = unix.Close(fd)
			t.Skipf("descriptor %d is taken", first+i)
		}
	}
	return first
}

// open reports whether descriptor fd is open.
func open(fd int) bool {
	_, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	return err == nil
}

func listenerFile(t *testing.T) (*net.TCPListener, *os.File) {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	f, err := ln.File()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return ln, f
}

// TestActivatedListeners reads the LISTEN_* protocol: sockets only for
// this process, each a listening TCP socket, at most the two the daemon
// has; the passed descriptors are consumed.
func TestActivatedListeners(t *testing.T) {
	pid := strconv.Itoa(os.Getpid())
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			if i := slices.Index(kv, k); i >= 0 && i%2 == 0 {
				return kv[i+1]
			}
			return ""
		}
	}
	t.Run("none", func(t *testing.T) {
		lns, err := activatedListeners(env(), 1000)
		if lns != nil || err != nil {
			t.Errorf("got %v, %v; want nothing", lns, err)
		}
	})
	t.Run("two, with names", func(t *testing.T) {
		a, fa := listenerFile(t)
		b, fb := listenerFile(t)
		first := passAt(t, fa, fb)
		lns, err := activatedListeners(env("LISTEN_FDS", "2", "LISTEN_PID", pid, "LISTEN_FDNAMES", "proxy:health"), first)
		if err != nil || len(lns) != 2 {
			t.Fatalf("got %v, %v; want two listeners", lns, err)
		}
		closeAll(lns...)
		if lns[0].Addr().String() != a.Addr().String() || lns[1].Addr().String() != b.Addr().String() {
			t.Errorf("addresses %v %v; want %v %v, in order", lns[0].Addr(), lns[1].Addr(), a.Addr(), b.Addr())
		}
		if open(first) || open(first+1) {
			t.Error("the passed descriptors are still open")
		}
	})
	t.Run("meant for another process", func(t *testing.T) {
		_, f := listenerFile(t)
		first := passAt(t, f)
		defer unix.Close(first)
		lns, err := activatedListeners(env("LISTEN_FDS", "1", "LISTEN_PID", "1"), first)
		if lns != nil || err != nil || !open(first) {
			t.Errorf("got %v, %v (descriptor open %v); want nothing, the descriptor left alone", lns, err, open(first))
		}
	})
	t.Run("too many", func(t *testing.T) {
		_, err := activatedListeners(env("LISTEN_FDS", "3", "LISTEN_PID", pid), 1000)
		if err == nil || !strings.Contains(err.Error(), `LISTEN_FDS="3": want 1 or 2 sockets`) {
			t.Errorf("got %v; want LISTEN_FDS named", err)
		}
	})
	t.Run("not a TCP listener", func(t *testing.T) {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
		f, err := pc.(*net.UDPConn).File()
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		first := passAt(t, f)
		_, err = activatedListeners(env("LISTEN_FDS", "1", "LISTEN_PID", pid, "LISTEN_FDNAMES", "proxy"), first)
		want := "socket " + strconv.Itoa(first) + " (proxy) passed by the service manager: want a listening TCP socket"
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("got %v; want %q", err, want)
		}
	})
}

// TestListenAdoptsPassedSockets: a passed socket on --bind-port serves the
// proxy, the health server still gets its own; a passed socket that the
// flags do not describe refuses the start, naming both, and is closed.
func TestListenAdoptsPassedSockets(t *testing.T) {
	ctx := context.Background()
	cfg := func(bind string, port int) *config {
		return &config{BindAddress: bind, BindPort: port, HealthBindAddress: "127.0.0.1", HealthPort: freePort(t)}
	}
	t.Run("proxy passed", func(t *testing.T) {
		ln, _ := listenerFile(t)
		c := cfg("127.0.0.1", ln.Addr().(*net.TCPAddr).Port)
		s, err := listen(ctx, c, []*net.TCPListener{ln}, testLogger(t))
		if err != nil || !s.lbPassed {
			t.Fatalf("got %v, passed %v; want the passed listener", err, s.lbPassed)
		}
		lb, health := s.lb, s.health
		defer lb.Close()
		defer health.Close()
		if lb.Addr().String() != ln.Addr().String() || health.Addr().(*net.TCPAddr).Port != c.HealthPort {
			t.Errorf("listening on %v and %v; want the passed %v and port %d", lb.Addr(), health.Addr(), ln.Addr(), c.HealthPort)
		}
	})
	for name, tc := range map[string]struct {
		bind     string
		samePort bool
		want     string
	}{
		"another address": {"127.0.0.2", true, "is not where --bind-address, --bind-port say: 127.0.0.2:"},
		"another port":    {"127.0.0.1", false, "is on neither --bind-port"},
	} {
		t.Run(name, func(t *testing.T) {
			ln, _ := listenerFile(t)
			port := freePort(t)
			if tc.samePort {
				port = ln.Addr().(*net.TCPAddr).Port
			}
			_, err := listen(ctx, cfg(tc.bind, port), []*net.TCPListener{ln}, testLogger(t))
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), ln.Addr().String()) {
				t.Errorf("got %v; want an error naming %s and %q", err, ln.Addr(), tc.want)
			}
			if _, err := ln.Accept(); err == nil {
				t.Error("the passed socket is still open")
			}
		})
	}
}

// TestSocketActivationRestart holds the proxy's listening socket as
// systemd does and runs three daemons on it, one after the other:
// connections made while none runs wait in the backlog and are served by
// the next one, none refused.
func TestSocketActivationRestart(t *testing.T) {
	if runMainIfChild() {
		return
	}
	t.Parallel() // its daemons are processes of their own
	up := startUpstream(t, echo)
	ln, f := listenerFile(t)
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	var waiting []net.Conn
	for gen := range 3 {
		mc := startMainPassing(t, []*os.File{f}, "--endpoints", up.addr, "--bind-port", port)
		if !slices.ContainsFunc(mc.early, func(l string) bool {
			return strings.Contains(l, "using the listening socket the service manager passed")
		}) {
			t.Errorf("daemon %d: no log line of the passed socket before the start-up line: %q", gen, mc.early)
		}
		for i, c := range waiting {
			if err := roundTrip(c, []byte("queued")); err != nil {
				t.Errorf("daemon %d: connection %d, made while no daemon ran: %v", gen, i, err)
			}
			_ = c.Close()
		}
		if c := dialProxy(t, ln.Addr().String()); roundTrip(c, []byte("direct")) != nil {
			t.Errorf("daemon %d does not serve", gen)
		}
		mc.stopCleanly(t, "serving on the passed socket")
		waiting = waiting[:0]
		for range 20 {
			c, err := net.DialTimeout("tcp", ln.Addr().String(), 2*time.Second)
			if err != nil {
				t.Fatalf("after daemon %d stopped: %v; want the connection to wait in the backlog", gen, err)
			}
			waiting = append(waiting, c)
		}
	}
	for _, c := range waiting {
		_ = c.Close()
	}
}

// TestSocketActivationRestartLosesNoRequest restarts the daemon 15 times
// on a held socket while clients make requests over connections they keep
// for a few requests each: no dial is refused and no request goes
// unanswered, because a stopping daemon closes a connection only once its
// client has been answered (listeners.go), and the next daemon serves
// what waited in the backlog. Force-closing instead fails a few requests
// in every restart.
func TestSocketActivationRestartLosesNoRequest(t *testing.T) {
	if runMainIfChild() {
		return
	}
	t.Parallel() // its daemons are processes of their own
	up := startUpstream(t, slowPong)
	ln, f := listenerFile(t)
	addr := ln.Addr().String()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	stop := make(chan struct{})
	results := make(chan requestCounts, 8)
	for i := range 8 {
		go func() { results <- requestLoop(addr, stop, int64(i)) }()
	}
	const restarts, minRequests = 15, 300
	for range restarts {
		mc := startMainPassing(t, []*os.File{f}, "--endpoints", up.addr, "--bind-port", port, "--log-level", "info")
		time.Sleep(100 * time.Millisecond)
		mc.stopCleanly(t, "serving requests")
	}
	mc := startMainPassing(t, []*os.File{f}, "--endpoints", up.addr, "--bind-port", port, "--log-level", "info")
	close(stop)
	total := sumCounts(results, 8)
	mc.stopCleanly(t, "the last requests")
	t.Logf("%d restarts: %d connections, %d requests, %d failed", restarts, total.conns, total.requests, total.failed)
	if total.failed > 0 || total.requests < minRequests {
		t.Errorf("%d of %d requests failed (first: %v); want none of at least %d", total.failed, total.requests, total.firstErr, minRequests)
	}
}

// slowPong answers each line with "pong\n" after 10 ms, as an API server
// takes a moment over a request.
func slowPong(c net.Conn) {
	r := bufio.NewReader(c)
	for {
		if _, err := r.ReadString('\n'); err != nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
		if _, err := io.WriteString(c, "pong\n"); err != nil {
			return
		}
	}
}

type requestCounts struct {
	conns, requests, failed int
	firstErr                error
}

// sumCounts adds up the counts of n clients from results.
func sumCounts(results <-chan requestCounts, n int) requestCounts {
	var total requestCounts
	for range n {
		r := <-results
		total.conns, total.requests, total.failed = total.conns+r.conns, total.requests+r.requests, total.failed+r.failed
		if r.firstErr != nil && total.firstErr == nil {
			total.firstErr = r.firstErr
		}
	}
	return total
}

// requestLoop makes requests until stop is closed: a connection, 1 to 5
// requests with pauses under 50 ms, then the next connection. A refused
// dial or a request without its answer is a failure. Before reusing a
// connection it looks whether the server closed it meanwhile, as HTTP
// clients do (Go's notices at once, from its connection's read loop).
func requestLoop(addr string, stop <-chan struct{}, seed int64) requestCounts {
	var n requestCounts
	fail := func(err error) {
		n.failed++
		if n.firstErr == nil {
			n.firstErr = err
		}
	}
	rng := rand.New(rand.NewPCG(uint64(seed), 1))
	for {
		select {
		case <-stop:
			return n
		default:
		}
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			fail(err)
			continue
		}
		n.conns++
		r := bufio.NewReader(c)
		for i := range 1 + rng.IntN(5) {
			if i > 0 && closedByServer(c, r) {
				break // as an HTTP client's idle connection: the next request goes on a new one
			}
			n.requests++
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.WriteString(c, "ping\n"); err != nil {
				fail(err)
				break
			}
			if line, err := r.ReadString('\n'); err != nil || line != "pong\n" {
				fail(fmt.Errorf("request %d on a connection: %q, %w", n.requests, line, err))
				break
			}
			time.Sleep(time.Duration(rng.IntN(50)) * time.Millisecond)
		}
		_ = c.Close()
	}
}

// closedByServer reports whether the server closed c since its last
// answer: a read then ends at once rather than timing out.
func closedByServer(c net.Conn, r *bufio.Reader) bool {
	_ = c.SetReadDeadline(time.Now().Add(time.Millisecond))
	_, err := r.Peek(1)
	var ne net.Error
	return err != nil && (!errors.As(err, &ne) || !ne.Timeout())
}
