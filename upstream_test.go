package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strconv"
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

var errCheck = errors.New("test: connection refused")

// fakeChecks is a checkFunc whose result per address the test sets. An
// address set to block hangs until the check's deadline, like a black hole;
// one with a delay answers after it.
type fakeChecks struct {
	mu      sync.Mutex
	fail    map[string]bool
	block   map[string]bool
	delay   map[string]time.Duration
	err     error // what a failing check returns; errCheck when nil
	callsAt map[string][]time.Time
	rtt     map[string]time.Duration // connect time reported; 1ms when unset
	readyz  bool                     // report /readyz probe results
	unready map[string]bool
}

func newFakeChecks() *fakeChecks {
	return &fakeChecks{fail: map[string]bool{}, block: map[string]bool{}, delay: map[string]time.Duration{},
		callsAt: map[string][]time.Time{}, rtt: map[string]time.Duration{}, unready: map[string]bool{}}
}

func (f *fakeChecks) check(ctx context.Context, addr string) checkResult {
	f.mu.Lock()
	f.callsAt[addr] = append(f.callsAt[addr], time.Now())
	fail, block, rtt, unready, delay := f.fail[addr], f.block[addr], f.rtt[addr], f.unready[addr], f.delay[addr]
	f.mu.Unlock()
	time.Sleep(delay)
	if block {
		<-ctx.Done()
		return checkResult{err: ctx.Err()}
	}
	if fail {
		return checkResult{err: cmp.Or(f.err, errCheck)}
	}
	res := checkResult{rtt: cmp.Or(rtt, time.Millisecond), probed: f.readyz}
	if f.readyz && unready {
		res.notReady = errNotReady
	}
	return res
}

func (f *fakeChecks) setUnready(addr string, unready bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unready[addr] = unready
}

func (f *fakeChecks) setDelay(addr string, d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.delay[addr] = d
}

func (f *fakeChecks) set(addr string, fail bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail[addr] = fail
}

func (f *fakeChecks) count(addr string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.callsAt[addr])
}

func (f *fakeChecks) times(addr string) []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.callsAt[addr])
}

type testPool struct {
	*pool
	m      *metrics
	checks *fakeChecks
	logs   *syncBuffer
}

// syncBuffer is a bytes.Buffer safe for the pool's goroutines to log into.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// newTestPool returns a pool with fake checks; call inside a synctest bubble
// and close it before the bubble ends.
func newTestPool(cfg poolConfig) *testPool {
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	m := newMetrics(prometheus.NewRegistry())
	checks := newFakeChecks()
	checks.readyz = cfg.readyz
	return &testPool{pool: newPool(log, m, cfg, checks.check, randomSelector{}), m: m, checks: checks, logs: logs}
}

func (tp *testPool) status(addr string) float64 {
	return testutil.ToFloat64(tp.m.healthStatus.WithLabelValues(addr))
}

func (tp *testPool) upstream(addr string) *upstream {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return tp.upstreams[addr]
}

func (tp *testPool) health(addr string) health {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return tp.upstreams[addr].h
}

// poolOf is newTestPool serving addrs after their first checks; it closes
// when the test ends.
func poolOf(t *testing.T, cfg poolConfig, addrs ...string) *testPool {
	tp := newTestPool(cfg)
	t.Cleanup(tp.close)
	tp.update(addrs)
	synctest.Wait()
	return tp
}

var defaultTestPool = poolConfig{interval: 20 * time.Second, timeout: 15 * time.Second, drainTimeout: 30 * time.Second}

func TestHealthCheckStreak(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const a = "10.0.0.1:6443"
		tp := poolOf(t, defaultTestPool, a)
		if got := tp.checks.count(a); got != 1 {
			t.Fatalf("checks right after add: got %d; want 1", got)
		}
		tp.checks.set(a, true)
		steps := []struct {
			wait       time.Duration
			wantStatus float64
			wantReady  bool
			wantChecks int
		}{
			{20 * time.Second, 1, true, 2},  // one failure: still included
			{20 * time.Second, 0, false, 3}, // second consecutive failure: excluded
			{20 * time.Second, 0, false, 4}, // stays excluded
		}
		for i, s := range steps {
			time.Sleep(s.wait)
			synctest.Wait()
			if got := tp.checks.count(a); got != s.wantChecks {
				t.Errorf("step %d: checks: got %d; want %d", i, got, s.wantChecks)
			}
			if got := tp.status(a); got != s.wantStatus {
				t.Errorf("step %d: health_check_status: got %v; want %v", i, got, s.wantStatus)
			}
			if got := tp.ready(); got != s.wantReady {
				t.Errorf("step %d: ready: got %v; want %v", i, got, s.wantReady)
			}
		}
		tp.checks.set(a, false)
		time.Sleep(20 * time.Second)
		synctest.Wait()
		if got := tp.status(a); got != 1 {
			t.Errorf("after one success: health_check_status: got %v; want 1", got)
		}
		if got := strings.Count(tp.logs.String(), "upstream unhealthy"); got != 1 {
			t.Errorf("'upstream unhealthy' logged %d times over repeated failures; want once", got)
		}
		if n := testutil.CollectAndCount(tp.m.upstreamRTT) + testutil.CollectAndCount(tp.m.upstreamTier); n != 0 {
			t.Errorf("latency series in random mode: got %d; want 0", n)
		}
	})
}

func TestClientDialsFeedTheSameStreak(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const a = "10.0.0.1:6443"
		tp := poolOf(t, defaultTestPool, a)
		u := tp.upstream(a)
		// Checks fail before the dial does: the failed dial asks for a check
		// at once, and a check that still passed raced the streak back to 0.
		tp.checks.set(a, true)
		tp.reportDial(u, errCheck) // a failed client dial, then the failed check it asks for
		synctest.Wait()
		if got := tp.status(a); got != 0 {
			t.Errorf("after a failed dial and a failed check: got %v; want 0", got)
		}
		tp.attach(t, u) // a successful client dial re-includes it
		if got := tp.status(a); got != 1 {
			t.Errorf("after a successful dial: got %v; want 1", got)
		}
	})
}

// An overloaded upstream that accepts every second connection and fails
// its checks, which each failed dial asks for: failures act at once, but
// it returns (healthy, its sockets back from the sweep's settings) at most
// once per check interval, not with every dial.
func TestFlappingUpstreamReturnsOncePerInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const a = "10.0.0.1:6443"
		cfg := defaultTestPool
		cfg.sweep = true
		tp := poolOf(t, cfg, a)
		u := tp.upstream(a)
		tp.checks.set(a, true)
		for i := range 300 { // 30 s, 1.5 check intervals, a dial every 100 ms
			if i%2 == 0 {
				tp.reportDial(u, errCheck)
			} else {
				tp.attach(t, u)
			}
			time.Sleep(100 * time.Millisecond)
			synctest.Wait()
		}
		logs := tp.logs.String()
		t.Logf("in 30 s: %d returns, %d failures, %d sweeps", strings.Count(logs, "upstream healthy"),
			strings.Count(logs, "upstream unhealthy"), strings.Count(logs, "upstream suspect"))
		for _, tt := range []struct {
			msg  string
			most int
		}{{"upstream healthy", 2}, {"upstream unhealthy", 3}, {"upstream suspect", 3}} {
			if got := strings.Count(logs, tt.msg); got == 0 || got > tt.most {
				t.Errorf("%q in 30 s of flapping: got %d; want 1 to %d", tt.msg, got, tt.most)
			}
		}
		tp.checks.set(a, false) // the overload ends
		time.Sleep(cfg.interval)
		synctest.Wait()
		if got := tp.status(a); got != 1 {
			t.Errorf("health_check_status an interval after the overload: got %v; want 1", got)
		}
	})
}

