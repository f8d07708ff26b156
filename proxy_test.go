package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// errEMFILE is the error of a system call that ran out of descriptors.
func errEMFILE() error { return syscall.EMFILE }

// testUpstream is a real TCP server on 127.0.0.1:0 that runs handler for each
// connection and can be killed, closing its listener and every connection.
type testUpstream struct {
	ln      net.Listener
	addr    string
	handler func(net.Conn)

	mu       sync.Mutex
	conns    map[net.Conn]bool
	accepted int
	open     int // handlers still running
	wg       sync.WaitGroup
}

func startUpstream(t testing.TB, handler func(net.Conn)) *testUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &testUpstream{ln: ln, addr: ln.Addr().String(), handler: handler, conns: map[net.Conn]bool{}}
	u.wg.Go(u.acceptLoop)
	t.Cleanup(u.kill)
	return u
}

func (u *testUpstream) acceptLoop() {
	for {
		c, err := u.ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil { // paused, or EMFILE in the exhaustion test: wait and retry
			time.Sleep(time.Millisecond)
			continue
		}
		u.mu.Lock()
		u.conns[c] = true
		u.accepted++
		u.open++
		u.mu.Unlock()
		u.wg.Go(func() {
			defer u.closed(c)
			u.handler(c)
		})
	}
}

func (u *testUpstream) closed(c net.Conn) {
	_ = c.Close()
	u.mu.Lock()
	defer u.mu.Unlock()
	delete(u.conns, c)
	u.open--
}

// pause stops or resumes accepting. While the upstream is paused the
// kernel still completes handshakes into the backlog, so checks and dials
// succeed, but it takes no descriptor and, above all, frees none: a test
// that has used every descriptor stays out of them.
func (u *testUpstream) pause(on bool) {
	var deadline time.Time
	if on {
		deadline = time.Unix(1, 0) // past: Accept fails at once, accepting nothing
	}
	setAcceptDeadline(u.ln, deadline)
}

func (u *testUpstream) openCount() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.open
}

// kill closes the listener and every open connection, like a dead process.
func (u *testUpstream) kill() {
	_ = u.ln.Close()
	u.mu.Lock()
	for c := range u.conns {
		_ = c.Close()
	}
	u.mu.Unlock()
	u.wg.Wait()
}

func (u *testUpstream) acceptedCount() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.accepted
}

// echo copies everything back and half-closes when the client does.
func echo(c net.Conn) {
	_, _ = io.Copy(c, c)
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}

// deadAddr returns a loopback address with nothing listening on it.
func deadAddr(t *testing.T) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(unusedPort(t)))
}

type testProxy struct {
	*proxy
	addr string
	reg  *prometheus.Registry
	m    *metrics
}

// startProxy runs a proxy on 127.0.0.1:0 in front of endpoints and stops it
// at the end of the test.
func startProxy(t testing.TB, cfg poolConfig, endpoints ...string) *testProxy {
	t.Helper()
	return startProxyDial(t, cfg, nil, endpoints...)
}

// startProxyDial is startProxy with the upstream dial wrapped by wrap.
func startProxyDial(t testing.TB, cfg poolConfig, wrap func(dialFunc) dialFunc, endpoints ...string) *testProxy {
	t.Helper()
	if cfg.interval == 0 {
		cfg.interval, cfg.timeout = time.Hour, time.Second
	}
	return startProxyCheck(t, cfg, tcpCheck, wrap, endpoints...)
}

// startProxyCheck is startProxyDial with the pool's check function and
// configuration exactly as given.
func startProxyCheck(t testing.TB, cfg poolConfig, check checkFunc, wrap func(dialFunc) dialFunc, endpoints ...string) *testProxy {
	t.Helper()
	return startProxyLog(t, slog.New(slog.DiscardHandler), cfg, check, wrap, endpoints...)
}

// startProxyLog is startProxyCheck logging to log.
func startProxyLog(t testing.TB, log *slog.Logger, cfg poolConfig, check checkFunc, wrap func(dialFunc) dialFunc, endpoints ...string) *testProxy {
	t.Helper()
	reg := prometheus.NewRegistry()
	m := newMetrics(reg)
	pl := newPool(log, m, cfg, check, randomSelector{})
	px := newProxy(log, m, pl, 2*time.Second, 4096)
	if wrap != nil {
		px.dial = wrap(px.dial)
	}
	pl.update(endpoints)
	return &testProxy{proxy: px, addr: serveTestProxy(t, px, pl), reg: reg, m: m}
}

