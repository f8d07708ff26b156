package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

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
	px.pool.upstreams[dead].h.lastHealthy = time.Now()
	px.pool.mu.Unlock()
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

// TestProxyRetriesWhenUpstreamStartsDrainingDuringDial: a connection whose
// upstream leaves the endpoint list while it is dialled gets one retry on
// another upstream, as the spec has it, and only one: when the retry's
// upstream leaves the list too, the client is refused, though a third
// upstream is there.
func TestProxyRetriesWhenUpstreamStartsDrainingDuringDial(t *testing.T) {
	for _, tt := range []struct {
		name     string
		draining int // how many dials find their upstream leaving the list
		served   bool
	}{
		{"the retry connects", 1, true},
		{"the retry's upstream leaves too", 2, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ups := []*testUpstream{startUpstream(t, echo), startUpstream(t, echo), startUpstream(t, echo)}
			listed := []string{ups[0].addr, ups[1].addr, ups[2].addr}
			var pl atomic.Pointer[pool] // set before the client connects
			var mu sync.Mutex           // guards listed
			var dialled dialLog
			wrap := func(d dialFunc) dialFunc {
				return dialled.wrap(stepDial(func(_ context.Context, n int, addr string) error {
					if n <= tt.draining { // the endpoint list loses addr while it is dialled
						mu.Lock()
						defer mu.Unlock()
						listed = slices.DeleteFunc(listed, func(a string) bool { return a == addr })
						pl.Load().update(listed)
					}
					return nil
				})(d))
			}
			px := startProxyDial(t, poolConfig{drainTimeout: time.Minute}, wrap, listed...)
			pl.Store(px.pool)
			err := roundTrip(dialProxy(t, px.addr), []byte("retried"))
			if served := err == nil; served != tt.served {
				t.Errorf("client served: got %v (%v); want %v", served, err, tt.served)
			}
			if got := dialled.list(); len(got) != 2 {
				t.Errorf("upstream dials: got %v; want 2 (the drained one, then the one retry)", got)
			}
			if got, want := testutil.ToFloat64(px.m.clientsRefused), 1-boolGauge(tt.served); got != want {
				t.Errorf("clients_refused_total: got %v; want %v", got, want)
			}
		})
	}
}

// TestIsLocalExhaustion: running out of descriptors, buffers or memory is
// this host's failure, wrapped as deep as a dial wraps it; EADDRNOTAVAIL
// and a refused connect are the upstream's.
func TestIsLocalExhaustion(t *testing.T) {
	dialErr := func(errno syscall.Errno) error {
		return fmt.Errorf("dial upstream x: %w", &net.OpError{Op: "dial", Err: os.NewSyscallError("socket", errno)})
	}
	for _, tt := range []struct {
		errno syscall.Errno
		want  bool
	}{
		{syscall.EMFILE, true}, {syscall.ENFILE, true}, {syscall.ENOBUFS, true}, {syscall.ENOMEM, true},
		{syscall.EADDRNOTAVAIL, false}, {syscall.ECONNREFUSED, false},
	} {
		if got := isLocalExhaustion(dialErr(tt.errno)); got != tt.want {
			t.Errorf("isLocalExhaustion(%v): got %v; want %v", dialErr(tt.errno), got, tt.want)
		}
	}
}