func TestProbesOfUpstreamsAreIndependent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tp := newTestPool(defaultTestPool)
		defer tp.close()
		const hole, fine = "192.0.2.1:6443", "192.0.2.2:6443"
		tp.checks.block[hole] = true
		tp.update([]string{hole, fine})
		time.Sleep(100 * time.Second)
		synctest.Wait()
		// Checks of fine at 0, 20, ..., 100 s, whatever hole does.
		if got := tp.checks.count(fine); got != 6 {
			t.Errorf("checks of the healthy upstream in 100 s: got %d; want 6", got)
		}
		if h, f := tp.status(hole), tp.status(fine); h != 0 || f != 1 {
			t.Errorf("health_check_status: black-holed upstream %v, healthy one %v; want 0, 1", h, f)
		}
	})
}

func TestLocalExhaustionDoesNotFailUpstream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tp := newTestPool(defaultTestPool)
		defer tp.close()
		tp.check = func(context.Context, string) checkResult {
			return checkResult{err: &net.OpError{Op: "dial", Err: errEMFILE()}}
		}
		tp.update([]string{"10.0.0.1:6443"})
		time.Sleep(100 * time.Second)
		synctest.Wait()
		if !tp.ready() {
			t.Error("pool not ready after checks failed only with EMFILE")
		}
	})
}

func pipeConn() (pc *proxyConn, clientEnd, upstreamEnd net.Conn) {
	c1, c2 := net.Pipe()
	u1, u2 := net.Pipe()
	return &proxyConn{client: c1, upstream: u1}, c2, u2
}

func (tp *testPool) attach(t *testing.T, u *upstream) (*proxyConn, net.Conn) {
	t.Helper()
	pc, clientEnd, _ := pipeConn()
	if !tp.connected(u, pc) {
		t.Fatalf("connected to %s failed", u.addr)
	}
	return pc, clientEnd
}

func isClosed(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(time.Millisecond))
	_, err := c.Read(make([]byte, 1))
	return err != nil && !errors.Is(err, errTimeout(err))
}

// lockCheckConn is the client socket of a proxyConn over pipes; it records
// whether the pool's lock was held when the pool closed it.
type lockCheckConn struct {
	net.Conn
	p      *pool
	closed atomic.Bool
	locked atomic.Bool
}

func (c *lockCheckConn) Close() error {
	if c.p.mu.TryLock() {
		c.p.mu.Unlock()
	} else {
		c.locked.Store(true)
	}
	c.closed.Store(true)
	return c.Conn.Close()
}

func (tp *testPool) attachLockChecked(t *testing.T, u *upstream) *lockCheckConn {
	t.Helper()
	pc, _, _ := pipeConn()
	c := &lockCheckConn{Conn: pc.client, p: tp.pool}
	pc.client = c
	if !tp.connected(u, pc) {
		t.Fatalf("connected to %s failed", u.addr)
	}
	return c
}

// wantClosedUnderLock fails the test unless the pool closed c, holding its
// lock: a deadline's action runs under it.
func wantClosedUnderLock(t *testing.T, what string, c *lockCheckConn) {
	t.Helper()
	if closed, locked := c.closed.Load(), c.locked.Load(); !closed || !locked {
		t.Errorf("%s: closed=%v with the pool's lock held=%v; want both", what, closed, locked)
	}
}

// quietPool is newTestPool whose checks of addrs hang for an hour, so that
// only what the test reports moves their state.
func quietPool(cfg poolConfig, addrs ...string) *testPool {
	cfg.interval, cfg.timeout = time.Hour, time.Hour
	tp := newTestPool(cfg)
	for _, addr := range addrs {
		tp.checks.block[addr] = true
	}
	return tp
}

func (tp *testPool) pendingOf(d *deadline) bool {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return d.pending()
}

// TestDeadlineRunsAfterDelayWithLockHeld covers the one mechanism behind
// the drain, the eviction and the sweep: arm runs its action once, after
// the delay and not before, holding the pool's lock; arming again replaces
// the pending one, and stop calls it off.
func TestDeadlineRunsAfterDelayWithLockHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tp := newTestPool(defaultTestPool)
		defer tp.close()
		type run struct {
			At     time.Duration // since start
			Locked bool          // the pool's lock was held
		}
		var d deadline
		var runs []run // guarded by tp.mu
		start := time.Now()
		arm := func(delay time.Duration) {
			tp.mu.Lock()
			defer tp.unlock()
			tp.arm(&d, delay, func() {
				locked := !tp.mu.TryLock()
				if !locked {
					tp.mu.Unlock()
				}
				runs = append(runs, run{time.Since(start), locked})
			})
		}
		want := func(step string, wantRuns []run, wantPending bool) {
			t.Helper()
			synctest.Wait()
			tp.mu.Lock()
			got, pending := slices.Clone(runs), d.pending()
			tp.mu.Unlock()
			if !slices.Equal(got, wantRuns) || pending != wantPending {
				t.Errorf("%s: runs %v, pending %v; want %v, %v", step, got, pending, wantRuns, wantPending)
			}
		}
		arm(10 * time.Second)
		time.Sleep(10*time.Second - time.Nanosecond)
		want("just before the delay", nil, true)
		time.Sleep(time.Nanosecond)
		want("at the delay", []run{{10 * time.Second, true}}, false)

		arm(10 * time.Second)
		time.Sleep(5 * time.Second)
		arm(10 * time.Second) // at 15 s: due at 25 s, the first one never
		time.Sleep(20 * time.Second)
		want("armed twice", []run{{10 * time.Second, true}, {25 * time.Second, true}}, false)

		arm(10 * time.Second)
		tp.mu.Lock()
		stopped, again := d.stop(), d.stop()
		tp.unlock()
		if !stopped || again {
			t.Errorf("stop of a pending deadline, then again: got %v, %v; want true, false", stopped, again)
		}
		time.Sleep(20 * time.Second)
		want("stopped", []run{{10 * time.Second, true}, {25 * time.Second, true}}, false)
	})
}

func TestDrainDeadline(t *testing.T) {
	const a, b = "10.0.0.1:6443", "10.0.0.2:6443"
	drain := defaultTestPool.drainTimeout
	t.Run("closes at the drain timeout", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			tp := poolOf(t, defaultTestPool, a)
			u := tp.upstream(a)
			held := tp.attachLockChecked(t, u)
			tp.update([]string{b})
			checksBefore := tp.checks.count(a)
			time.Sleep(drain - time.Nanosecond)
			synctest.Wait()
			if held.closed.Load() || !tp.pendingOf(&u.drain) {
				t.Fatalf("just before the drain timeout: closed=%v, drain pending=%v; want open and pending",
					held.closed.Load(), tp.pendingOf(&u.drain))
			}
			if got := tp.checks.count(a); got != checksBefore {
				t.Errorf("checks of a draining upstream: got %d more; want none", got-checksBefore)
			}
			time.Sleep(time.Nanosecond)
			synctest.Wait()
			wantClosedUnderLock(t, "connection at the drain timeout", held)
			if tp.upstream(a) != nil {
				t.Error("drained upstream still in the pool")
			}
		})
	})
	t.Run("called off by a re-add", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			tp := poolOf(t, defaultTestPool, a, b)
			u := tp.upstream(a)
			held := tp.attachLockChecked(t, u)
			tp.update([]string{b})
			time.Sleep(drain / 2)
			tp.update([]string{a, b})
			if tp.pendingOf(&u.drain) {
				t.Error("drain still pending after the upstream was re-added")
			}
			time.Sleep(drain)
			synctest.Wait()
			if held.closed.Load() {
				t.Error("connection closed past the drain timeout although the drain was called off")
			}
			if got := tp.upstream(a); got != u {
				t.Errorf("re-added upstream: got %v; want the same entry, kept", got)
			}
			if got := picks(tp.pool, 200); got[a] == 0 {
				t.Errorf("picks after the re-add: got %v; want a to get some", got)
			}
		})
	})
}