// serveTestProxy serves px on a new listener until the test ends, and then
// shuts px and its pool pl down; it returns the listener's address.
func serveTestProxy(t testing.TB, px *proxy, pl *pool) string {
	t.Helper()
	ln, err := listenTCP(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { px.serve(ctx, newSteadyListener(ln, px.log, "", &px.stalledSince)) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		if err := px.shutdown(); err != nil {
			t.Error(err)
		}
		pl.close()
	})
	return ln.Addr().String()
}

func dialProxy(t *testing.T, addr string) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c.(*net.TCPConn)
}

// roundTrip writes msg and reads it back through an echo upstream.
func roundTrip(c net.Conn, msg []byte) error {
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(msg); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return fmt.Errorf("read: %w", err)
	}
	if !bytes.Equal(got, msg) {
		return fmt.Errorf("got %q; want %q", got, msg)
	}
	return nil
}

// waitFor polls cond until it holds or a 10 s deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestProxyForwardsBothWays: bytes pass both ways, 64 MiB of them intact
// with both directions busy at once, and the connection is counted while
// it lasts.
func TestProxyForwardsBothWays(t *testing.T) {
	const size = 64 << 20
	up := startUpstream(t, echo)
	px := startProxy(t, poolConfig{}, up.addr)
	c := dialProxy(t, px.addr)
	for _, msg := range []string{"hello", "kubernetes"} {
		if err := roundTrip(c, []byte(msg)); err != nil {
			t.Fatal(err)
		}
	}
	if got := testutil.ToFloat64(px.m.connectionsTotal); got != 1 {
		t.Errorf("connections_total: got %v; want 1", got)
	}
	if got := testutil.ToFloat64(px.m.connectionsActive); got != 1 {
		t.Errorf("connections_active: got %v; want 1", got)
	}
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))
	sent, received := sha256.New(), sha256.New()
	writeErr := make(chan error, 1)
	go func() {
		buf := make([]byte, 256<<10)
		for i := range buf {
			buf[i] = byte(i * 7)
		}
		for n := 0; n < size; n += len(buf) {
			buf[0] = byte(n >> 18) // vary the content per chunk
			sent.Write(buf)
			if _, err := c.Write(buf); err != nil {
				writeErr <- err
				return
			}
		}
		writeErr <- c.CloseWrite()
	}()
	n, err := io.Copy(received, c)
	if werr := <-writeErr; werr != nil {
		t.Fatal(werr)
	}
	if err != nil || n != size {
		t.Fatalf("received %d bytes, %v; want %d", n, err, size)
	}
	if !bytes.Equal(sent.Sum(nil), received.Sum(nil)) {
		t.Fatal("received bytes differ from sent bytes")
	}
	_ = c.Close()
	waitFor(t, "connections_active to return to 0", func() bool {
		return testutil.ToFloat64(px.m.connectionsActive) == 0
	})
}