// TestDialOutOfDescriptorsRefusesClient: a dial that fails because this
// process is out of descriptors ends the client's dialling, as a dial to
// another upstream would fail the same way. The client is refused and
// counted; neither upstream is blamed: no connection error, no check asked
// for, both still healthy. The next client, descriptors back, is served.
func TestDialOutOfDescriptorsRefusesClient(t *testing.T) {
	a, b := startUpstream(t, echo), startUpstream(t, echo)
	checks := newFakeChecks()
	var exhausted atomic.Bool
	exhausted.Store(true)
	var dialled dialLog
	wrap := func(d dialFunc) dialFunc {
		return dialled.wrap(stepDial(func(ctx context.Context, _ int, _ string) error {
			if exhausted.Load() {
				return outOfDescriptors(ctx)
			}
			return nil
		})(d))
	}
	px := startProxyCheck(t, poolConfig{interval: time.Hour, timeout: time.Second}, checks.check, wrap, a.addr, b.addr)
	waitFor(t, "the first checks", func() bool { return checks.count(a.addr) == 1 && checks.count(b.addr) == 1 })

	wantPeerClosed(t, dialProxy(t, px.addr), 5*time.Second, "with no descriptor for the client's dial")
	if got := dialled.list(); len(got) != 1 {
		t.Errorf("dials: got %v; want one, not retried on another upstream", got)
	}
	if got := testutil.ToFloat64(px.m.clientsRefused); got != 1 {
		t.Errorf("clients_refused_total: got %v; want 1", got)
	}
	for _, addr := range []string{a.addr, b.addr} {
		if got := testutil.ToFloat64(px.m.connectionErrors.WithLabelValues(addr)); got != 0 {
			t.Errorf("connection_errors_total{upstream=%s}: got %v; want 0", addr, got)
		}
		if got := testutil.ToFloat64(px.m.healthStatus.WithLabelValues(addr)); got != 1 {
			t.Errorf("health_check_status{upstream=%s}: got %v; want 1", addr, got)
		}
		if rzSettle(300*time.Millisecond, func() bool { return checks.count(addr) > 1 }) {
			t.Errorf("upstream %s checked again after the dial failed for want of descriptors; want no check", addr)
		}
	}

	exhausted.Store(false)
	if err := roundTrip(dialProxy(t, px.addr), []byte("descriptors back")); err != nil {
		t.Errorf("client after descriptors came back: %v", err)
	}
}

