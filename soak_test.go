package main

// The soak test: thousands of short connections and hundreds of long-lived
// ones through an in-process proxy while the upstream list churns, upstreams
// flap and readiness flips. At the end every byte must have arrived intact,
// the counters must agree with what the clients saw, and nothing may be left
// behind: connections, goroutines, descriptors, heap.
//
//	go test -run '^TestSoak$' -soak 10m -timeout 15m .

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

var soakFor = flag.Duration("soak", 0, "how long TestSoak runs (0: 20s, some 50 faults); -short skips it")

func testRaceEnabled() bool {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range info.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

const (
	soakUpstreams  = 4 // upstream 0 is the anchor: never faulted
	soakLongLived  = 200
	soakShortUsers = 12
	// soakIOTimeout bounds every client read and write. A proxied
	// connection that stalls this long has lost data; on a loaded CI
	// machine under -race, an echo takes milliseconds.
	soakIOTimeout = 15 * time.Second
	// soakMargin is how long a fault's effects may outlast it: a check
	// interval and timeout to notice the repair, the drain timeout of an
	// eviction armed just before, and slack for a slow machine.
	soakMargin = 2 * time.Second
)

// soakPoolConfig makes health checks, drains and evictions happen many
// times a second, so the default 20 s covers hundreds of state changes.
var soakPoolConfig = poolConfig{
	interval:     200 * time.Millisecond,
	timeout:      150 * time.Millisecond,
	drainTimeout: 300 * time.Millisecond,
	quickRecheck: 50 * time.Millisecond,
	sweep:        true,
	readyz:       true,
}

// soakUpstream is an echo server that first sends one byte naming itself,
// so a client knows where the proxy sent it. It can go down (listener and
// connections closed, half of them with a reset) and come back on the same
// port.
type soakUpstream struct {
	id   byte
	addr string

	mu    sync.Mutex
	ln    net.Listener // nil while down
	conns map[net.Conn]bool
	wg    sync.WaitGroup // accept loop and handlers
}

// soakPort returns a free loopback port below the ephemeral range, so no
// outgoing connection takes it while its upstream is down.
func soakPort(t *testing.T) string {
	t.Helper()
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				low = n
			}
		}
	}
	for range 100 {
		port := 10000 + rand.IntN(max(low-10000, 1000))
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if ln, err := net.Listen("tcp", addr); err == nil {
			_ = ln.Close()
			return addr
		}
	}
	t.Fatal("no free port below the ephemeral range")
	return ""
}

func startSoakUpstream(t *testing.T, id byte) *soakUpstream {
	t.Helper()
	u := &soakUpstream{id: id, addr: soakPort(t), conns: map[net.Conn]bool{}}
	if err := u.up(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.down(false) })
	return u
}