// TestProxyPropagatesHalfClose: the end of one direction is passed on as a
// half-close, and the other direction goes on, whichever side ends first.
func TestProxyPropagatesHalfClose(t *testing.T) {
	t.Run("client first", func(t *testing.T) {
		// The upstream answers only after the client has finished
		// sending, as many request/response protocols do.
		up := startUpstream(t, func(c net.Conn) {
			n, _ := io.Copy(io.Discard, c)
			fmt.Fprintf(c, "received %d bytes", n)
		})
		px := startProxy(t, poolConfig{}, up.addr)
		c := dialProxy(t, px.addr)
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write(make([]byte, 1000)); err != nil {
			t.Fatal(err)
		}
		if err := c.CloseWrite(); err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(c)
		if err != nil {
			t.Fatal(err)
		}
		if want := "received 1000 bytes"; string(got) != want {
			t.Errorf("got %q; want %q", got, want)
		}
	})
	t.Run("upstream first", func(t *testing.T) {
		// The upstream says all it has to say, half-closes, and then
		// reads what the client sends after that.
		uploaded := make(chan string, 1)
		up := startUpstream(t, func(c net.Conn) {
			if _, err := io.WriteString(c, "hello"); err != nil {
				return
			}
			_ = c.(*net.TCPConn).CloseWrite()
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if b, err := io.ReadAll(c); err == nil && len(b) > 0 { // not the health check
				uploaded <- string(b)
			}
		})
		px := startProxy(t, poolConfig{}, up.addr)
		c := dialProxy(t, px.addr)
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		got, err := io.ReadAll(c)
		if err != nil || string(got) != "hello" {
			t.Fatalf("read to the upstream's half-close: got %q, %v; want %q, EOF", got, err, "hello")
		}
		if _, err := io.WriteString(c, "after your end"); err != nil {
			t.Fatal(err)
		}
		if err := c.CloseWrite(); err != nil {
			t.Fatal(err)
		}
		select {
		case b := <-uploaded:
			if b != "after your end" {
				t.Errorf("upstream read %q after its half-close; want %q", b, "after your end")
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the upstream read nothing after its half-close within 5 s")
		}
	})
}

func TestProxySpreadsConcurrentConnections(t *testing.T) {
	ups := []*testUpstream{startUpstream(t, echo), startUpstream(t, echo), startUpstream(t, echo)}
	px := startProxy(t, poolConfig{}, ups[0].addr, ups[1].addr, ups[2].addr)
	const clients = 200
	errs := make(chan error, clients)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			c, err := net.DialTimeout("tcp", px.addr, 5*time.Second)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			errs <- roundTrip(c, fmt.Appendf(nil, "client %d", i))
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	for i, u := range ups {
		// Uniform choice gives each about 67; 30 is far in the tail.
		if got := u.acceptedCount(); got < 30 {
			t.Errorf("upstream %d accepted %d of %d connections; want an even spread", i, got, clients)
		}
	}
}

// TestRefusedClientsAreCountedAndWarnedOfSparingly: every refused client
// is counted; the warning comes at once, then at most once a minute with
// the number refused since, and never for dials that shutdown called off.
func TestRefusedClientsAreCountedAndWarnedOfSparingly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &syncBuffer{}
		log, m := slog.New(slog.NewTextHandler(logs, nil)), newMetrics(prometheus.NewRegistry())
		pl := newPool(log, m, poolConfig{interval: time.Hour, timeout: time.Second}, tcpCheck, randomSelector{})
		px := newProxy(log, m, pl, time.Second, 1)
		client, other := net.Pipe()
		defer client.Close()
		defer other.Close()
		refuse := func(ctx context.Context, n int) {
			for range n {
				px.refused(ctx, client, errNoUpstream)
			}
		}
		refuse(t.Context(), 3)
		time.Sleep(warnEvery / 2)
		refuse(t.Context(), 2)
		if got := strings.Count(logs.String(), "level=WARN"); got != 1 {
			t.Fatalf("warnings within a minute: got %d; want 1:\n%s", got, logs.String())
		}
		if !strings.Contains(logs.String(), "refused=1 ") {
			t.Errorf("first warning: got %q; want refused=1", logs.String())
		}
		time.Sleep(warnEvery / 2)
		refuse(t.Context(), 1)
		if got := logs.String(); strings.Count(got, "level=WARN") != 2 || !strings.Contains(got, "refused=5 ") {
			t.Errorf("after a minute: got\n%s\nwant a second warning with the 5 refused since the first", got)
		}
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		refuse(ctx, 1)
		if got := testutil.ToFloat64(px.m.clientsRefused); got != 6 {
			t.Errorf("clients_refused_total: got %v; want 6 (not the one refused during shutdown)", got)
		}
	})
}

// TestDeadConnectionCountedOnce: dead_connections_closed_total counts a
// connection whose copy met the kernel's ETIMEDOUT (keepalive or
// TCP_USER_TIMEOUT gave up on its peer) once, though both directions may
// meet it and the sweep may have counted it already; other ends, a
// deadline of the proxy's own included, do not count.
func TestDeadConnectionCountedOnce(t *testing.T) {
	px := newProxy(slog.New(slog.DiscardHandler), newMetrics(prometheus.NewRegistry()), nil, time.Second, 1)
	timedOut := &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ETIMEDOUT)}
	dead, alive, swept := &proxyConn{}, &proxyConn{}, &proxyConn{}
	px.noteDead(dead, timedOut)
	px.noteDead(dead, fmt.Errorf("write: %w", timedOut)) // the other direction
	for _, err := range []error{nil, io.EOF, syscall.ECONNRESET, syscall.EPIPE, os.ErrDeadlineExceeded} {
		px.noteDead(alive, err)
	}
	swept.dead.Store(true) // as closeStalledLocked leaves it
	px.noteDead(swept, timedOut)
	if got := testutil.ToFloat64(px.m.deadConnsClosed); got != 1 {
		t.Errorf("dead_connections_closed_total: got %v; want 1", got)
	}
}

// attachedTo returns the number of proxied connections attached to addr.
func attachedTo(px *testProxy, addr string) int {
	px.pool.mu.Lock()
	defer px.pool.mu.Unlock()
	u, ok := px.pool.upstreams[addr]
	if !ok {
		return -1
	}
	return len(u.conns)
}

