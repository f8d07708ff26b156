//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// privateNetnsEnv marks the copy of the test binary that runs in a private
// network namespace.
const privateNetnsEnv = "EP_TEST_PRIVATE_NETNS"

// inPrivateNetns runs the current test or benchmark again, in a copy of
// the test binary under `unshare -n`: a network namespace of its own with
// only a loopback link, where nftables rules can black-hole an upstream
// without touching the host. In that copy it brings loopback up and
// returns true; in the caller it runs the copy, passes its output on, fails
// unless the copy ran tb and passed, and returns false.
func inPrivateNetns(tb testing.TB) bool {
	tb.Helper()
	if os.Getenv(privateNetnsEnv) == "1" {
		runCmd(tb, "ip", "link", "set", "lo", "up")
		return true
	}
	if os.Geteuid() != 0 {
		tb.Skip("needs root for a private network namespace")
	}
	for _, tool := range []string{"unshare", "ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			tb.Skipf("needs %s (apt-get install iproute2 nftables util-linux): %v", tool, err)
		}
	}
	only := "^" + regexp.QuoteMeta(tb.Name()) + "$"
	args := []string{"-test.run=" + only, "-test.v"}
	passed := "--- PASS: " + tb.Name() + " "
	if _, ok := tb.(*testing.B); ok {
		args = []string{"-test.run=^$", "-test.bench=" + only, "-test.benchtime=1x"}
		passed = "\n" + tb.Name()
	}
	ctx, cancel := context.WithTimeout(tb.Context(), netnsTimeout)
	defer cancel()
	args = append([]string{"-n", os.Args[0], "-test.timeout=" + netnsTimeout.String()}, args...)
	cmd := exec.CommandContext(ctx, "unshare", args...)
	cmd.Env = append(os.Environ(), privateNetnsEnv+"=1")
	out, err := cmd.CombinedOutput()
	fmt.Print(string(out))
	if err != nil {
		tb.Fatalf("run in a private network namespace: %v", err)
	}
	if !strings.Contains(string(out), passed) {
		tb.Fatalf("the copy in a private network namespace did not run %s", tb.Name())
	}
	return false
}

// netnsTimeout bounds a test's copy in a private network namespace.
const netnsTimeout = 5 * time.Minute

func runCmd(tb testing.TB, name string, args ...string) {
	tb.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		tb.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// dropPortAt makes every packet to or from port vanish, like a node whose
// cable was cut, and returns the function that restores it. The packets
// are dropped at the netfilter hook given: "output" as they are sent,
// "input" as they arrive. A drop at output is a local error the sender
// sees; one at input is not.
func dropPortAt(tb testing.TB, hook string, port int) (restore func()) {
	tb.Helper()
	p := strconv.Itoa(port)
	runCmd(tb, "nft", "add", "table", "inet", "eptest")
	runCmd(tb, "nft", "add", "chain", "inet", "eptest", "c", "{ type filter hook "+hook+" priority 0; }")
	runCmd(tb, "nft", "add", "rule", "inet", "eptest", "c", "tcp", "dport", p, "drop")
	runCmd(tb, "nft", "add", "rule", "inet", "eptest", "c", "tcp", "sport", p, "drop")
	return func() { runCmd(tb, "nft", "delete", "table", "inet", "eptest") }
}

// mechanisms turns the black-hole mechanisms of the data path on and off.
type mechanisms struct {
	hedge, quick, sweep bool
}

func (m mechanisms) String() string {
	on := map[bool]string{true: "on", false: "off"}
	return fmt.Sprintf("hedge %s, quick check %s, sweep %s", on[m.hedge], on[m.quick], on[m.sweep])
}

// holeBench is a proxy in front of three echo upstreams with the issue's
// settings: --health-interval 5s --health-timeout 2s, which is also the
// dial timeout.
type holeBench struct {
	px  *testProxy
	ups []*testUpstream
}

func newHoleBench(tb testing.TB, mech mechanisms) *holeBench {
	tb.Helper()
	cfg := poolConfig{interval: 5 * time.Second, timeout: 2 * time.Second, drainTimeout: 10 * time.Second, sweep: mech.sweep}
	if mech.quick {
		cfg.quickRecheck = quickRecheck
	}
	hb := &holeBench{px: startProxyCheck(tb, cfg, tcpCheck, nil)}
	hb.px.hedge = mech.hedge
	for range 3 {
		hb.ups = append(hb.ups, startUpstream(tb, echo))
	}
	return hb
}

// holdConns opens n idle connections through the proxy while only the
// victim is listed, so all of them land on it; then lists all three.
func (hb *holeBench) holdConns(tb testing.TB, n int) []net.Conn {
	tb.Helper()
	hb.px.pool.update([]string{hb.ups[0].addr})
	var conns []net.Conn
	for range n {
		c, err := net.DialTimeout("tcp", hb.px.addr, 5*time.Second)
		if err != nil {
			tb.Fatal(err)
		}
		if err := roundTrip(c, []byte("hold")); err != nil {
			tb.Fatal(err)
		}
		conns = append(conns, c)
	}
	hb.px.pool.update([]string{hb.ups[0].addr, hb.ups[1].addr, hb.ups[2].addr})
	time.Sleep(100 * time.Millisecond) // first checks of the two new upstreams
	return conns
}

// watchClose reports, for each conn, how long after start the client saw it
// closed, or -1 if it was still open at deadline.
func watchClose(conns []net.Conn, start, deadline time.Time) []time.Duration {
	out := make([]time.Duration, len(conns))
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() {
			_ = c.SetReadDeadline(deadline)
			if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
				out[i] = -1
				return
			}
			out[i] = time.Since(start)
		})
	}
	wg.Wait()
	return out
}

