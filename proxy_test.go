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
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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
		if err != nil { // EMFILE in the exhaustion test: wait and retry
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
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
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
	log := slog.New(slog.DiscardHandler)
	reg := prometheus.NewRegistry()
	m := newMetrics(reg)
	pl := newPool(log, m, cfg, check, randomSelector{})
	px := newProxy(log, m, pl, 2*time.Second, 4096)
	if wrap != nil {
		px.dial = wrap(px.dial)
	}
	pl.update(endpoints)
	ln, err := listenTCP(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { px.serve(ctx, ln) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		if err := px.shutdown(); err != nil {
			t.Error(err)
		}
		pl.close()
	})
	return &testProxy{proxy: px, addr: ln.Addr().String(), reg: reg, m: m}
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

func TestProxyForwardsBothWays(t *testing.T) {
	up := startUpstream(t, echo)
	px := startProxy(t, poolConfig{}, up.addr)
	c := dialProxy(t, px.addr)
	for _, msg := range []string{"hello", "kubernetes", string(make([]byte, 70000))} {
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
	_ = c.Close()
	waitFor(t, "connections_active to return to 0", func() bool {
		return testutil.ToFloat64(px.m.connectionsActive) == 0
	})
}

func TestProxyPropagatesHalfClose(t *testing.T) {
	// The upstream answers only after the client has finished sending, as
	// many request/response protocols do.
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
}

func TestProxyLargeTransferIntact(t *testing.T) {
	const size = 64 << 20
	up := startUpstream(t, echo)
	px := startProxy(t, poolConfig{}, up.addr)
	c := dialProxy(t, px.addr)
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))

	sent := sha256.New()
	var wg sync.WaitGroup
	var writeErr error
	wg.Go(func() {
		buf := make([]byte, 256<<10)
		for i := range buf {
			buf[i] = byte(i * 7)
		}
		for n := 0; n < size; n += len(buf) {
			buf[0] = byte(n >> 18) // vary the content per chunk
			sent.Write(buf)
			if _, err := c.Write(buf); err != nil {
				writeErr = err
				return
			}
		}
		writeErr = c.CloseWrite()
	})
	received := sha256.New()
	n, err := io.Copy(received, c)
	wg.Wait()
	if writeErr != nil {
		t.Fatal(writeErr)
	}
	if err != nil {
		t.Fatal(err)
	}
	if n != size {
		t.Fatalf("received %d bytes; want %d", n, size)
	}
	if !bytes.Equal(sent.Sum(nil), received.Sum(nil)) {
		t.Fatal("received bytes differ from sent bytes")
	}
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

func TestProxyRetriesFailedDialOnAnotherUpstream(t *testing.T) {
	alive := startUpstream(t, echo)
	dead := deadAddr(t)
	px := startProxy(t, poolConfig{}, alive.addr, dead)
	for i := range 20 {
		c := dialProxy(t, px.addr)
		if err := roundTrip(c, []byte("ping")); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		_ = c.Close()
	}
	if got := testutil.ToFloat64(px.m.connectionErrors.WithLabelValues(dead)); got < 1 {
		t.Errorf("connection_errors_total{upstream=dead}: got %v; want at least 1", got)
	}
	if got := testutil.ToFloat64(px.m.healthStatus.WithLabelValues(dead)); got != 0 {
		t.Errorf("health_check_status{upstream=dead}: got %v; want 0 after failed dials", got)
	}
}

func TestProxyLastResortWhenNothingPickable(t *testing.T) {
	alive := startUpstream(t, echo)
	dead := deadAddr(t)
	// Every check fails, so only the test decides the upstreams' state.
	failing := func(context.Context, string) checkResult { return checkResult{err: errors.New("test: check failed")} }
	var dialled dialLog
	px := startProxyCheck(t, poolConfig{interval: time.Hour, timeout: time.Second}, failing, dialled.wrap, alive.addr, dead)
	// The dead upstream was healthy last, so the last-resort dial tries it
	// first and its failure is the one that must not be counted.
	px.pool.mu.Lock()
	px.pool.upstreams[dead].lastHealthy = time.Now()
	px.pool.mu.Unlock()
	// Mark both unhealthy as two failed checks would.
	for _, addr := range []string{alive.addr, dead} {
		u := px.pool.upstreams[addr]
		px.pool.reportCheck(u, checkResult{err: errors.New("test: check failed")})
		px.pool.reportCheck(u, checkResult{err: errors.New("test: check failed")})
	}
	if px.pool.ready() {
		t.Fatal("pool ready with every upstream unhealthy")
	}
	errsBefore := testutil.ToFloat64(px.m.connectionErrors.WithLabelValues(dead))
	c := dialProxy(t, px.addr)
	if err := roundTrip(c, []byte("still here")); err != nil {
		t.Fatalf("last-resort connection: %v", err)
	}
	if !px.pool.ready() {
		t.Error("a successful last-resort dial did not re-include its upstream")
	}
	if got := testutil.ToFloat64(px.m.connectionErrors.WithLabelValues(dead)); got != errsBefore {
		t.Errorf("connection_errors_total{upstream=dead}: got %v; want %v (last-resort failures are not counted)", got, errsBefore)
	}
	if got := dialled.list(); len(got) < 2 || got[0] != dead || got[1] != alive.addr {
		t.Errorf("dials: got %v; want %s, then %s", got, dead, alive.addr)
	}
}

// dialLog records the addresses a proxy dials, in order.
type dialLog struct {
	mu    sync.Mutex
	addrs []string
}

func (l *dialLog) wrap(dial dialFunc) dialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		l.mu.Lock()
		l.addrs = append(l.addrs, addr)
		l.mu.Unlock()
		return dial(ctx, network, addr)
	}
}

