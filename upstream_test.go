package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

var errCheck = errors.New("test: connection refused")

// fakeChecks is a checkFunc whose result per address the test sets. An
// address set to block hangs until the check's deadline, like a black hole.
type fakeChecks struct {
	mu      sync.Mutex
	fail    map[string]bool
	block   map[string]bool
	calls   map[string]int
	callsAt map[string][]time.Time
}

func newFakeChecks() *fakeChecks {
	return &fakeChecks{fail: map[string]bool{}, block: map[string]bool{}, calls: map[string]int{}, callsAt: map[string][]time.Time{}}
}

func (f *fakeChecks) check(ctx context.Context, addr string) (time.Duration, error) {
	f.mu.Lock()
	f.calls[addr]++
	f.callsAt[addr] = append(f.callsAt[addr], time.Now())
	fail, block := f.fail[addr], f.block[addr]
	f.mu.Unlock()
	if block {
		<-ctx.Done()
		return 0, ctx.Err()
	}
	if fail {
		return 0, errCheck
	}
	return time.Millisecond, nil
}

func (f *fakeChecks) set(addr string, fail bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail[addr] = fail
}

func (f *fakeChecks) count(addr string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[addr]
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

var defaultTestPool = poolConfig{interval: 20 * time.Second, timeout: 15 * time.Second, drainTimeout: 30 * time.Second}

func TestHealthCheckStreak(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tp := newTestPool(defaultTestPool)
		defer tp.close()
		const a = "10.0.0.1:6443"
		tp.update([]string{a})
		synctest.Wait() // first check runs at once
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
	})
}

func TestClientDialsFeedTheSameStreak(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tp := newTestPool(defaultTestPool)
		defer tp.close()
		const a = "10.0.0.1:6443"
		tp.update([]string{a})
		synctest.Wait()
		u := tp.upstream(a)
		tp.report(u, errCheck) // a failed client dial
		tp.checks.set(a, true)
		time.Sleep(20 * time.Second) // then a failed check
		synctest.Wait()
		if got := tp.status(a); got != 0 {
			t.Errorf("after a failed dial and a failed check: got %v; want 0", got)
		}
		tp.report(u, nil) // a successful client dial re-includes it
		if got := tp.status(a); got != 1 {
			t.Errorf("after a successful dial: got %v; want 1", got)
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
		if got := tp.status(hole); got != 0 {
			t.Errorf("black-holed upstream: health_check_status got %v; want 0", got)
		}
		if got := tp.status(fine); got != 1 {
			t.Errorf("healthy upstream: health_check_status got %v; want 1", got)
		}
	})
}

func TestLocalExhaustionDoesNotFailUpstream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &syncBuffer{}
		m := newMetrics(prometheus.NewRegistry())
		emfile := func(context.Context, string) (time.Duration, error) {
			return 0, &net.OpError{Op: "dial", Err: errEMFILE()}
		}
		p := newPool(slog.New(slog.NewTextHandler(logs, nil)), m, defaultTestPool, emfile, randomSelector{})
		defer p.close()
		p.update([]string{"10.0.0.1:6443"})
		time.Sleep(100 * time.Second)
		synctest.Wait()
		if !p.ready() {
			t.Error("pool not ready after checks failed only with EMFILE")
		}
	})
}

// pipeConn returns a proxyConn over in-memory pipes and the far ends.
func pipeConn() (pc *proxyConn, clientEnd, upstreamEnd net.Conn) {
	c1, c2 := net.Pipe()
	u1, u2 := net.Pipe()
	return &proxyConn{client: c1, upstream: u1}, c2, u2
}

func isClosed(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(time.Millisecond))
	_, err := c.Read(make([]byte, 1))
	return err != nil && !errors.Is(err, errTimeout(err))
}

func TestDrainClosesAfterTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tp := newTestPool(defaultTestPool)
		defer tp.close()
		const a, b = "10.0.0.1:6443", "10.0.0.2:6443"
		tp.update([]string{a})
		synctest.Wait()
		pc, clientEnd, _ := pipeConn()
		if !tp.connected(tp.upstream(a), pc) {
			t.Fatal("connected to a healthy upstream failed")
		}
		tp.update([]string{b})
		checksBefore := tp.checks.count(a)
		time.Sleep(defaultTestPool.drainTimeout - time.Second)
		synctest.Wait()
		if isClosed(clientEnd) {
			t.Fatal("connection closed before the drain timeout")
		}
		if got := tp.checks.count(a); got != checksBefore {
			t.Errorf("checks of a draining upstream: got %d more; want none", got-checksBefore)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if !isClosed(clientEnd) {
			t.Fatal("connection still open after the drain timeout")
		}
		if tp.upstream(a) != nil {
			t.Error("drained upstream still in the pool")
		}
	})
}

func TestReAddAfterRemovalStartsFresh(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tp := newTestPool(poolConfig{interval: 20 * time.Second, timeout: 15 * time.Second, drainTimeout: 0})
		defer tp.close()
		const a, b = "10.0.0.1:6443", "10.0.0.2:6443"
		tp.update([]string{a, b})
		synctest.Wait()
		tp.upstream(a).errs.Inc()
		tp.update([]string{b})
		if n := testutil.CollectAndCount(tp.m.connectionErrors); n != 1 {
			t.Errorf("connection_errors_total series after removing a: got %d; want 1 (b only)", n)
		}
		tp.update([]string{a, b})
		if got := testutil.ToFloat64(tp.m.connectionErrors.WithLabelValues(a)); got != 0 {
			t.Errorf("connection_errors_total after re-add: got %v; want 0", got)
		}
		if got := tp.status(a); got != 1 {
			t.Errorf("health_check_status after re-add: got %v; want 1", got)
		}
	})
}

func TestLastResortOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tp := newTestPool(defaultTestPool)
		defer tp.close()
		addrs := []string{"10.0.0.1:6443", "10.0.0.2:6443", "10.0.0.3:6443"}
		tp.update(addrs)
		synctest.Wait()
		// Fail all three, the most recently healthy being 10.0.0.2.
		for _, addr := range []string{addrs[0], addrs[2], addrs[1]} {
			u := tp.upstream(addr)
			tp.report(u, nil)
			time.Sleep(time.Second)
			tp.report(u, errCheck)
			tp.report(u, errCheck)
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

func TestPickSkipsTried(t *testing.T) {
	a, b := &upstream{addr: "a"}, &upstream{addr: "b"}
	s := &snapshot{pickable: []*upstream{a, b}}
	for range 100 {
		if got := (randomSelector{}).pick(s, []*upstream{a}); got != b {
			t.Fatalf("pick with a tried: got %v; want b", got.addr)
		}
	}
	if got := (randomSelector{}).pick(s, []*upstream{a, b}); got != nil {
		t.Fatalf("pick with all tried: got %v; want nil", got.addr)
	}
	if got := (randomSelector{}).pick(&snapshot{}, nil); got != nil {
		t.Fatalf("pick from empty snapshot: got %v; want nil", got.addr)
	}
}