type phase struct {
	name   string
	ttfb   []time.Duration
	failed int
}

// stream opens a connection every 20 ms for d, each sending a byte and
// waiting for its echo, and records the time to first byte.
func (hb *holeBench) stream(name string, d time.Duration) phase {
	ph := phase{name: name}
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		start := time.Now()
		c, err := net.DialTimeout("tcp", hb.px.addr, 5*time.Second)
		if err == nil {
			err = roundTrip(c, []byte{1})
			_ = c.Close()
		}
		if err != nil {
			ph.failed++
		} else {
			ph.ttfb = append(ph.ttfb, time.Since(start))
		}
		time.Sleep(20 * time.Millisecond)
	}
	return ph
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

type blackHoleRun struct {
	phases     []phase
	closed     []time.Duration
	deadClosed float64 // extractedprism_dead_connections_closed_total at the end
}

// runBlackHole holds conns on the victim, streams new connections before,
// during and after the victim turns into a black hole, and measures.
func runBlackHole(tb testing.TB, mech mechanisms, held int, during time.Duration) blackHoleRun {
	hb := newHoleBench(tb, mech)
	conns := hb.holdConns(tb, held)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	var r blackHoleRun
	r.phases = append(r.phases, hb.stream("before", time.Second))
	restore := dropPortAt(tb, "output", hb.ups[0].ln.Addr().(*net.TCPAddr).Port)
	start := time.Now()
	var wg sync.WaitGroup
	wg.Go(func() { r.closed = watchClose(conns, start, start.Add(during)) })
	r.phases = append(r.phases, hb.stream("during", during))
	wg.Wait()
	restore()
	r.phases = append(r.phases, hb.stream("after", 2*time.Second))
	r.deadClosed = testutil.ToFloat64(hb.px.m.deadConnsClosed)
	return r
}

func TestSweepClosesConnectionsToVanishedPeer(t *testing.T) {
	t.Parallel() // waits on kernel timers, in a namespace of its own
	if !inPrivateNetns(t) {
		return
	}
	r := runBlackHole(t, mechanisms{hedge: true, quick: true, sweep: true}, 5, 10*time.Second)
	for i, d := range r.closed {
		if d < 0 || d > 6*time.Second {
			t.Errorf("long-lived connection %d closed after %v; want within 6 s of the black hole", i, d)
		}
	}
	// Each held connection ends with the kernel's ETIMEDOUT on its upstream
	// socket, which the data path counts.
	if r.deadClosed < float64(len(r.closed)) {
		t.Errorf("dead connections counted: %v; want at least the %d held ones", r.deadClosed, len(r.closed))
	}
	for _, ph := range r.phases {
		if ph.failed != 0 {
			t.Errorf("%s: %d new connections failed; want 0", ph.name, ph.failed)
		}
		if p99 := percentile(ph.ttfb, 0.99); p99 > time.Second {
			t.Errorf("%s: p99 time to first byte %v; want under 1 s", ph.name, p99)
		}
	}
}