// startDrain proxies a connection to upstream a, then lists another one
// instead, so that a drains with the drain timeout given. It returns the
// connection and when a was removed.
func startDrain(t *testing.T, drain time.Duration) (px *testProxy, a *testUpstream, old *net.TCPConn, removed time.Time) {
	t.Helper()
	a, b := startUpstream(t, echo), startUpstream(t, echo)
	px = startProxy(t, poolConfig{drainTimeout: drain}, a.addr)
	old = dialProxy(t, px.addr)
	if err := roundTrip(old, []byte("before")); err != nil {
		t.Fatal(err)
	}
	removed = time.Now()
	px.pool.update([]string{b.addr})
	return px, a, old, removed
}

// wantPeerClosed fails the test unless the peer closes c within d.
func wantPeerClosed(t *testing.T, c net.Conn, d time.Duration, what string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(d))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, errTimeout(err)) {
		t.Fatalf("read %s: got %v; want the connection closed", what, err)
	}
}

// TestProxyDrainsRemovedUpstream: a removed upstream keeps its open
// connections for the drain timeout and gets no new ones, then leaves the
// pool. (TestDrainsInProgress counts drains; TestDrainDeadline has a re-add
// call the drain off.)
func TestProxyDrainsRemovedUpstream(t *testing.T) {
	const drain = time.Second
	px, a, old, removed := startDrain(t, drain)
	if err := roundTrip(old, []byte("during drain")); err != nil {
		t.Fatalf("connection to draining upstream: %v", err)
	}
	if got := testutil.ToFloat64(px.m.upstreamsTotal); got != 2 {
		t.Errorf("upstreams_total during drain: got %v; want 2", got)
	}
	acceptedA := a.acceptedCount()
	for range 10 {
		c := dialProxy(t, px.addr)
		if err := roundTrip(c, []byte("new")); err != nil {
			t.Fatal(err)
		}
		_ = c.Close()
	}
	if got := a.acceptedCount(); got != acceptedA {
		t.Errorf("draining upstream accepted %d new connections; want 0", got-acceptedA)
	}
	wantPeerClosed(t, old, 5*time.Second, "after drain timeout")
	if took := time.Since(removed); took < drain {
		t.Errorf("connection to the removed upstream closed %v after its removal; want the drain timeout, %v", took, drain)
	}
	waitFor(t, "a to leave the pool", func() bool { return attachedTo(px, a.addr) == -1 })
	if got := testutil.ToFloat64(px.m.upstreamsTotal); got != 1 {
		t.Errorf("upstreams_total after drain: got %v; want 1", got)
	}
	if n := testutil.CollectAndCount(px.m.healthStatus); n != 1 {
		t.Errorf("health_check_status series after drain: got %d; want 1", n)
	}
}

// errTimeout returns err itself when it is a timeout, so errors.Is matches
// only timeouts.
func errTimeout(err error) error {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return err
	}
	return errors.New("not a timeout")
}

func TestProxyDrainTimeoutZeroClosesAtOnce(t *testing.T) {
	px, _, old, _ := startDrain(t, 0)
	if got := testutil.ToFloat64(px.m.drains); got != 0 {
		t.Errorf("drains_in_progress after removal with drain timeout 0: got %v; want 0", got)
	}
	wantPeerClosed(t, old, 2*time.Second, "after removal with drain timeout 0")
}

func TestProxyDrainEndsWhenLastConnectionCloses(t *testing.T) {
	px, a, old, _ := startDrain(t, time.Hour)
	_ = old.Close()
	waitFor(t, "the drained upstream to leave the pool", func() bool { return attachedTo(px, a.addr) == -1 })
}

// TestServeBacksOffFailingAccepts: the accept loop waits between failing
// accepts, doubling from acceptBackoffMin, and accepts a waiting client as
// soon as Accept works again.
func TestServeBacksOffFailingAccepts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ln := &failingListener{pipeListener: newPipeListener()}
		ln.failures.Store(5)
		start := time.Now()
		px, stop := serveInBubble(t, ln)
		defer stop()
		client := ln.dial()
		defer client.Close()
		if got, want := time.Since(start), 155*time.Millisecond; got != want {
			t.Errorf("client accepted after %v of backoff; want %v (5+10+20+40+80 ms)", got, want)
		}
		synctest.Wait() // serve has gone on from the accept
		if got := px.acceptStalledFor(); got != 0 {
			t.Errorf("accept stalled for %v after it worked again; want 0", got)
		}
	})
}