// The sweep's deadline: its look at stalled connections comes
// stalledAfter into a suspicion, unless the upstream recovers first, and a
// new suspicion arms it again.
// (Which connections it closes needs real sockets: proxy_linux_test.go
// and blackhole_linux_test.go.)
func TestSweepDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const a = "10.0.0.1:6443"
		cfg := defaultTestPool
		cfg.sweep = true
		tp := quietPool(cfg, a)
		defer tp.close()
		tp.update([]string{a})
		u := tp.upstream(a)
		tp.reportCheck(u, checkResult{err: errCheck})
		time.Sleep(time.Second)
		tp.reportCheck(u, checkResult{rtt: time.Millisecond})
		// Before its delay, so no longer pending means called off.
		if tp.pendingOf(&u.sweep) {
			t.Error("sweep still pending after the upstream recovered")
		}
		tp.reportCheck(u, checkResult{err: errCheck}) // suspect again
		time.Sleep(stalledAfter - time.Nanosecond)
		synctest.Wait()
		if !tp.pendingOf(&u.sweep) {
			t.Fatal("sweep not pending just before stalledAfter into the suspicion")
		}
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		tp.mu.Lock()
		suspect, pending := u.h.suspect, u.sweep.pending()
		tp.mu.Unlock()
		if !suspect || pending {
			t.Errorf("at stalledAfter: suspect=%v, sweep pending=%v; want still suspect, the sweep done", suspect, pending)
		}
	})
}

// pool.close stops what is pending at once rather than waiting for its
// delay, and nothing runs after it returns. A check that ends while the
// pool closes reports after close has stopped the deadlines; what it arms
// then must not make close wait for its delay, up to the drain timeout for
// an eviction. Reporting after close stands in for that race, which a
// bubble cannot stage (the probe waits on the lock).
func TestPoolCloseStopsPendingDeadlines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const a = "10.0.0.1:6443"
		cfg := defaultTestPool
		cfg.sweep = true
		tp := quietPool(cfg, a)
		tp.update([]string{a})
		u := tp.upstream(a)
		var ran atomic.Int32
		tp.mu.Lock()
		for _, d := range []*deadline{&u.drain, &u.evict, &u.sweep} {
			tp.arm(d, time.Hour, func() { ran.Add(1) })
		}
		tp.unlock()
		start := time.Now()
		tp.close()
		if d := time.Since(start); d != 0 {
			t.Errorf("pool.close with three pending deadlines took %v; want 0 (stopped, not waited for)", d)
		}
		time.Sleep(2 * time.Hour)
		synctest.Wait()
		if got := ran.Load(); got != 0 {
			t.Errorf("deadlines run after pool.close: got %d; want 0", got)
		}
		tp.reportCheck(u, checkResult{err: errCheck})
		if tp.pendingOf(&u.sweep) {
			t.Error("sweep armed after pool.close; want nothing armed once closed")
		}
	})
}

// pool.close waits for a deadline that has fired and not finished, here
// one still writing its log line after unlocking, so that nothing of the
// pool runs once close has returned.
func TestPoolCloseWaitsForRunningDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const a = "10.0.0.1:6443"
		tp, lines := newLogProbePool(defaultTestPool, a)
		lines.stall = "deadline ran"
		release := sync.OnceFunc(func() { close(lines.release) })
		defer release()
		tp.update([]string{a})
		u := tp.upstream(a)
		tp.mu.Lock()
		tp.arm(&u.evict, time.Second, func() { tp.note(u, slog.LevelInfo, "deadline ran") })
		tp.unlock()
		time.Sleep(time.Second)
		synctest.Wait()
		if !slices.Contains(lines.messages(), "deadline ran") {
			t.Fatal("the deadline did not run at its delay")
		}
		closed := make(chan struct{})
		go func() {
			tp.close()
			close(closed)
		}()
		synctest.Wait()
		select {
		case <-closed:
			t.Error("pool.close returned while a deadline was still running")
		default:
		}
		release()
		<-closed
	})
}

func TestReAddAfterRemovalStartsFresh(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const a, b = "10.0.0.1:6443", "10.0.0.2:6443"
		tp := poolOf(t, poolConfig{interval: 20 * time.Second, timeout: 15 * time.Second, drainTimeout: 0}, a, b)
		tp.upstream(a).errs.Inc()
		tp.update([]string{b})
		if n := testutil.CollectAndCount(tp.m.connectionErrors); n != 1 {
			t.Errorf("connection_errors_total series after removing a: got %d; want 1 (b only)", n)
		}
		tp.update([]string{a, b})
		if errs, status := testutil.ToFloat64(tp.m.connectionErrors.WithLabelValues(a)), tp.status(a); errs != 0 || status != 1 {
			t.Errorf("after re-add: connection_errors_total %v, health_check_status %v; want 0, 1", errs, status)
		}
	})
}

func TestLastResortOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		addrs := []string{"10.0.0.1:6443", "10.0.0.2:6443", "10.0.0.3:6443"}
		tp := poolOf(t, defaultTestPool, addrs...)
		// Fail all three, the most recently healthy being 10.0.0.2.
		for _, addr := range []string{addrs[0], addrs[2], addrs[1]} {
			u := tp.upstream(addr)
			tp.reportCheck(u, checkResult{rtt: time.Millisecond})
			time.Sleep(time.Second)
			tp.reportCheck(u, checkResult{err: errCheck})
			tp.reportCheck(u, checkResult{err: errCheck})
		}
		if tp.pick(nil) != nil {
			t.Fatal("pick returned an upstream while none is healthy")
		}
		var order []string
		var tried []*upstream
		for u := tp.lastResort(nil); u != nil; u = tp.lastResort(tried) {
			order = append(order, u.addr)
			tried = append(tried, u)
		}
		want := []string{addrs[1], addrs[2], addrs[0]}
		if strings.Join(order, ",") != strings.Join(want, ",") {
			t.Errorf("last-resort order: got %v; want %v", order, want)
		}
	})
}

// latencyPoolOf is poolOf with latency selection, serving the upstreams of
// rtts, each checked at its connect time.
func latencyPoolOf(t *testing.T, rtts map[string]time.Duration) *testPool {
	tp := newTestPool(defaultTestPool)
	tp.sel = newLatencySelector(tp.m)
	t.Cleanup(tp.close)
	maps.Copy(tp.checks.rtt, rtts)
	tp.update(slices.Sorted(maps.Keys(rtts)))
	synctest.Wait()
	return tp
}

func picks(p *pool, n int) map[string]int {
	got := map[string]int{}
	for range n {
		if u := p.pick(nil); u != nil {
			got[u.addr]++
		}
	}
	return got
}