// TestHedgeDelay: four times the slowest connect time of the preferred
// group, within [50 ms, 500 ms]; 500 ms while that group has no sample.
func TestHedgeDelay(t *testing.T) {
	rtt := func(d time.Duration) *upstream { return &upstream{rtt: d, hasRTT: true} }
	for _, tt := range []struct {
		name   string
		groups [][]*upstream
		want   time.Duration
	}{
		{"nothing pickable", nil, 500 * time.Millisecond},
		{"no sample yet", [][]*upstream{{{}, {}}}, 500 * time.Millisecond},
		{"four times the slowest", [][]*upstream{{rtt(10 * time.Millisecond), rtt(30 * time.Millisecond), {}}}, 120 * time.Millisecond},
		{"a near group: the floor", [][]*upstream{{rtt(time.Millisecond)}}, 50 * time.Millisecond},
		{"a far group: the ceiling", [][]*upstream{{rtt(200 * time.Millisecond)}}, 500 * time.Millisecond},
		{"only the preferred group counts", [][]*upstream{{rtt(20 * time.Millisecond)}, {rtt(time.Second)}}, 80 * time.Millisecond},
	} {
		if got := hedgeDelay(tt.groups); got != tt.want {
			t.Errorf("%s: got %v; want %v", tt.name, got, tt.want)
		}
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
	px := startProxyDial(t, poolConfig{}, stepDial(func(ctx context.Context, n int, _ string) error {
		switch n {
		case 1:
			return refusedAfter(300 * time.Millisecond)(ctx)
		case 2:
			return hang(ctx) // a black hole
		}
		return nil
	}), addrs...)
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
// slow dial that wins, which has shown its upstream alive, nor a hedge that
// failed for want of descriptors, which never reached its upstream (and
// leaves the first dial to go on). None of them is a connection error. A
// dial that fails on its own (refused, not called off) just after its hedge
// won is a failure of its upstream like any other: counted, and checked.
func TestCalledOffSlowDialGetsChecked(t *testing.T) {
	tests := []struct {
		name string
		// first and hedge are what the first dial and its hedge do before
		// they dial for real: wait, hang until called off, or fail.
		first, hedge func(context.Context) error
		wantChecked  [2]bool    // the first dial's upstream, the hedge's
		wantErrs     [2]float64 // their connection_errors_total
	}{
		{"slow first dial wins just after its hedge started", waitThen(600 * time.Millisecond), waitThen(600 * time.Millisecond), [2]bool{false, false}, [2]float64{}},
		{"hanging first dial loses to its hedge", hang, waitThen(0), [2]bool{true, false}, [2]float64{}},
		{"hedge out of descriptors while the first dial goes on", waitThen(600 * time.Millisecond), outOfDescriptors, [2]bool{false, false}, [2]float64{}},
		{"first dial refused just after its hedge won", refusedAfter(700 * time.Millisecond), waitThen(0), [2]bool{true, false}, [2]float64{1, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := startUpstream(t, echo), startUpstream(t, echo)
			checks := newFakeChecks()
			// A 125 ms connect time makes the hedge delay 500 ms.
			checks.rtt[a.addr], checks.rtt[b.addr] = 125*time.Millisecond, 125*time.Millisecond
			var dialled dialLog
			wrap := func(d dialFunc) dialFunc {
				return dialled.wrap(stepDial(func(ctx context.Context, n int, _ string) error {
					if n == 1 {
						return tt.first(ctx)
					}
					return tt.hedge(ctx)
				})(d))
			}
			px := startProxyCheck(t, poolConfig{interval: time.Hour, timeout: time.Second}, checks.check, wrap, a.addr, b.addr)
			waitFor(t, "the first checks", func() bool { return checks.count(a.addr) == 1 && checks.count(b.addr) == 1 })
			waitFor(t, "a 500 ms hedge delay", func() bool { return px.pool.snap.Load().hedgeDelay == 500*time.Millisecond })
			if err := roundTrip(dialProxy(t, px.addr), []byte("x")); err != nil {
				t.Fatal(err)
			}
			dialed := dialled.list()
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
				if got := testutil.ToFloat64(px.m.connectionErrors.WithLabelValues(addr)); got != tt.wantErrs[i] {
					t.Errorf("connection_errors_total{upstream=%s} (dial %d): got %v; want %v", addr, i, got, tt.wantErrs[i])
				}
			}
		})
	}
}

// TestLastResortFailureCountedWhileUpstreamsAvailable: in readyz mode an
// unready but healthy upstream is dialled as a last resort once every
// ready one has failed; some upstream was available, so its failure
// counts, as the spec has it. The client, whose every dial failed, is
// refused: closed, counted, and not counted as a connection.
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
	wantPeerClosed(t, dialProxy(t, px.addr), 5*time.Second, "through two refusing upstreams")
	if got := testutil.ToFloat64(px.m.connectionsTotal); got != 0 {
		t.Errorf("connections_total: got %v; want 0", got)
	}
	if got := testutil.ToFloat64(px.m.clientsRefused); got != 1 {
		t.Errorf("clients_refused_total: got %v; want 1", got)
	}
	for _, addr := range []string{ready, unready} {
		if got := testutil.ToFloat64(px.m.connectionErrors.WithLabelValues(addr)); got != 1 {
			t.Errorf("connection_errors_total{upstream=%s}: got %v; want 1", addr, got)
		}
	}
}

// stepDial wraps a dial so that step runs before dial n (from 1) to addr
// dials for real; an error it returns fails the dial.
func stepDial(step func(ctx context.Context, n int, addr string) error) func(dialFunc) dialFunc {
	var dials atomic.Int32
	return func(d dialFunc) dialFunc {
		return func(ctx context.Context, network, addr string) (net.Conn, error) {
			if err := step(ctx, int(dials.Add(1)), addr); err != nil {
				return nil, err
			}
			return d(ctx, network, addr)
		}
	}
}

// waitThen returns a dial step that waits d, or until ctx is done.
func waitThen(d time.Duration) func(context.Context) error {
	return func(ctx context.Context) error {
		if !await(ctx.Done(), d) {
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

// refusedAfter returns a dial step refused after d, deaf to being called
// off, like a restarting API server.
func refusedAfter(d time.Duration) func(context.Context) error {
	return func(context.Context) error {
		time.Sleep(d)
		return &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	}
}

// hang is a dial step that hangs until ctx is done, like a black hole.
func hang(ctx context.Context) error {
	<-ctx.Done()
	return ctx.Err()
}