// up listens again on the upstream's port, retrying briefly.
func (u *soakUpstream) up() error {
	var err error
	for range 100 {
		var ln net.Listener
		if ln, err = net.Listen("tcp", u.addr); err == nil {
			u.mu.Lock()
			u.ln = ln
			u.mu.Unlock()
			u.wg.Go(func() { u.acceptLoop(ln) })
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("upstream %d: listen again on %s: %w", u.id, u.addr, err)
}

func (u *soakUpstream) acceptLoop(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		u.mu.Lock()
		if u.ln != ln { // went down between Accept and here
			u.mu.Unlock()
			_ = c.Close()
			continue
		}
		u.conns[c] = true
		u.mu.Unlock()
		u.wg.Go(func() { u.serve(c) })
	}
}

// serve greets and echoes; health checks reset the connection at once,
// which ends it too.
func (u *soakUpstream) serve(c net.Conn) {
	defer func() {
		u.mu.Lock()
		delete(u.conns, c)
		u.mu.Unlock()
		_ = c.Close()
	}()
	if _, err := c.Write([]byte{u.id}); err != nil {
		return
	}
	echo(c)
}

// down closes the listener and every connection, half of them with a
// reset when reset is set, and waits for the handlers to end.
func (u *soakUpstream) down(reset bool) {
	u.mu.Lock()
	if u.ln != nil {
		_ = u.ln.Close()
		u.ln = nil
	}
	i := 0
	for c := range u.conns {
		if reset && i%2 == 0 {
			_ = c.(*net.TCPConn).SetLinger(0)
		}
		_ = c.Close()
		i++
	}
	u.mu.Unlock()
	u.wg.Wait()
}

// soakChecks is the pool's check: a real TCP connect, then a readiness
// result the test sets, standing in for the TLS /readyz probe.
type soakChecks struct {
	mu      sync.Mutex
	unready map[string]bool
}

func (c *soakChecks) check(ctx context.Context, addr string) checkResult {
	res := tcpCheck(ctx, addr)
	if res.err != nil {
		return res
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	res.probed = true
	if c.unready[addr] {
		res.notReady = errNotReady
	}
	return res
}

func (c *soakChecks) setUnready(addr string, unready bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.unready[addr] = unready
}

// soakWindow is when a fault could break connections of one upstream.
type soakWindow struct {
	upstream byte
	from, to time.Time // to is zero while the fault lasts
}

// soakFaults records every fault, so a broken connection can be excused
// only when a fault could have broken it.
type soakFaults struct {
	mu      sync.Mutex
	windows []*soakWindow
	counts  map[string]int
}

func (f *soakFaults) open(upstream byte, kind string) *soakWindow {
	f.mu.Lock()
	defer f.mu.Unlock()
	w := &soakWindow{upstream: upstream, from: time.Now()}
	f.windows = append(f.windows, w)
	f.counts[kind]++
	return w
}

func (f *soakFaults) close(w *soakWindow) {
	f.mu.Lock()
	defer f.mu.Unlock()
	w.to = time.Now().Add(soakMargin)
}

// excused reports whether a fault of upstream (any upstream if anyUpstream)
// overlapped [from, to].
func (f *soakFaults) excused(upstream byte, anyUpstream bool, from, to time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, w := range f.windows {
		if !anyUpstream && w.upstream != upstream {
			continue
		}
		if w.from.Before(to) && (w.to.IsZero() || w.to.After(from)) {
			return true
		}
	}
	return false
}

// soakStats are the clients' figures.
type soakStats struct {
	greeted        atomic.Int64 // connections that reached an upstream (hello received)
	shortOK        atomic.Int64
	longOK         atomic.Int64 // long-lived connections closed cleanly with matching checksums
	longStarted    atomic.Int64
	brokenExcused  atomic.Int64 // broken while a fault of their upstream was on
	preHelloBroken atomic.Int64 // closed before the upstream greeted, excused
	bytesVerified  atomic.Int64 // echoed back and compared
	perUpstream    [soakUpstreams]atomic.Int64
}

// soakRig is the proxy under test and everything the clients need.
type soakRig struct {
	t      *testing.T
	addr   string
	ups    []*soakUpstream
	pool   *pool
	m      *metrics
	checks *soakChecks
	faults *soakFaults
	stats  soakStats

	// listMu guards removed and orders pool.update calls.
	listMu  sync.Mutex
	removed map[int]bool
}

// failConn reports a connection failure unless a fault excuses it.
func (r *soakRig) failConn(kind string, upstream int, from time.Time, err error) {
	to := time.Now()
	if upstream < 0 {
		if r.faults.excused(0, true, from, to) {
			r.stats.preHelloBroken.Add(1)
			return
		}
		r.t.Errorf("%s connection closed before any upstream greeted it, with no fault on: %v", kind, err)
		return
	}
	if r.faults.excused(byte(upstream), false, from, to) {
		r.stats.brokenExcused.Add(1)
		return
	}
	r.t.Errorf("%s connection to upstream %d (%s) broke with no fault on it: %v", kind, upstream, r.ups[upstream].addr, err)
}

// dial connects through the proxy and reads the upstream's greeting.
func (r *soakRig) dial() (*net.TCPConn, int, error) {
	c, err := net.DialTimeout("tcp", r.addr, soakIOTimeout)
	if err != nil {
		return nil, -1, fmt.Errorf("dial proxy: %w", err)
	}
	tc := c.(*net.TCPConn)
	_ = tc.SetDeadline(time.Now().Add(soakIOTimeout))
	var hello [1]byte
	if _, err := io.ReadFull(tc, hello[:]); err != nil {
		_ = tc.Close()
		return nil, -1, fmt.Errorf("read greeting: %w", err)
	}
	if int(hello[0]) >= len(r.ups) {
		_ = tc.Close()
		return nil, -1, fmt.Errorf("greeting from unknown upstream %d", hello[0])
	}
	r.stats.greeted.Add(1)
	r.stats.perUpstream[hello[0]].Add(1)
	return tc, int(hello[0]), nil
}

// shortClient runs one connection after another until ctx is done: greet,
// send up to 16 KiB, half-close, read the echo to EOF and compare.
func (r *soakRig) shortClient(ctx context.Context, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 1))
	buf := make([]byte, 16<<10)
	for ctx.Err() == nil {
		start := time.Now()
		c, up, err := r.dial()
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || soakIsReset(err) {
				r.failConn("short", -1, start, err)
			} else {
				r.t.Errorf("short connection: %v", err)
			}
			continue
		}
		msg := buf[:1+rng.IntN(len(buf))]
		for i := range msg {
			msg[i] = byte(rng.Uint32())
		}
		got, err := shortExchange(c, msg)
		_ = c.Close()
		switch {
		case err == nil && bytes.Equal(got, msg):
			r.stats.shortOK.Add(1)
			r.stats.bytesVerified.Add(int64(len(msg)))
		case !bytes.HasPrefix(msg, got):
			// Never excused: a fault may cut a connection, not alter it.
			r.t.Errorf("short connection to upstream %d: %v (%d bytes sent, %d back)", up, errSoakCorrupt, len(msg), len(got))
		default: // cut short, by an error or an early end
			if err == nil {
				err = fmt.Errorf("echo ended after %d of %d bytes", len(got), len(msg))
			}
			r.failConn("short", up, start, err)
		}
	}
}