func TestLatencySelectionPrefersLowestTier(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const near1, near2, far = "10.0.0.1:6443", "10.0.0.2:6443", "10.0.9.1:6443"
		tp := latencyPoolOf(t, map[string]time.Duration{near1: 1 * ms, near2: 2 * ms, far: 40 * ms})
		got := picks(tp.pool, 1000)
		if got[far] != 0 || got[near1] < 300 || got[near2] < 300 {
			t.Errorf("picks: got %v; want near1 and near2 about evenly, far never", got)
		}
		for addr, tier := range map[string]float64{near1: 0, near2: 0, far: 1} {
			if v := testutil.ToFloat64(tp.m.upstreamTier.WithLabelValues(addr)); v != tier {
				t.Errorf("upstream_latency_tier{%s}: got %v; want %v", addr, v, tier)
			}
		}
		if v := testutil.ToFloat64(tp.m.upstreamRTT.WithLabelValues(far)); v != 0.040 {
			t.Errorf("upstream_rtt_seconds{far}: got %v; want 0.040", v)
		}

		// Losing one near upstream does not let far in.
		tp.checks.set(near1, true)
		time.Sleep(40 * time.Second)
		synctest.Wait()
		if got := picks(tp.pool, 200); got[near2] != 200 {
			t.Errorf("picks with near1 unhealthy: got %v; want near2 only", got)
		}
		// Losing all of tier 0 hands over to the next tier.
		tp.checks.set(near2, true)
		time.Sleep(40 * time.Second)
		synctest.Wait()
		if got := picks(tp.pool, 200); got[far] != 200 {
			t.Errorf("picks with tier 0 unhealthy: got %v; want far only", got)
		}
		// Unhealthy upstreams keep their tier.
		if v := testutil.ToFloat64(tp.m.upstreamTier.WithLabelValues(near1)); v != 0 {
			t.Errorf("tier of unhealthy near1: got %v; want 0", v)
		}
	})
}

func TestLatencyNewUpstreamSharesOnlyBestTier(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const near, far, fresh = "10.0.0.1:6443", "10.0.9.1:6443", "10.0.0.7:6443"
		tp := latencyPoolOf(t, map[string]time.Duration{near: 1 * ms, far: 40 * ms})
		tp.checks.block[fresh] = true // its first check hangs: no sample yet
		tp.update([]string{near, far, fresh})
		got := picks(tp.pool, 1000)
		if got[far] != 0 || got[fresh] < 350 || got[near] < 350 {
			t.Errorf("picks with a new upstream: got %v; want near and fresh evenly, far never", got)
		}
		if n := testutil.CollectAndCount(tp.m.upstreamRTT); n != 2 {
			t.Errorf("upstream_rtt_seconds series before the new upstream's first success: got %d; want 2", n)
		}
	})
}

func TestLatencyRemovedUpstreamLeavesTiersAfterDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const a, b, c = "10.0.0.1:6443", "10.0.0.2:6443", "10.0.9.1:6443"
		tp := latencyPoolOf(t, map[string]time.Duration{a: 1 * ms, b: 20 * ms, c: 30 * ms})
		tp.attach(t, tp.upstream(a))
		tp.update([]string{b, c}) // a drains with a connection open
		// While a drains it keeps tier 0, so b and c share tier 1.
		if v := testutil.ToFloat64(tp.m.upstreamTier.WithLabelValues(b)); v != 1 {
			t.Errorf("tier of b while a drains: got %v; want 1", v)
		}
		time.Sleep(defaultTestPool.drainTimeout)
		synctest.Wait()
		if n := testutil.CollectAndCount(tp.m.upstreamTier); n != 2 {
			t.Errorf("tier series after a drained: got %d; want 2", n)
		}
		if v := testutil.ToFloat64(tp.m.upstreamTier.WithLabelValues(b)); v != 0 {
			t.Errorf("tier of b after a left: got %v; want 0", v)
		}
	})
}

// A failed check that leaves the upstream included is confirmed 1 s
// later, a failed connect while healthy or a failed /readyz probe while
// ready: an API server that went away or lost etcd quorum is out within
// seconds, not after a second interval. Once it is out, checks return to
// the interval.
func TestQuickRecheckConfirmsFailureInSeconds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := readyzTestPool
		cfg.quickRecheck = time.Second
		tp := newTestPool(cfg)
		defer tp.close()
		const a = "10.0.0.1:6443"
		start := time.Now()
		tp.update([]string{a})
		synctest.Wait() // the first probe passes: ready
		tp.checks.setUnready(a, true)
		time.Sleep(21 * time.Second) // the probe at 20 s fails, and the one at 21 s
		synctest.Wait()
		if tp.health(a).ready() {
			t.Error("ready 1 s after the first failed probe; want not ready")
		}
		tp.checks.setUnready(a, false)
		tp.checks.set(a, true)
		time.Sleep(21 * time.Second) // the connect at 41 s fails, and the one at 42 s
		synctest.Wait()
		if got := tp.status(a); got != 0 {
			t.Errorf("health_check_status 1 s after the first failed connect: got %v; want 0", got)
		}
		time.Sleep(20 * time.Second)
		synctest.Wait()
		var at []time.Duration
		for _, c := range tp.checks.times(a) {
			at = append(at, c.Sub(start))
		}
		if want := []time.Duration{0, 20 * time.Second, 21 * time.Second, 41 * time.Second, 42 * time.Second, 62 * time.Second}; !slices.Equal(at, want) {
			t.Errorf("check times: got %v; want %v", at, want)
		}
	})
}

// The confirming check starts quickRecheck after the failed one began, so
// one that ran into its timeout is confirmed at once: a black-holed or
// stalled upstream costs two timeouts, not two timeouts and the recheck.
func TestQuickRecheckAfterTimeoutAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := defaultTestPool
		cfg.timeout, cfg.quickRecheck = 2*time.Second, time.Second
		tp := newTestPool(cfg)
		defer tp.close()
		const a = "10.0.0.1:6443"
		start := time.Now()
		tp.update([]string{a})
		synctest.Wait()
		tp.checks.mu.Lock()
		tp.checks.block[a] = true
		tp.checks.mu.Unlock()
		time.Sleep(25 * time.Second)
		synctest.Wait()
		var at []time.Duration
		for _, c := range tp.checks.times(a) {
			at = append(at, c.Sub(start))
		}
		if want := []time.Duration{0, 20 * time.Second, 22 * time.Second}; !slices.Equal(at, want) {
			t.Errorf("check times: got %v; want %v (the confirming check as the timed-out one ends)", at, want)
		}
		if got := tp.status(a); got != 0 {
			t.Errorf("health_check_status after two timed-out checks: got %v; want 0", got)
		}
	})
}

// A failed dial of an included upstream asks for a check at once. With
// every upstream down, though, each client dials the excluded ones as a
// last resort: those failed dials must not each trigger a check, or the
// checks would follow the clients' rate.
func TestFailedDialTriggersCheckUnlessExcluded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const a = "10.0.0.1:6443"
		tp := poolOf(t, defaultTestPool, a)
		tp.checks.set(a, true)
		time.Sleep(3 * time.Second)
		tp.reportDial(tp.upstream(a), errCheck)
		synctest.Wait()
		if got, status := tp.checks.count(a), tp.status(a); got != 2 || status != 0 {
			t.Fatalf("after a failed dial: %d checks, health_check_status %v; want 2 (the first, and one at once), 0", got, status)
		}
		for range 10 {
			tp.reportDial(tp.upstream(a), errCheck)
			tp.confirmSlow(tp.upstream(a))
			synctest.Wait()
			time.Sleep(100 * time.Millisecond)
		}
		if got := tp.checks.count(a); got != 2 {
			t.Errorf("checks after ten failed and ten slow dials of an excluded upstream within 1 s: got %d; want still 2 (interval %v)", got, defaultTestPool.interval)
		}
	})
}

var readyzTestPool = func(c poolConfig) poolConfig { c.readyz = true; return c }(defaultTestPool)

func (tp *testPool) readyGauge(addr string) float64 {
	return testutil.ToFloat64(tp.m.upstreamReady.WithLabelValues(addr))
}