func (l *dialLog) list() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.addrs)
}

func TestProxyRefusesClientWhenEveryDialFails(t *testing.T) {
	px := startProxy(t, poolConfig{}, deadAddr(t), deadAddr(t))
	c := dialProxy(t, px.addr)
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatalf("read %d bytes from a connection with no upstream; want EOF or reset", n)
	}
	if got := testutil.ToFloat64(px.m.connectionsTotal); got != 0 {
		t.Errorf("connections_total: got %v; want 0", got)
	}
	if got := testutil.ToFloat64(px.m.clientsRefused); got != 1 {
		t.Errorf("clients_refused_total: got %v; want 1", got)
	}
}

// TestRefusedClientsAreCountedAndWarnedOfSparingly: every refused client
// is counted; the warning comes at once, then at most once a minute with
// the number refused since, and never for dials that shutdown called off.
func TestRefusedClientsAreCountedAndWarnedOfSparingly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &syncBuffer{}
		px := newProxy(slog.New(slog.NewTextHandler(logs, nil)), newMetrics(prometheus.NewRegistry()), nil, time.Second, 1)
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

func TestProxyKeepsServingWhileAnUpstreamDies(t *testing.T) {
	a, b := startUpstream(t, echo), startUpstream(t, echo)
	px := startProxy(t, poolConfig{}, a.addr, b.addr)
	a.kill()
	for i := range 30 {
		c := dialProxy(t, px.addr)
		if err := roundTrip(c, []byte("after kill")); err != nil {
			t.Fatalf("connection %d after one upstream died: %v", i, err)
		}
		_ = c.Close()
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

func TestProxyDrainsRemovedUpstream(t *testing.T) {
	a, b := startUpstream(t, echo), startUpstream(t, echo)
	px := startProxy(t, poolConfig{drainTimeout: 500 * time.Millisecond}, a.addr)
	old := dialProxy(t, px.addr)
	if err := roundTrip(old, []byte("before")); err != nil {
		t.Fatal(err)
	}
	px.pool.update([]string{b.addr})
	// The old connection keeps working during the drain.
	if err := roundTrip(old, []byte("during drain")); err != nil {
		t.Fatalf("connection to draining upstream: %v", err)
	}
	if got := testutil.ToFloat64(px.m.upstreamsTotal); got != 2 {
		t.Errorf("upstreams_total during drain: got %v; want 2", got)
	}
	// New connections go to b only.
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
	// After the timeout the old connection is closed and a leaves the pool.
	_ = old.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := old.Read(make([]byte, 1)); err == nil || errors.Is(err, errTimeout(err)) {
		t.Fatalf("read after drain timeout: got %v; want the connection closed", err)
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
	a, b := startUpstream(t, echo), startUpstream(t, echo)
	px := startProxy(t, poolConfig{drainTimeout: 0}, a.addr)
	old := dialProxy(t, px.addr)
	if err := roundTrip(old, []byte("before")); err != nil {
		t.Fatal(err)
	}
	px.pool.update([]string{b.addr})
	_ = old.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := old.Read(make([]byte, 1)); err == nil || errors.Is(err, errTimeout(err)) {
		t.Fatalf("read after removal with drain timeout 0: got %v; want the connection closed", err)
	}
}

func TestProxyReAddAbortsDrain(t *testing.T) {
	a, b := startUpstream(t, echo), startUpstream(t, echo)
	px := startProxy(t, poolConfig{drainTimeout: 300 * time.Millisecond}, a.addr)
	old := dialProxy(t, px.addr)
	if err := roundTrip(old, []byte("before")); err != nil {
		t.Fatal(err)
	}
	px.pool.update([]string{b.addr})
	px.pool.update([]string{a.addr, b.addr})
	time.Sleep(600 * time.Millisecond) // twice the drain timeout: nothing may close
	if err := roundTrip(old, []byte("after re-add")); err != nil {
		t.Fatalf("connection after the drain was aborted: %v", err)
	}
	if got := attachedTo(px, a.addr); got != 1 {
		t.Errorf("connections attached to re-added upstream: got %d; want 1", got)
	}
}

func TestProxyDrainEndsWhenLastConnectionCloses(t *testing.T) {
	a, b := startUpstream(t, echo), startUpstream(t, echo)
	px := startProxy(t, poolConfig{drainTimeout: time.Hour}, a.addr)
	old := dialProxy(t, px.addr)
	if err := roundTrip(old, []byte("before")); err != nil {
		t.Fatal(err)
	}
	px.pool.update([]string{b.addr})
	_ = old.Close()
	waitFor(t, "the drained upstream to leave the pool", func() bool { return attachedTo(px, a.addr) == -1 })
}

func TestProxyRetriesWhenUpstreamStartsDrainingDuringDial(t *testing.T) {
	a, b := startUpstream(t, echo), startUpstream(t, echo)
	var pl atomic.Pointer[pool] // set before the client connects
	var once sync.Once
	var dials atomic.Int32
	px := startProxyDial(t, poolConfig{drainTimeout: time.Minute}, func(realDial dialFunc) dialFunc {
		return func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			c, err := realDial(ctx, network, addr)
			once.Do(func() {
				// The endpoint list changes while the first dial is in flight.
				if addr == a.addr {
					pl.Load().update([]string{b.addr})
				} else {
					pl.Load().update([]string{a.addr})
				}
			})
			return c, err
		}
	}, a.addr, b.addr)
	pl.Store(px.pool)
	c := dialProxy(t, px.addr)
	if err := roundTrip(c, []byte("retried")); err != nil {
		t.Fatalf("connection whose upstream started draining during the dial: %v", err)
	}
	if got := dials.Load(); got != 2 {
		t.Errorf("upstream dials: got %d; want 2 (the drained one, then the retry)", got)
	}
}

func TestConnLimit(t *testing.T) {
	tests := []struct {
		nofile uint64
		want   int
	}{
		{0, 1},
		{fdReserve, 1},
		{1024, (1024 - fdReserve) / fdsPerConn},
		{1 << 20, (1<<20 - fdReserve) / fdsPerConn},
	}
	for _, tt := range tests {
		if got, by := maxConnections(tt.nofile, 0); got != tt.want || by != limitByFiles {
			t.Errorf("maxConnections(%d, 0): got %d, %s; want %d, %s", tt.nofile, got, by, tt.want, limitByFiles)
		}
	}
}

func TestIsLocalExhaustion(t *testing.T) {
	wrapped := fmt.Errorf("dial upstream x: %w", &net.OpError{Op: "dial", Err: fmt.Errorf("socket: %w", errEMFILE())})
	if !isLocalExhaustion(wrapped) {
		t.Errorf("isLocalExhaustion(%v): got false; want true", wrapped)
	}
	if refused := errors.New("connection refused"); isLocalExhaustion(refused) {
		t.Errorf("isLocalExhaustion(%v): got true; want false", refused)
	}
}

// TestHedgeFollowsFailedDial: the first dial fails after the hedge delay,
// by which time a hedged dial is hanging on a black hole. The hanging dial
// gets a hedge of its own, so the client waits about two hedge delays, not
// the dial timeout.
func TestHedgeFollowsFailedDial(t *testing.T) {
	var addrs []string
	for range 3 {
		addrs = append(addrs, startUpstream(t, echo).addr)
	}
	var mu sync.Mutex
	dials := 0
	wrap := func(d dialFunc) dialFunc {
		return func(ctx context.Context, network, addr string) (net.Conn, error) {
			mu.Lock()
			dials++
			n := dials
			mu.Unlock()
			switch n {
			case 1: // refused late, like a restarting API server
				time.Sleep(300 * time.Millisecond)
				return nil, syscall.ECONNREFUSED
			case 2: // a black hole
				<-ctx.Done()
				return nil, ctx.Err()
			}
			return d(ctx, network, addr)
		}
	}
	px := startProxyDial(t, poolConfig{}, wrap, addrs...)
	waitFor(t, "a hedge delay from measured connects", func() bool { return px.pool.snap.Load().hedgeDelay < 100*time.Millisecond })
	start := time.Now()
	c := dialProxy(t, px.addr)
	if err := roundTrip(c, []byte("x")); err != nil {
		t.Fatal(err)
	}
	// About 0.4 s with the re-hedge; without it the client would wait
	// for the dial timeout.
	if took := time.Since(start); took > 1500*time.Millisecond {
		t.Errorf("first byte after %v; want under 1.5 s (dial timeout %v)", took.Round(time.Millisecond), px.dialTimeout)
	}
}

// TestCalledOffSlowDialGetsChecked: a dial called off because another won,
// after it had run for the hedge delay, triggers a check of its upstream,
// which may have vanished. A dial called off sooner does not, nor does a
// slow dial that wins, which has shown its upstream alive, nor one that
// was still waiting for descriptors, which never reached its upstream.
func TestCalledOffSlowDialGetsChecked(t *testing.T) {
	tests := []struct {
		name string
		// first and hedge are what the first dial and its hedge do before
		// they dial for real: wait, or hang until called off.
		first, hedge func(context.Context) error
		wantChecked  [2]bool // the first dial's upstream, the hedge's
	}{
		{"slow first dial wins just after its hedge started", waitThen(600 * time.Millisecond), waitThen(600 * time.Millisecond), [2]bool{false, false}},
		{"hanging first dial loses to its hedge", hang, waitThen(0), [2]bool{true, false}},
		{"first dial out of descriptors loses to its hedge", outOfDescriptors, waitThen(0), [2]bool{false, false}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := startUpstream(t, echo), startUpstream(t, echo)
			checks := newFakeChecks()
			// A 125 ms connect time makes the hedge delay 500 ms.
			checks.rtt[a.addr], checks.rtt[b.addr] = 125*time.Millisecond, 125*time.Millisecond
			var mu sync.Mutex
			var order []string // the upstreams dialed, each once
			wrap := func(d dialFunc) dialFunc {
				return func(ctx context.Context, network, addr string) (net.Conn, error) {
					mu.Lock()
					if !slices.Contains(order, addr) {
						order = append(order, addr)
					}
					before := tt.first
					if addr != order[0] {
						before = tt.hedge
					}
					mu.Unlock()
					if err := before(ctx); err != nil {
						return nil, err
					}
					return d(ctx, network, addr)
				}
			}
			px := startProxyCheck(t, poolConfig{interval: time.Hour, timeout: time.Second}, checks.check, wrap, a.addr, b.addr)
			waitFor(t, "the first checks", func() bool { return checks.count(a.addr) == 1 && checks.count(b.addr) == 1 })
			waitFor(t, "a 500 ms hedge delay", func() bool { return px.pool.snap.Load().hedgeDelay == 500*time.Millisecond })
			if err := roundTrip(dialProxy(t, px.addr), []byte("x")); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			dialed := slices.Clone(order)
			mu.Unlock()
			if len(dialed) != 2 {
				t.Fatalf("dials: got %v; want the first and its hedge", dialed)
			}
			// The requests, if any, were made before the client's bytes
			// went through; the checks follow at once.
			for i, addr := range dialed {
				checked := rzSettle(500*time.Millisecond, func() bool { return checks.count(addr) > 1 })
				if checked != tt.wantChecked[i] {
					t.Errorf("upstream of dial %d (%s) checked again: got %v; want %v", i, addr, checked, tt.wantChecked[i])
				}
			}
		})
	}
}

// TestDialFailingAfterAnotherWonIsCounted: a dial that fails on its own
// (refused, not called off) just after its hedge won is a failure of its
// upstream like any other, counted in connection_errors_total.
func TestDialFailingAfterAnotherWonIsCounted(t *testing.T) {
	a, b := startUpstream(t, echo), startUpstream(t, echo)
	checks := newFakeChecks()
	// A 125 ms connect time makes the hedge delay 500 ms.
	checks.rtt[a.addr], checks.rtt[b.addr] = 125*time.Millisecond, 125*time.Millisecond
	var mu sync.Mutex
	first := ""
	wrap := func(d dialFunc) dialFunc {
		return func(ctx context.Context, network, addr string) (net.Conn, error) {
			mu.Lock()
			if first == "" {
				first = addr
			}
			isFirst := addr == first
			mu.Unlock()
			if isFirst { // refused late, and deaf to being called off
				time.Sleep(700 * time.Millisecond)
				return nil, &net.OpError{Op: "dial", Net: network, Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
			}
			return d(ctx, network, addr)
		}
	}
	px := startProxyCheck(t, poolConfig{interval: time.Hour, timeout: time.Second}, checks.check, wrap, a.addr, b.addr)
	waitFor(t, "a 500 ms hedge delay", func() bool { return px.pool.snap.Load().hedgeDelay == 500*time.Millisecond })
	if err := roundTrip(dialProxy(t, px.addr), []byte("x")); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	lost := first
	mu.Unlock()
	if got := testutil.ToFloat64(px.m.connectionErrors.WithLabelValues(lost)); got != 1 {
		t.Errorf("connection_errors_total{upstream=%s} after its dial was refused as the hedge won: got %v; want 1", lost, got)
	}
}

// TestLastResortFailureCountedWhileUpstreamsAvailable: in readyz mode an
// unready but healthy upstream is dialled as a last resort once every
// ready one has failed; some upstream was available, so its failure
// counts, as the spec has it.
func TestLastResortFailureCountedWhileUpstreamsAvailable(t *testing.T) {
	ready, unready := deadAddr(t), deadAddr(t)
	check := func(_ context.Context, addr string) checkResult {
		if addr == unready {
			return checkResult{probed: true, notReady: errors.New("test: not ready")}
		}
		return checkResult{probed: true}
	}
	px := startProxyCheck(t, poolConfig{interval: time.Hour, timeout: time.Second, readyz: true}, check, nil, ready, unready)
	waitFor(t, "one upstream ready, one not", func() bool {
		return testutil.ToFloat64(px.m.upstreamReady.WithLabelValues(ready)) == 1 &&
			testutil.ToFloat64(px.m.upstreamReady.WithLabelValues(unready)) == 0
	})
	c := dialProxy(t, px.addr)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("read: got a byte through two refusing upstreams")
	}
	for _, addr := range []string{ready, unready} {
		if got := testutil.ToFloat64(px.m.connectionErrors.WithLabelValues(addr)); got != 1 {
			t.Errorf("connection_errors_total{upstream=%s}: got %v; want 1", addr, got)
		}
	}
}

// waitThen returns a dial step that waits d, or until ctx is done.
func waitThen(d time.Duration) func(context.Context) error {
	return func(ctx context.Context) error {
		if !await(ctx, d, nil) {
			return ctx.Err()
		}
		return nil
	}
}

// outOfDescriptors is a dial step that fails as socket(2) does when the
// process has no descriptor left.
func outOfDescriptors(context.Context) error {
	return &net.OpError{Op: "dial", Err: os.NewSyscallError("socket", errEMFILE())}
}

// hang is a dial step that hangs until ctx is done, like a black hole.
func hang(ctx context.Context) error {
	<-ctx.Done()
	return ctx.Err()
}

// TestServeBacksOffFailingAccepts: the accept loop waits between failing
// accepts, doubling from acceptBackoffMin, and accepts a waiting client as
// soon as Accept works again.
func TestServeBacksOffFailingAccepts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log := slog.New(slog.DiscardHandler)
		m := newMetrics(prometheus.NewRegistry())
		pl := newPool(log, m, defaultTestPool, newFakeChecks().check, randomSelector{})
		defer pl.close()
		px := newProxy(log, m, pl, time.Second, 16)
		ln := &failingListener{pipeListener: newPipeListener()}
		ln.failures.Store(5)
		ctx, cancel := context.WithCancel(t.Context())
		start := time.Now()
		done := make(chan struct{})
		go func() { defer close(done); px.serve(ctx, ln) }()

		client := ln.dial()
		defer client.Close()
		if got, want := time.Since(start), 155*time.Millisecond; got != want {
			t.Errorf("client accepted after %v of backoff; want %v (5+10+20+40+80 ms)", got, want)
		}
		synctest.Wait() // serve has gone on from the accept
		if got := px.acceptStalledFor(); got != 0 {
			t.Errorf("accept stalled for %v after it worked again; want 0", got)
		}
		cancel()
		<-done
		if err := px.shutdown(); err != nil {
			t.Error(err)
		}
	})
}