func shortExchange(c *net.TCPConn, msg []byte) ([]byte, error) {
	if _, err := c.Write(msg); err != nil {
		return nil, err
	}
	if err := c.CloseWrite(); err != nil {
		return nil, err
	}
	return io.ReadAll(c)
}

// soakIsReset reports a connection torn down by the other side.
func soakIsReset(err error) bool {
	return errors.Is(err, io.ErrUnexpectedEOF) || strings.Contains(err.Error(), "connection reset") ||
		strings.Contains(err.Error(), "broken pipe")
}

// longClient keeps one connection open, sending a chunk now and then and
// checking its echo, until ctx is done; then it closes cleanly and compares
// the checksums of everything sent and received. A connection that breaks
// is replaced.
func (r *soakRig) longClient(ctx context.Context, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 2))
	for ctx.Err() == nil {
		start := time.Now()
		c, up, err := r.dial()
		if err != nil {
			if errors.Is(err, io.EOF) || soakIsReset(err) {
				r.failConn("long-lived", -1, start, err)
			} else {
				r.t.Errorf("long-lived connection: %v", err)
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		r.stats.longStarted.Add(1)
		err = r.longSession(ctx, c, rng)
		_ = c.Close()
		if err != nil {
			r.failConn("long-lived", up, start, err)
			continue
		}
		r.stats.longOK.Add(1)
	}
}

// errSoakCorrupt marks an echo that differs from what was sent.
var errSoakCorrupt = errors.New("echo differs from what was sent")

func (r *soakRig) longSession(ctx context.Context, c *net.TCPConn, rng *rand.Rand) error {
	sent, received := sha256.New(), sha256.New()
	var sentN, receivedN int64
	chunk := make([]byte, 4<<10)
	back := make([]byte, len(chunk))
	tick := time.NewTimer(0)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return r.longClose(c, sent, received, sentN, receivedN)
		case <-tick.C:
		}
		msg := chunk[:1+rng.IntN(len(chunk))]
		for i := range msg {
			msg[i] = byte(rng.Uint32())
		}
		_ = c.SetDeadline(time.Now().Add(soakIOTimeout))
		if _, err := c.Write(msg); err != nil {
			return err
		}
		sent.Write(msg)
		sentN += int64(len(msg))
		got := back[:len(msg)]
		n, err := io.ReadFull(c, got)
		if !bytes.Equal(got[:n], msg[:n]) {
			r.t.Errorf("long-lived connection: %v within the %d bytes after the first %d", errSoakCorrupt, len(msg), sentN-int64(len(msg)))
			return nil // reported; not a break to excuse
		}
		if err != nil {
			return err
		}
		received.Write(got)
		receivedN += int64(len(got))
		r.stats.bytesVerified.Add(int64(len(msg)))
		tick.Reset(time.Duration(100+rng.IntN(500)) * time.Millisecond)
	}
}