// BenchmarkBlackHole prints, for each combination of the three mechanisms,
// the time to first byte of a stream of new connections before, during and
// after one of three upstreams becomes a black hole, and how long the
// connections held on it take to close. Run as root:
//
//	go test -run '^$' -bench BlackHole -benchtime 1x
func BenchmarkBlackHole(b *testing.B) {
	if !inPrivateNetns(b) {
		return
	}
	runs := []mechanisms{
		{true, true, true},
		{false, true, true},
		{true, false, true},
		{true, true, false},
		{false, false, false},
	}
	var sb strings.Builder
	fmt.Fprintln(&sb, "\nBlack hole: 3 upstreams, --health-interval 5s --health-timeout 2s; 10 idle connections held on the victim; a new connection every 20 ms.")
	fmt.Fprintln(&sb, "\n| mechanisms | phase | new conns | failed | p50 TTFB | p99 TTFB | max TTFB | held conns closed (max) |")
	fmt.Fprintln(&sb, "|---|---|---|---|---|---|---|---|")
	for range b.N {
		for _, mech := range runs {
			r := runBlackHole(b, mech, 10, 12*time.Second)
			for _, ph := range r.phases {
				closed := ""
				if ph.name == "during" {
					closed = closedSummary(r.closed)
				}
				fmt.Fprintf(&sb, "| %s | %s | %d | %d | %v | %v | %v | %s |\n", mech, ph.name, len(ph.ttfb)+ph.failed,
					ph.failed, round(percentile(ph.ttfb, 0.5)), round(percentile(ph.ttfb, 0.99)), round(percentile(ph.ttfb, 1)), closed)
			}
		}
	}
	_, _ = io.WriteString(os.Stdout, sb.String())
}

func closedSummary(closed []time.Duration) string {
	n, worst := 0, time.Duration(0)
	for _, d := range closed {
		if d >= 0 {
			n++
			worst = max(worst, d)
		}
	}
	if n < len(closed) {
		return fmt.Sprintf("%d/%d within 12 s", n, len(closed))
	}
	return fmt.Sprintf("%d/%d, %v", n, len(closed), round(worst))
}

func round(d time.Duration) time.Duration {
	if d > time.Second {
		return d.Round(10 * time.Millisecond)
	}
	return d.Round(10 * time.Microsecond)
}

// TestSweepEndsBackedOffRetransmission covers the connection the sweep's
// socket settings cannot end in time: its data was already unacknowledged,
// and its retransmission timer backed off, when the upstream became
// suspect. The kernel consults the new user timeout only when that timer
// next fires, at backoff 6 about 12.8 s later; the sweep's own look at
// TCP_INFO must end it within about 3.5 s.
func TestSweepEndsBackedOffRetransmission(t *testing.T) {
	t.Parallel() // waits on kernel timers, in a namespace of its own
	if !inPrivateNetns(t) {
		return
	}
	sw := newSwept(t)
	// Dropped at input, the retransmissions leave and vanish, and the
	// timer backs off as on a real network. (Dropped at output, each one
	// fails locally and the kernel retries every 500 ms without backing off.)
	restore := dropPortAt(t, "input", sw.up.ln.Addr().(*net.TCPAddr).Port)
	defer restore()
	if _, err := sw.client.Write([]byte("lost")); err != nil {
		t.Fatal(err)
	}
	waitBackoff(t, sw.upConn, 6, 30*time.Second)
	start := time.Now()
	sw.px.pool.reportCheck(sw.u, checkResult{err: errCheck})
	_ = sw.client.SetReadDeadline(start.Add(12 * time.Second))
	_, err := sw.client.Read(make([]byte, 1))
	took := time.Since(start)
	if err == nil || errors.Is(err, os.ErrDeadlineExceeded) || took > 6*time.Second {
		t.Fatalf("connection with backed-off retransmission ended %v after the upstream became suspect (%v); want within 6 s", took.Round(time.Millisecond), err)
	}
	// The kernel would not have ended it before its timer fired again;
	// the sweep's look, stalledAfter into the suspicion, did.
	if took < stalledAfter {
		t.Errorf("connection with backed-off retransmission ended %v after the upstream became suspect; want the sweep's look at %v", took.Round(time.Millisecond), stalledAfter)
	}
	if got := testutil.ToFloat64(sw.px.m.deadConnsClosed); got != 1 {
		t.Errorf("dead connections counted: %v; want 1", got)
	}
}