func TestReadinessStateMachine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tp := newTestPool(readyzTestPool)
		defer tp.close()
		const a = "10.0.0.1:6443"
		tp.checks.setUnready(a, true)
		tp.update([]string{a})
		// The first probe runs at once and may already have failed, which
		// clears pending; either way a new upstream is not ready.
		if tp.health(a).ready() {
			t.Fatal("new upstream: ready; want not ready")
		}
		synctest.Wait() // first probe fails: known not ready at once
		if got := tp.readyGauge(a); got != 0 {
			t.Errorf("after a failed first probe: upstream_ready got %v; want 0", got)
		}
		// and the operator is told why, although it was never ready
		if logs := tp.logs.String(); !strings.Contains(logs, "level=WARN msg=\"upstream not ready\"") {
			t.Errorf("log after a failed first probe: got\n%s\nwant a warning that the upstream is not ready", logs)
		}
		tp.checks.setUnready(a, false)
		steps := []struct {
			unready, tcpFail bool
			want, pending    bool
		}{
			{false, false, true, false}, // one success: ready
			{true, false, true, false},  // one failure: still ready
			{true, false, false, false}, // second failure: not ready
			{false, false, true, false}, // one success: ready again
			{false, true, true, false},  // one failed connect: still ready
			{true, false, false, false}, // reachable, the next probe fails: not ready at once
			{false, false, true, false}, // one success: ready again
			{false, true, true, false},  // one failed connect: still ready
			{false, true, false, true},  // unreachable: not ready, pending
			{true, false, false, false}, // reachable, probe fails: not ready
			{false, true, false, false}, // one failed connect: unchanged
			{false, true, false, true},  // unreachable again
			{false, false, true, false}, // the next probe passes: ready
		}
		for i, s := range steps {
			tp.checks.setUnready(a, s.unready)
			tp.checks.set(a, s.tcpFail)
			time.Sleep(20 * time.Second)
			synctest.Wait()
			h := tp.health(a)
			if pending := h.state == upPending || h.state == upUnhealthy; h.ready() != s.want || pending != s.pending {
				t.Errorf("step %d: %s; want ready=%v pending=%v", i, h.state.word(), s.want, s.pending)
			}
			if got, want := tp.readyGauge(a), boolGauge(s.want); got != want {
				t.Errorf("step %d: upstream_ready got %v; want %v", i, got, want)
			}
		}
	})
}

// TestReadyUpstreamAfterOneFailure: an upstream whose probe or connect
// failed once keeps its readiness, but new connections avoid it while
// another ready upstream's last probe passed, until its next probe
// passes. (Alone among the ready it still beats an unready one and other
// upstreams' evictions go on: TestUnreadyUpstreamLosesConnectionsAfterDrainTimeout.)
func TestReadyUpstreamAfterOneFailure(t *testing.T) {
	const a, b = "10.0.0.1:6443", "10.0.0.2:6443"
	for _, fault := range []struct {
		name string
		set  func(c *fakeChecks, fail bool)
	}{
		{"a failed connect", func(c *fakeChecks, fail bool) { c.set(a, fail) }},
		{"a failed probe", func(c *fakeChecks, fail bool) { c.setUnready(a, fail) }},
	} {
		t.Run(fault.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tp := poolOf(t, readyzTestPool, a, b)
				fault.set(tp.checks, true) // a's next check fails
				time.Sleep(20 * time.Second)
				synctest.Wait()
				if got := picks(tp.pool, 200); got[b] != 200 {
					t.Errorf("after %s of a: picks %v; want b only", fault.name, got)
				}
				if got := tableRow(tp.describe(nil)[0], time.Now())[2]; got != "ready-awaiting-probe" || !tp.health(a).ready() {
					t.Errorf("a in /upstreams after %s: got %q; want ready-awaiting-probe", fault.name, got)
				}
				fault.set(tp.checks, false)
				time.Sleep(20 * time.Second)
				synctest.Wait()
				if got := picks(tp.pool, 400); got[a] < 100 || got[b] < 100 {
					t.Errorf("a's next probe passed: picks %v; want both", got)
				}
				if got := tableRow(tp.describe(nil)[0], time.Now())[2]; got != "ready" {
					t.Errorf("a's readiness in /upstreams after its probe passed: got %q; want ready", got)
				}
			})
		})
	}
}

// TestSlowProbeIsAFirstSign: while a /readyz probe of a ready upstream
// goes unanswered past slowProbe, new connections avoid it as after a
// failed probe; its answer ends that, and being slow counts as no failure:
// a slow probe that fails is the first failure of two. A slow tcp check
// changes nothing.
func TestSlowProbeIsAFirstSign(t *testing.T) {
	const a, b = "10.0.0.1:6443", "10.0.0.2:6443"
	for _, readyz := range []bool{true, false} {
		synctest.Test(t, func(t *testing.T) {
			cfg := defaultTestPool
			cfg.readyz = readyz
			tp := poolOf(t, cfg, a, b)
			tp.checks.setDelay(a, time.Second) // before a's next check, at 20 s
			for i, unready := range []bool{false, true} {
				tp.checks.setUnready(a, unready)
				// The next check starts an interval after the last ended.
				time.Sleep(time.Until(tp.checks.times(a)[i].Add(20*time.Second+time.Duration(i)*time.Second)) + slowProbe/2)
				synctest.Wait()
				if got := picks(tp.pool, 400); got[a] < 100 {
					t.Errorf("readyz %v, check %d of a under way for %s: picks %v; want a among them", readyz, i+1, slowProbe/2, got)
				}
				time.Sleep(slowProbe)
				synctest.Wait()
				if got := picks(tp.pool, 200); readyz && got[a] != 0 || !readyz && got[a] < 50 {
					t.Errorf("readyz %v, check %d of a under way for %s: picks %v", readyz, i+1, slowProbe*3/2, got)
				}
				time.Sleep(time.Second)
				synctest.Wait()
				if h := tp.health(a); readyz && (h.state != []state{upReady, upAwaitingProbe}[i] || h.probeFails != i) {
					t.Errorf("after check %d of a (a slow pass, then a slow failure): %s with %d failed probes", i+1, h.state.word(), h.probeFails)
				}
			}
		})
	}
}

// When every ready upstream's probe is slow at once, as on a daemon starved
// of CPU, none is preferred and every one still takes new connections.
func TestSlowProbesEverywhereStillPick(t *testing.T) {
	const a, b = "10.0.0.1:6443", "10.0.0.2:6443"
	synctest.Test(t, func(t *testing.T) {
		tp := poolOf(t, readyzTestPool, a, b)
		tp.checks.setDelay(a, time.Second)
		tp.checks.setDelay(b, time.Second)
		time.Sleep(20*time.Second + 3*slowProbe)
		synctest.Wait()
		if h := tp.health(a); !h.slow || !tp.health(b).slow {
			t.Fatalf("both probes under way for %s: slow marks %v and %v; want both set", 3*slowProbe, h.slow, tp.health(b).slow)
		}
		if got := picks(tp.pool, 400); got[a] < 100 || got[b] < 100 {
			t.Errorf("both probes slow: picks %v; want both", got)
		}
	})
}

// A slow probe whose result is dropped (local exhaustion, see probeLoop)
// ends its slow mark all the same: the upstream is preferred again at once,
// not after its next probe.
func TestSlowProbeSkippedEndsItsMark(t *testing.T) {
	const a, b = "10.0.0.1:6443", "10.0.0.2:6443"
	synctest.Test(t, func(t *testing.T) {
		tp := poolOf(t, readyzTestPool, a, b)
		tp.checks.setDelay(a, time.Second)
		tp.checks.mu.Lock()
		tp.checks.err = syscall.EMFILE
		tp.checks.mu.Unlock()
		tp.checks.set(a, true)
		time.Sleep(20*time.Second + 3*slowProbe)
		synctest.Wait()
		if !tp.health(a).slow {
			t.Fatalf("a's probe under way for %s: not marked slow", 3*slowProbe)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if h := tp.health(a); h.slow || h.state != upReady {
			t.Errorf("after a's skipped probe: %s, slow %v; want ready, not slow", h.state.word(), h.slow)
		}
		if got := picks(tp.pool, 400); got[a] < 100 {
			t.Errorf("after a's skipped probe: picks %v; want a among them", got)
		}
	})
}

func TestReadinessFiltersBeforeLatencyTiers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tp := newTestPool(readyzTestPool)
		tp.sel = newLatencySelector(tp.m)
		defer tp.close()
		const near, far = "10.0.0.1:6443", "10.0.9.1:6443"
		tp.checks.rtt[near], tp.checks.rtt[far] = ms, 50*ms
		tp.checks.setUnready(near, true)
		tp.update([]string{near, far})
		synctest.Wait()
		if got := picks(tp.pool, 100); got[far] != 100 {
			t.Errorf("near not ready, far ready: picks %v; want far only", got)
		}
	})
}