func TestMaxConnections(t *testing.T) {
	tests := []struct {
		nofile, memory uint64
		want           int
		by             string
	}{
		{1 << 20, 0, (1<<20 - fdReserve) / fdsPerConn, limitByFiles},             // no memory limit
		{1 << 20, 128 << 20, (128<<20 - memReserve) / memPerConn, limitByMemory}, // the chart's 128Mi
		{1024, 128 << 20, (1024 - fdReserve) / fdsPerConn, limitByFiles},
		{1 << 20, 32 << 20, 256, limitByMemory}, // a 32Mi limit
		{1 << 20, memReserve, fewConnections, limitByMemory},
		{1 << 20, 1 << 20, fewConnections, limitByMemory},
		{1 << 20, 1 << 40, (1<<20 - fdReserve) / fdsPerConn, limitByFiles},
	}
	for _, tt := range tests {
		if got, by := maxConnections(tt.nofile, tt.memory); got != tt.want || by != tt.by {
			t.Errorf("maxConnections(%d, %d): got %d by %s; want %d by %s", tt.nofile, tt.memory, got, by, tt.want, tt.by)
		}
	}
}

// TestConnectionLimitIsLogged: being at the connection limit is logged with
// the limit at once, and then at most once a minute, so connections coming
// and going at the limit do not flood the log.
func TestConnectionLimitIsLogged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &syncBuffer{}
		px := newProxy(slog.New(slog.NewTextHandler(logs, nil)), newMetrics(prometheus.NewRegistry()), nil, time.Second, 1)
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