// waitBackoff waits until c's retransmission timer has backed off at least
// n times.
func waitBackoff(t *testing.T, c net.Conn, n uint8, limit time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(limit); ; time.Sleep(100 * time.Millisecond) {
		ti := tcpInfo(c)
		if ti == nil {
			t.Fatal("no TCP_INFO: not a TCP socket, or closed")
		}
		if ti.Backoff >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("retransmission backoff after %v: %d, unacknowledged %d; want %d", limit, ti.Backoff, ti.Unacked, n)
		}
	}
}

// TestIPv6UpstreamOnIPv4OnlyHost: on a host with IPv6 disabled, a connect
// to an IPv6 upstream fails with EADDRNOTAVAIL, as it does when the host
// is out of ephemeral ports to that upstream. Either way the upstream
// cannot be used from here, so it is the upstream's failure: its check and
// a client's dial count against it and exclude it, and the client is
// served by another upstream at once, not refused as for local exhaustion.
func TestIPv6UpstreamOnIPv4OnlyHost(t *testing.T) {
	if !inPrivateNetns(t) {
		return
	}
	for _, conf := range []string{"all", "default", "lo"} {
		if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+conf+"/disable_ipv6", []byte("1"), 0o600); err != nil {
			t.Fatalf("disable IPv6: %v", err)
		}
	}
	const v6 = "[fd00::5]:6443" // nothing leaves the namespace: it has only loopback
	if res := tcpCheck(t.Context(), v6); !errors.Is(res.err, syscall.EADDRNOTAVAIL) {
		t.Fatalf("check of %s with IPv6 disabled: got %v; want EADDRNOTAVAIL", v6, res.err)
	}

	alive := startUpstream(t, echo)
	var dialled dialLog
	px := startProxyDial(t, poolConfig{}, dialled.wrap, v6, alive.addr)
	px.pool.mu.Lock()
	u := px.pool.upstreams[v6]
	px.pool.mu.Unlock()
	waitFor(t, "the first check of "+v6+" to be reported", func() bool { return checked(px.pool, u) })
	// Picks are random: connect until one has dialled v6 first.
	for i := 0; !slices.Contains(dialled.list(), v6); i++ {
		if i == 50 {
			t.Fatalf("50 connections, none dialled %s: dials %v", v6, dialled.list())
		}
		start := time.Now()
		c := dialProxy(t, px.addr)
		if err := roundTrip(c, []byte("v4")); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		if took := time.Since(start); took > time.Second {
			t.Errorf("connection %d served after %v; want the failed dial given up at once", i, took)
		}
		_ = c.Close()
	}
	if got := testutil.ToFloat64(px.m.connectionErrors.WithLabelValues(v6)); got != 1 {
		t.Errorf("connection_errors_total{upstream=%s}: got %v; want 1", v6, got)
	}
	// The failed check and the failed dial: two failures exclude it.
	if got := testutil.ToFloat64(px.m.healthStatus.WithLabelValues(v6)); got != 0 {
		t.Errorf("health_check_status{upstream=%s}: got %v; want 0", v6, got)
	}
	if got := testutil.ToFloat64(px.m.clientsRefused); got != 0 {
		t.Errorf("clients_refused_total: got %v; want 0", got)
	}
}