// evictionSetup returns a readyz pool with a and b ready and one connection
// held on a.
func evictionSetup(t *testing.T, drain time.Duration) (tp *testPool, clientEnd net.Conn) {
	t.Helper()
	cfg := readyzTestPool
	cfg.drainTimeout = drain
	tp = poolOf(t, cfg, "10.0.0.1:6443", "10.0.0.2:6443")
	_, clientEnd = tp.attach(t, tp.upstream("10.0.0.1:6443"))
	return tp, clientEnd
}

// The connections of an unready upstream close when the drain timeout
// since its first failed probe ends, not before, under the pool's lock. A
// single failed connect of b, the only other ready upstream, meanwhile
// keeps b ready and first in line and does not call the closing off: it
// would otherwise restart with a full drain timeout after every lost SYN.
func TestUnreadyUpstreamLosesConnectionsAfterDrainTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// a's first failed probe is at 20 s: its connections close at 80 s.
		tp, held := evictionSetup(t, 60*time.Second)
		const a, b = "10.0.0.1:6443", "10.0.0.2:6443"
		u := tp.upstream(a)
		checked := tp.attachLockChecked(t, u)
		tp.checks.setUnready(a, true)
		time.Sleep(40 * time.Second) // second failed probe at 40 s: not ready
		synctest.Wait()
		tp.checks.set(b, true)
		time.Sleep(21 * time.Second) // b's check at 60 s fails
		synctest.Wait()
		tp.checks.set(b, false)
		if !tp.health(b).ready() {
			t.Fatal("after one failed check of b: b not ready; want ready")
		}
		if got := picks(tp.pool, 200); got[b] != 200 {
			t.Errorf("b, the only ready upstream, failed one connect: picks %v; want b only, not unready a", got)
		}
		time.Sleep(19*time.Second - time.Nanosecond)
		synctest.Wait()
		if checked.closed.Load() || !tp.pendingOf(&u.evict) {
			t.Fatalf("just before the drain timeout: closed=%v, closing pending=%v; want open, pending",
				checked.closed.Load(), tp.pendingOf(&u.evict))
		}
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		if !isClosed(held) {
			t.Fatal("connection of an unready upstream still open after the drain timeout")
		}
		wantClosedUnderLock(t, "connection of an unready upstream at the drain timeout", checked)
	})
}

// A drain timeout shorter than the two probes of the verdict has run out
// by then: the connections close with the verdict, not a drain timeout
// after it.
func TestEvictionAtVerdictWhenGraceSpent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tp, held := evictionSetup(t, 10*time.Second)
		const a = "10.0.0.1:6443"
		tp.checks.setUnready(a, true)
		// Probes fail at 20 s and 40 s. isClosed waits 1 ms of the
		// bubble's clock.
		time.Sleep(40*time.Second - 10*time.Millisecond)
		synctest.Wait()
		if isClosed(held) {
			t.Fatal("connection closed before the verdict")
		}
		time.Sleep(10 * time.Millisecond)
		synctest.Wait()
		if !isClosed(held) {
			t.Fatal("connection of an upstream not ready at 40 s, first failed at 20 s, with a 10 s drain timeout: still open")
		}
	})
}

// After a cluster-wide outage, the first upstream ready again does not get
// every other upstream's connections at once: their grace begins when it
// is ready, not at their first failed probe long before.
func TestEvictionGraceAfterNoneReady(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tp, held := evictionSetup(t, 30*time.Second)
		const a, b = "10.0.0.1:6443", "10.0.0.2:6443"
		tp.checks.setUnready(a, true)
		tp.checks.setUnready(b, true)
		time.Sleep(50 * time.Second) // both not ready at 40 s
		synctest.Wait()
		tp.checks.setUnready(b, false)
		time.Sleep(11 * time.Second) // b ready at 60 s
		synctest.Wait()
		if !tp.health(b).ready() || isClosed(held) {
			t.Fatalf("b ready again at 60 s: ready %v, a's connection closed %v; want ready, open until 90 s", tp.health(b).ready(), isClosed(held))
		}
		time.Sleep(30 * time.Second)
		synctest.Wait()
		if !isClosed(held) {
			t.Fatal("a's connection still open a drain timeout after b turned ready")
		}
	})
}

func TestEvictionCalledOff(t *testing.T) {
	const a, b = "10.0.0.1:6443", "10.0.0.2:6443"
	for _, tt := range []struct {
		name   string
		change func(tp *testPool)
	}{
		{"upstream ready again", func(tp *testPool) { tp.checks.setUnready(a, false) }},
		{"no other upstream ready", func(tp *testPool) { tp.checks.setUnready(b, true) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				// a's first probe fails at 20 s and it is not ready at
				// 40 s, so its connections would close at 120 s; the
				// change takes effect by 80 s.
				tp, held := evictionSetup(t, 100*time.Second)
				tp.checks.setUnready(a, true)
				time.Sleep(40 * time.Second)
				synctest.Wait()
				tt.change(tp)
				time.Sleep(90 * time.Second) // past 120 s
				synctest.Wait()
				if tp.pendingOf(&tp.upstream(a).evict) {
					t.Error("eviction still pending after it was called off")
				}
				if isClosed(held) {
					t.Fatal("connection closed although the closing was called off")
				}
			})
		})
	}
}

// With --drain-timeout 0 the connections of an unready upstream close at
// once, but not those of one whose readiness two failed connects reset to
// pending: they stay until a probe has answered.
func TestEvictionDrainZeroClosesAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tp, held := evictionSetup(t, 0)
		const a = "10.0.0.1:6443"
		tp.checks.set(a, true)
		time.Sleep(40 * time.Second)
		synctest.Wait()
		if st := tp.health(a).state; st != upUnhealthy || isClosed(held) {
			t.Fatalf("after two failed connects: state %s, connection closed %v; want unhealthy, open", st.word(), isClosed(held))
		}
		tp.checks.set(a, false)
		tp.checks.setUnready(a, true)
		time.Sleep(20 * time.Second) // reachable, the probe fails: not ready
		synctest.Wait()
		if !isClosed(held) {
			t.Fatal("with --drain-timeout 0 the connection of an unready upstream stays open")
		}
	})
}

// Client dials that make a ready upstream unhealthy reset its readiness
// as failed checks would, so upstream_ready and health_check_status agree.
func TestFailedDialsResetReadiness(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const a = "10.0.0.1:6443"
		tp := poolOf(t, readyzTestPool, a)
		u := tp.upstream(a)
		// The check a failed dial asks for hangs, so only the dials decide.
		tp.checks.mu.Lock()
		tp.checks.block[a] = true
		tp.checks.mu.Unlock()
		tp.reportDial(u, errCheck)
		if got := tp.readyGauge(a); got != 1 {
			t.Fatalf("after one failed dial: upstream_ready got %v; want 1", got)
		}
		tp.reportDial(u, errCheck)
		synctest.Wait()
		tp.mu.Lock()
		st := u.h.state
		tp.mu.Unlock()
		if st != upUnhealthy {
			t.Errorf("after two failed dials: %s; want unhealthy, so not ready until a probe passes", st.word())
		}
		if got := tp.readyGauge(a); got != 0 {
			t.Errorf("after two failed dials: upstream_ready got %v; want 0", got)
		}
	})
}