// longClose half-closes, reads what is left to EOF and compares checksums.
func (r *soakRig) longClose(c *net.TCPConn, sent, received hash.Hash, sentN, receivedN int64) error {
	_ = c.SetDeadline(time.Now().Add(soakIOTimeout))
	if err := c.CloseWrite(); err != nil {
		return err
	}
	// Every chunk was echoed before the next was sent: nothing is in
	// flight, and anything after the half-close is extra.
	rest, err := io.Copy(received, c)
	if err != nil {
		return err
	}
	receivedN += rest
	if receivedN != sentN || !bytes.Equal(sent.Sum(nil), received.Sum(nil)) {
		r.t.Errorf("long-lived connection: received %d bytes, sent %d; checksums equal %v; want all bytes intact",
			receivedN, sentN, bytes.Equal(sent.Sum(nil), received.Sum(nil)))
	}
	return nil
}

// listed returns the endpoints not removed; listMu must be held.
func (r *soakRig) listedLocked() []string {
	var addrs []string
	for i, u := range r.ups {
		if !r.removed[i] {
			addrs = append(addrs, u.addr)
		}
	}
	return addrs
}

func (r *soakRig) setRemoved(i int, removed bool) {
	r.listMu.Lock()
	defer r.listMu.Unlock()
	r.removed[i] = removed
	r.pool.update(r.listedLocked())
}

// injectFaults starts a fault on a random non-anchor upstream that has none
// every 100-400 ms until ctx is done, and waits for the faults it started.
func (r *soakRig) injectFaults(ctx context.Context) {
	var busy [soakUpstreams]atomic.Bool
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(100+rand.IntN(300)) * time.Millisecond):
		}
		i := 1 + rand.IntN(soakUpstreams-1)
		if !busy[i].CompareAndSwap(false, true) {
			continue
		}
		kind := rand.IntN(3)
		wg.Go(func() {
			defer busy[i].Store(false)
			r.fault(i, kind)
		})
	}
}

func soakPause(lo, hi time.Duration) {
	time.Sleep(lo + rand.N(hi-lo))
}