// serveInBubble serves a proxy on ln, inside a synctest bubble, and returns
// it with the function that stops it.
func serveInBubble(t *testing.T, ln net.Listener) (*proxy, func()) {
	log := slog.New(slog.DiscardHandler)
	m := newMetrics(prometheus.NewRegistry())
	pl := newPool(log, m, defaultTestPool, newFakeChecks().check, randomSelector{})
	px := newProxy(log, m, pl, time.Second, 16)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); px.serve(ctx, newSteadyListener(ln, log, "", &px.stalledSince)) }()
	return px, func() {
		cancel()
		<-done
		if err := px.shutdown(); err != nil {
			t.Error(err)
		}
		pl.close()
	}
}

// TestConnectionLimitIsLogged: being at the connection limit is logged with
// the limit at once, and then at most once a minute, so connections coming
// and going at the limit do not flood the log.
func TestConnectionLimitIsLogged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &syncBuffer{}
		log, m := slog.New(slog.NewTextHandler(logs, nil)), newMetrics(prometheus.NewRegistry())
		pl := newPool(log, m, poolConfig{interval: time.Hour, timeout: time.Second}, tcpCheck, randomSelector{})
		px := newProxy(log, m, pl, time.Second, 1)
		if got := testutil.ToFloat64(px.m.connLimit); got != 1 {
			t.Errorf("connection_limit: got %v; want 1", got)
		}
		// atLimit fills the one slot, lets takeSlot wait, then frees the
		// slot and gives back what takeSlot took.
		atLimit := func() {
			px.slots <- struct{}{}
			took := make(chan bool, 1)
			go func() { took <- px.takeSlot(t.Context()) }()
			synctest.Wait()
			<-px.slots
			if !<-took {
				t.Fatal("takeSlot: got false; want a slot once one was free")
			}
			<-px.slots
		}
		const at = `msg="at the connection limit`
		atLimit()
		if got := logs.String(); strings.Count(got, at) != 1 || !strings.Contains(got, "limit=1") {
			t.Fatalf("log at the limit: got\n%s\nwant one line with the limit", got)
		}
		time.Sleep(30 * time.Second)
		atLimit() // again within the minute: quiet
		if got := strings.Count(logs.String(), at); got != 1 {
			t.Errorf("at the limit again within a minute: got %d lines; want 1", got)
		}
		time.Sleep(time.Minute)
		atLimit()
		if got := strings.Count(logs.String(), at); got != 2 {
			t.Errorf("at the limit after a minute: got %d lines; want 2", got)
		}
		ctx, cancel := context.WithCancel(t.Context())
		px.slots <- struct{}{}
		cancel()
		if px.takeSlot(ctx) {
			t.Error("takeSlot at the limit after cancellation: got true; want false")
		}
	})
}

// deadlineListener fails its first failures Accepts as accept4(2) does
// when the process is out of descriptors, and then, with nobody ever
// dialling, waits for its deadline (a timeout) or for ever.
type deadlineListener struct {
	*pipeListener
	failures int
	deadline time.Time
}

func (l *deadlineListener) Accept() (net.Conn, error) {
	if l.failures > 0 {
		l.failures--
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", errEMFILE())}
	}
	if l.deadline.IsZero() {
		<-l.closed
		return nil, net.ErrClosed
	}
	time.Sleep(time.Until(l.deadline))
	return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.ErrDeadlineExceeded}
}

func (l *deadlineListener) SetDeadline(t time.Time) error { l.deadline = t; return nil }

// TestServeRecoversWithoutClient: accept4(2) takes a descriptor before it
// looks at the queue, so when the proxy accepts its last waiting client with
// the last free descriptor, its next Accept fails at once, and no client may
// come for a long while once descriptors are back (kubelet and kube-proxy
// keep their connections). The stall must end without one: serve retries
// with a short deadline, and a timeout proves that Accept works. Were it
// cleared only by a client, /healthz would fail after --liveness-threshold
// and the kubelet would restart a daemon that had recovered.
func TestServeRecoversWithoutClient(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ln := &deadlineListener{pipeListener: newPipeListener(), failures: 3}
		px, stop := serveInBubble(t, ln)
		defer stop()
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if got := px.acceptStalledFor(); got == 0 {
			t.Fatal("accept stall: got none while Accept fails; want one")
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if got := px.acceptStalledFor(); got != 0 {
			t.Errorf("accept stalled for %v after Accept works again with nobody dialling; want 0", got)
		}
		if !ln.deadline.IsZero() {
			t.Errorf("accept deadline %v left set after the recovery; want none", ln.deadline)
		}
	})
}