// An upstream's error text reaches /upstreams and the status table, which
// prints on a terminal, cut short and with nothing that is not printable:
// a peer chooses the names in its certificate, which a verification error
// repeats.
func TestUpstreamsShowErrorsSafely(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const a = "10.0.0.1:6443"
		tp := poolOf(t, defaultTestPool, a)
		hostile := errors.New("x509: certificate is valid for evil\n10.6.6.6:6443  static  healthy\x1b[31m " + strings.Repeat("n", 60<<10))
		tp.reportDial(tp.upstream(a), hostile)
		st := tp.describe(nil)
		if len(st) != 1 {
			t.Fatalf("describe: got %d upstreams; want 1", len(st))
		}
		got := st[0].LastError
		if strings.ContainsAny(got, "\n\x1b") || len(got) > 3*maxErrorText+3 || !strings.HasSuffix(got, "...") {
			t.Errorf("last error of %d bytes, %q...; want it cut to about %d bytes without control characters", len(got), cutText(got, 80), maxErrorText)
		}
		if !strings.HasPrefix(got, "x509: certificate is valid for evil\uFFFD10.6.6.6:6443") {
			t.Errorf("last error %q...; want its start kept", cutText(got, 80))
		}
	})
}

// logProbe is a slog handler that records, for every line the pool writes,
// whether the pool's lock was free at the time; a line whose message is
// stall waits in Handle until release is closed, like a stuck stderr.
type logProbe struct {
	p       *pool
	stall   string
	release chan struct{}

	mu     sync.Mutex
	lines  []string // messages, in order
	locked []string // those written with p.mu held
}

func (h *logProbe) Enabled(context.Context, slog.Level) bool { return true }
func (h *logProbe) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *logProbe) WithGroup(string) slog.Handler            { return h }

func (h *logProbe) Handle(_ context.Context, r slog.Record) error {
	free := h.p.mu.TryLock()
	if free {
		h.p.mu.Unlock()
	}
	h.mu.Lock()
	h.lines = append(h.lines, r.Message)
	if !free {
		h.locked = append(h.locked, r.Message)
	}
	h.mu.Unlock()
	if r.Message == h.stall {
		<-h.release
	}
	return nil
}

func (h *logProbe) messages() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.lines)
}

// newLogProbePool is quietPool logging to a logProbe. Only the test and the
// deadlines it causes touch the pool, so a lock the probe finds held was
// held by the goroutine writing the line.
func newLogProbePool(cfg poolConfig, addrs ...string) (*testPool, *logProbe) {
	tp := quietPool(cfg, addrs...)
	h := &logProbe{p: tp.pool, release: make(chan struct{})}
	tp.log = slog.New(h)
	return tp, h
}

// TestPoolLogsAfterUnlocking takes the pool through every line it notes
// (but the sweep's closing of stalled connections, which needs real
// sockets), from its methods and from its deadlines, and checks that each
// was written after the lock was released: a handler that takes the lock,
// or one that blocks, must not deadlock or stall the pool.
func TestPoolLogsAfterUnlocking(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const a, b, c, d = "10.0.0.1:6443", "10.0.0.2:6443", "10.0.0.3:6443", "10.0.0.4:6443"
		cfg := defaultTestPool
		cfg.readyz, cfg.sweep = true, true
		tp, lines := newLogProbePool(cfg, a, b, c, d)
		defer tp.close()
		passed := checkResult{rtt: time.Millisecond, probed: true}
		// A failed probe begins when it is reported: the closing it makes
		// due then waits the drain timeout.
		failed := func() checkResult {
			return checkResult{rtt: time.Millisecond, probed: true, notReady: errNotReady, start: time.Now()}
		}
		unreachable := checkResult{err: errCheck}

		tp.update([]string{a, b})
		ua, ub := tp.upstream(a), tp.upstream(b)
		tp.reportCheck(ua, passed)
		tp.reportCheck(ub, passed)
		tp.reportCheck(ua, unreachable) // suspect
		tp.reportCheck(ua, unreachable) // unhealthy, not ready
		tp.reportCheck(ua, failed())    // healthy, still not ready: closing a's connections is due
		time.Sleep(cfg.drainTimeout)    // the closing, from a deadline
		synctest.Wait()
		tp.reportCheck(ua, passed) // ready
		tp.reportCheck(ua, failed())
		tp.reportCheck(ua, failed()) // not ready: closing due again
		tp.reportCheck(ua, passed)   // called off
		tp.attachLockChecked(t, ua)  // draining needs a connection
		tp.update([]string{b})
		tp.update([]string{a, b}) // re-added
		tp.update([]string{b})
		time.Sleep(cfg.drainTimeout) // the drain's end, from a deadline
		synctest.Wait()
		pc, _ := tp.attach(t, ub)
		tp.update([]string{c})
		tp.detach(ub, pc) // drained
		tp.update([]string{d})
		synctest.Wait()

		got := lines.messages()
		for _, want := range []string{
			"upstream added", "upstream ready", "upstream suspect: sweeping its connections", "upstream unhealthy",
			"upstream not ready", "upstream healthy",
			"upstream not ready while another is: closing its connections after the drain timeout",
			"closing connections of unready upstream", "closing of connections called off",
			"upstream draining", "upstream re-added, drain aborted", "drain timeout expired, closing connections",
			"upstream drained", "upstream removed",
		} {
			if !slices.Contains(got, want) {
				t.Errorf("log line %q: missing from %q", want, got)
			}
		}
		lines.mu.Lock()
		defer lines.mu.Unlock()
		if len(lines.locked) > 0 {
			t.Errorf("lines written with the pool's lock held: %q; want none", lines.locked)
		}
	})
}

// While a log line waits on its writer, the pool goes on: the lock is free,
// the state the line reports is published, and other calls get through.
func TestSlowLogWriterDoesNotStallPool(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const a = "10.0.0.1:6443"
		tp, lines := newLogProbePool(defaultTestPool, a)
		defer tp.close()
		lines.stall = "upstream added"
		release := sync.OnceFunc(func() { close(lines.release) })
		defer release() // before close, which would wait for the stalled line
		updated := make(chan struct{})
		go func() {
			tp.update([]string{a})
			close(updated)
		}()
		synctest.Wait() // update is writing its line
		if !slices.Contains(lines.messages(), "upstream added") {
			t.Fatal("update wrote no line")
		}
		if !tp.mu.TryLock() {
			t.Fatal("the pool's lock is held while a line waits on its writer")
		}
		tp.mu.Unlock()
		if u := tp.pick(nil); u == nil || u.addr != a {
			t.Errorf("pick while the line waits: got %v; want %s", u, a)
		}
		tp.reportCheck(tp.upstream(a), checkResult{rtt: time.Millisecond})
		select {
		case <-updated:
			t.Error("update returned before its line was written")
		default:
		}
		release()
		<-updated
	})
}