// fault runs one fault on upstream i to its end.
func (r *soakRig) fault(i, kind int) {
	u := r.ups[i]
	switch kind {
	case 0:
		// Flap: the process dies, connections reset or close, and comes
		// back on the same port.
		w := r.faults.open(u.id, "flap")
		defer r.faults.close(w)
		u.down(true)
		soakPause(20*time.Millisecond, 400*time.Millisecond)
		if err := u.up(); err != nil {
			r.t.Error(err)
		}
	case 1:
		// Churn: removed from the list, re-added within the drain timeout
		// (the drain is aborted) or after it (a fresh upstream).
		w := r.faults.open(u.id, "remove")
		defer r.faults.close(w)
		r.setRemoved(i, true)
		d := rand.N(2 * soakPoolConfig.drainTimeout)
		if d < soakPoolConfig.drainTimeout {
			r.faults.mu.Lock()
			r.faults.counts["re-add within drain"]++
			r.faults.mu.Unlock()
		}
		time.Sleep(d)
		r.setRemoved(i, false)
	case 2:
		// Readiness: /readyz fails for a while, so the upstream's
		// connections are closed after the drain timeout.
		w := r.faults.open(u.id, "unready")
		defer r.faults.close(w)
		r.checks.setUnready(u.addr, true)
		soakPause(100*time.Millisecond, time.Second)
		r.checks.setUnready(u.addr, false)
	}
}

// allServing reports whether the pool holds every upstream, each healthy,
// ready and not draining.
func (r *soakRig) allServing() bool {
	r.pool.mu.Lock()
	defer r.pool.mu.Unlock()
	n := 0
	for _, u := range r.pool.upstreams {
		if u.h.state == upReady || u.h.state == upAwaitingProbe {
			n++
		}
	}
	return n == soakUpstreams && len(r.pool.upstreams) == soakUpstreams
}

func soakAttached(p *pool) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, u := range p.upstreams {
		n += len(u.conns)
	}
	return n
}

func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("soak test; skipped with -short")
	}
	duration := cmp.Or(*soakFor, 20*time.Second)
	gStart, fdStart := quietCounts(t)
	// The proxy, the pool and the upstreams are the subtest's, so its
	// cleanups shut them all down before the last leak check.
	if !t.Run("load", func(t *testing.T) { soakLoad(t, duration) }) {
		return
	}
	gEnd, fdEnd := settleCounts(t, gStart, fdStart, 0)
	if gEnd > gStart || fdEnd > fdStart {
		t.Errorf("after shutdown: goroutines %d, descriptors %d; want at most %d and %d, as before the test",
			gEnd, fdEnd, gStart, fdStart)
	}
}