// TestHealthStep holds the transition function to the rules: the spec's
// failure threshold for connects and probes, and the deliberate
// differences (a failed connect of a ready upstream awaits a probe; a
// flapping upstream returns at most once per interval).
func TestHealthStep(t *testing.T) {
	now := time.Unix(2000, 0)
	rz, tcp := healthRules{readyz: true, interval: time.Second}, healthRules{interval: time.Second}
	passed := checkResult{rtt: time.Millisecond, probed: true}
	failed := checkResult{rtt: time.Millisecond, probed: true, notReady: errNotReady, start: time.Unix(1999, 0)}
	connected := checkResult{rtt: time.Millisecond} // a TCP check or client dial
	unreachable := checkResult{err: errCheck}
	ready := health{state: upReady, probed: true}
	tests := []struct {
		name  string
		from  health
		res   checkResult
		rules healthRules
		want  health // its lastHealthy is set below for a success
	}{
		{"a passing probe makes a new upstream ready", newHealth(rz), passed, rz, ready},
		{"a passing probe clears the streak and a failed connect", health{state: upAwaitingProbe, probed: true, probeFails: 1}, passed, rz, ready},
		{"one failed probe leaves a ready upstream ready, the last choice, and starts the grace", ready, failed, rz,
			health{state: upAwaitingProbe, probed: true, probeFails: 1, graceFrom: failed.start}},
		{"the second failed probe in a row: not ready, the grace's start kept", health{state: upAwaitingProbe, probed: true, probeFails: 1, graceFrom: now}, failed, rz,
			health{state: upNotReady, probed: true, probeFails: 2, graceFrom: now}},
		{"a failed first probe: not ready at once", newHealth(rz), failed, rz,
			health{state: upNotReady, probed: true, probeFails: 1, graceFrom: failed.start}},
		{"a failed probe after a failed connect: not ready at once", health{state: upAwaitingProbe, probed: true, fails: 1, suspect: true}, failed, rz,
			health{state: upNotReady, probed: true, probeFails: 1, graceFrom: failed.start, restored: now}},
		{"a not ready upstream stays so", health{state: upNotReady, probed: true, probeFails: 2}, failed, rz,
			health{state: upNotReady, probed: true, probeFails: 3}},
		{"a failed connect of a ready upstream keeps the verdict, awaiting a probe", health{state: upReady, probed: true, probeFails: 1}, unreachable, rz,
			health{state: upAwaitingProbe, probed: true, probeFails: 1, fails: 1, suspect: true}},
		{"a failed connect of a new upstream keeps it pending", newHealth(rz), unreachable, rz,
			health{state: upPending, fails: 1, suspect: true}},
		{"two failed connects: unhealthy, and not ready until a probe passes", health{state: upAwaitingProbe, probed: true, probeFails: 1, fails: 1, suspect: true}, unreachable, rz,
			health{state: upUnhealthy, probed: true, fails: 2, suspect: true}},
		{"a connect without a probe says nothing of readiness", health{state: upAwaitingProbe, probed: true, probeFails: 1}, connected, rz,
			health{state: upAwaitingProbe, probed: true, probeFails: 1}},
		{"an unhealthy upstream that connects is pending", health{state: upUnhealthy, fails: 2, suspect: true}, connected, rz,
			health{state: upPending, restored: now}},
		{"tcp: two failed connects make it unhealthy", health{state: upHealthy, fails: 1, suspect: true}, unreachable, tcp,
			health{state: upUnhealthy, fails: 2, suspect: true}},
		{"tcp: one failed connect leaves it healthy, suspect", newHealth(tcp), unreachable, tcp,
			health{state: upHealthy, fails: 1, suspect: true}},
		{"tcp: a probe result is not read", newHealth(tcp), failed, tcp, newHealth(tcp)},
		{"tcp: a success restores an unhealthy upstream", health{state: upUnhealthy, fails: 3, suspect: true}, connected, tcp,
			health{state: upHealthy, restored: now}},
		{"tcp: but within an interval of its last return it stays out", health{state: upUnhealthy, fails: 3, suspect: true, restored: now.Add(-time.Second / 2)}, connected, tcp,
			health{state: upUnhealthy, suspect: true, restored: now.Add(-time.Second / 2)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := tt.want
			if tt.res.err == nil {
				want.lastHealthy = now
			}
			if got := tt.from.step(tt.res, now, tt.rules); got != want {
				t.Errorf("got  %+v\nwant %+v", got, want)
			}
		})
	}
}

// drains_in_progress counts the removed upstreams whose connections are
// still draining, not those removed at once for want of connections, and
// drops as soon as a drain ends, whichever way.
func TestDrainsInProgress(t *testing.T) {
	const a, b, c, d = "10.0.0.1:6443", "10.0.0.2:6443", "10.0.0.3:6443", "10.0.0.4:6443"
	drain := defaultTestPool.drainTimeout
	for _, tt := range []struct {
		name string
		end  func(tp *testPool, ua *upstream, onA *proxyConn) // ends a's drain, not b's
	}{
		{"timeout", func(*testPool, *upstream, *proxyConn) { time.Sleep(drain - 10*time.Second) }},
		{"last connection", func(tp *testPool, ua *upstream, onA *proxyConn) { tp.detach(ua, onA) }},
		{"abort", func(tp *testPool, _ *upstream, _ *proxyConn) { tp.update([]string{a, c}) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tp := quietPool(defaultTestPool, a, b, c, d)
				defer tp.close()
				var got []float64
				drains := func() { got = append(got, testutil.ToFloat64(tp.m.drains)) }
				tp.update([]string{a, b, d})
				ua := tp.upstream(a)
				onA, _ := tp.attach(t, ua)
				tp.attach(t, tp.upstream(b))
				drains()
				tp.update([]string{b, c}) // a drains from 0 s; d, without connections, is removed at once
				drains()
				time.Sleep(10 * time.Second)
				tp.update([]string{c}) // b drains from 10 s
				drains()
				tt.end(tp, ua, onA)
				synctest.Wait()
				drains()
				if want := []float64{0, 1, 2, 1}; !slices.Equal(got, want) {
					t.Errorf("drains_in_progress with nothing removed, a draining, a and b, once a's drain ended: got %v; want %v", got, want)
				}
			})
		})
	}
}

// TestProbeJitter starts 40 upstreams at the same instant, as a fleet
// booted together adds them: every first check is at once, the second ones
// spread over the first interval, and each interval after them is
// shortened by up to 10 %, never lengthened, without all being equal: the
// first probe after an API server fails its /readyz comes at most one
// interval later. Without jitter the
// checks stay exactly one interval apart.
func TestProbeJitter(t *testing.T) {
	const iv = 10 * time.Second
	addrs := make([]string, 40)
	for i := range addrs {
		addrs[i] = "10.0.0." + strconv.Itoa(i+1) + ":6443"
	}
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		tp := poolOf(t, poolConfig{interval: iv, timeout: time.Second, drainTimeout: time.Second, jitter: 0.1}, addrs...)
		time.Sleep(5*iv + time.Second)
		synctest.Wait()
		var second []time.Duration
		gaps := map[time.Duration]bool{}
		for _, a := range addrs {
			at := tp.checks.times(a)
			if len(at) < 5 || !at[0].Equal(start) {
				t.Fatalf("%s: checks at %v; want the first at once and at least 5", a, at)
			}
			second = append(second, at[1].Sub(at[0]))
			for i := 2; i < len(at); i++ {
				gap := at[i].Sub(at[i-1])
				if gap < iv*9/10 || gap > iv {
					t.Errorf("%s: %v between checks %d and %d; want from 90%% of %v to %[4]v", a, gap, i-1, i, iv)
				}
				gaps[gap] = true
			}
		}
		if slices.Min(second) > iv/5 || slices.Max(second) < iv*4/5 {
			t.Errorf("second checks from %v to %v after the first; want them spread over %v", slices.Min(second), slices.Max(second), iv)
		}
		if len(gaps) < 10 {
			t.Errorf("%d distinct intervals; want them varied", len(gaps))
		}
	})
	synctest.Test(t, func(t *testing.T) {
		tp := poolOf(t, poolConfig{interval: iv, timeout: time.Second, drainTimeout: time.Second}, addrs[0])
		time.Sleep(3*iv + time.Second)
		synctest.Wait()
		at := tp.checks.times(addrs[0])
		for i := 1; i < len(at); i++ {
			if gap := at[i].Sub(at[i-1]); gap != iv {
				t.Errorf("without jitter: %v between checks; want %v", gap, iv)
			}
		}
	})
}