func soakLoad(t *testing.T, duration time.Duration) {
	r := &soakRig{t: t, checks: &soakChecks{unready: map[string]bool{}},
		faults: &soakFaults{counts: map[string]int{}}, removed: map[int]bool{}}
	for i := range soakUpstreams {
		r.ups = append(r.ups, startSoakUpstream(t, byte(i)))
	}
	log := slog.New(slog.DiscardHandler)
	r.m = newMetrics(prometheus.NewRegistry())
	r.pool = newPool(log, r.m, soakPoolConfig, r.checks.check, newLatencySelector(r.m))
	r.setRemoved(0, false)
	r.addr = serveTestProxy(t, newProxy(log, r.m, r.pool, 2*time.Second, 4096), r.pool)

	// Warm up: every upstream checked and ready, twenty connections
	// through, so lazily built state is part of the running baseline.
	waitFor(t, "every upstream to be ready", r.allServing)
	for range 20 {
		c, _, err := r.dial()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := shortExchange(c, []byte("warm")); err != nil {
			t.Fatal(err)
		}
		_ = c.Close()
	}
	waitFor(t, "warm-up connections to end", func() bool { return testutil.ToFloat64(r.m.connectionsActive) == 0 })
	warmGreeted := r.stats.greeted.Load()
	warmTotal := testutil.ToFloat64(r.m.connectionsTotal)
	r.stats.greeted.Store(0)
	for i := range r.stats.perUpstream {
		r.stats.perUpstream[i].Store(0)
	}
	gIdle, fdIdle := quietCounts(t)
	heapIdle := liveHeapBytes()

	start := time.Now()
	loadCtx, stopLoad := context.WithTimeout(context.Background(), duration)
	defer stopLoad()
	var clients sync.WaitGroup
	for i := range soakShortUsers {
		clients.Go(func() { r.shortClient(loadCtx, uint64(i)) })
	}
	for i := range soakLongLived {
		clients.Go(func() { r.longClient(loadCtx, uint64(i)) })
	}
	// Faults stop early enough for their effects (evictions, drains) to
	// end before the clients close and compare.
	faultCtx, stopFaults := context.WithTimeout(context.Background(), max(duration-5*time.Second, duration/2))
	defer stopFaults()
	r.injectFaults(faultCtx)
	// Every fault has ended: the last seconds run on a quiet pool.
	clients.Wait()
	elapsed := time.Since(start)

	waitFor(t, "connections_active to return to 0", func() bool { return testutil.ToFloat64(r.m.connectionsActive) == 0 })
	waitFor(t, "the pool to hold no connection", func() bool { return soakAttached(r.pool) == 0 })
	waitFor(t, "every upstream back and none draining", r.allServing)

	greeted := r.stats.greeted.Load()
	total := testutil.ToFloat64(r.m.connectionsTotal) - warmTotal
	preHello := r.stats.preHelloBroken.Load()
	// Every greeting came through a counted connection; a counted
	// connection whose upstream died before greeting is a pre-greeting
	// break the client saw.
	if total < float64(greeted) || total > float64(greeted+preHello) {
		t.Errorf("connections_total: got %v; want between %d greeted connections and %d (with %d closed before the greeting)",
			total, greeted, greeted+preHello, preHello)
	}
	if got := testutil.ToFloat64(r.m.upstreamsTotal); got != soakUpstreams {
		t.Errorf("upstreams_total: got %v; want %d", got, soakUpstreams)
	}
	if greeted < 1000 || r.stats.longStarted.Load() < soakLongLived {
		t.Errorf("load: %d connections (%d long-lived); want thousands and at least %d long-lived",
			greeted, r.stats.longStarted.Load(), soakLongLived)
	}

	// Leaks while running: the idle proxy is back where it was after the
	// warm-up. Health checks come and go meanwhile: a few of slack.
	const runningSlack = 4
	g, fd := settleCounts(t, gIdle, fdIdle, runningSlack)
	if g > gIdle+runningSlack || fd > fdIdle+runningSlack {
		t.Errorf("idle proxy after the load: goroutines %d, descriptors %d; want at most %d and %d (the idle baseline and %d)",
			g, fd, gIdle+runningSlack, fdIdle+runningSlack, runningSlack)
	}
	heapAfter := liveHeapBytes()
	if heapAfter > heapIdle+16<<20 {
		t.Errorf("live heap after the load: got %d bytes; want at most %d (idle baseline + 16 MiB)", heapAfter, heapIdle+16<<20)
	}

	var spread []int64
	for i := range r.stats.perUpstream {
		spread = append(spread, r.stats.perUpstream[i].Load())
	}
	t.Logf("soak %v (race %v): %d connections (%d short intact, %d long-lived of which %d closed cleanly with matching checksums), per upstream %v",
		elapsed.Round(time.Second), testRaceEnabled(), greeted, r.stats.shortOK.Load(), r.stats.longStarted.Load(), r.stats.longOK.Load(), spread)
	t.Logf("soak: %d bytes echoed and verified; faults %v; %d connections broken by a fault on their upstream, %d before the greeting",
		r.stats.bytesVerified.Load(), r.faults.counts, r.stats.brokenExcused.Load(), preHello)
	t.Logf("soak: connections_total %v for %d greeted; warm-up %d; idle baseline goroutines %d fds %d heap %d KiB; after load goroutines %d fds %d heap %d KiB",
		total, greeted, warmGreeted, gIdle, fdIdle, heapIdle>>10, g, fd, heapAfter>>10)
	if slices.Contains(spread, 0) {
		t.Errorf("per-upstream connections %v; want every upstream used", spread)
	}
}
