package main

import (
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestSkewed(t *testing.T) {
	tests := []struct {
		counts      []int
		most, least int
		ok          bool
	}{
		{nil, 0, 0, false},
		{[]int{5}, 0, 0, false},       // a single upstream
		{[]int{1, 0}, 0, 1, false},    // one apart: a move would only swap them
		{[]int{2, 0}, 0, 1, true},     // the most loaded keeps one
		{[]int{3, 0, 0}, 0, 1, true},  // kubelet, kube-proxy and CNI agent on one API server
		{[]int{1, 1, 1}, 0, 0, false}, // even
		{[]int{2, 1, 1}, 0, 1, false}, // as even as whole connections get
		{[]int{0, 4, 2}, 1, 0, true},  // the most loaded, wherever it is
		{[]int{6, 6, 4, 7}, 3, 2, true},
	}
	for _, tt := range tests {
		most, least, ok := skewed(tt.counts)
		if ok != tt.ok || (ok && (most != tt.most || least != tt.least)) {
			t.Errorf("skewed(%v) = %d, %d, %v; want %d, %d, %v", tt.counts, most, least, ok, tt.most, tt.least, tt.ok)
		}
	}
}

// rbPool is a test pool with the rebalancer on, every minute, and the
// connections it tracks: quiet says which may close, and run plays the
// proxy's handlers, reconnecting each closed connection's client to the
// upstream the pool picks.
type rbPool struct {
	*testPool
	t      *testing.T
	mu     sync.Mutex
	noisy  map[*proxyConn]bool
	conns  []*proxyConn
	closes []time.Time
	order  []*proxyConn // the closed connections, in closing order
	start  time.Time
}

func newRBPool(t *testing.T, cfg poolConfig, addrs ...string) *rbPool {
	rb := &rbPool{t: t, noisy: map[*proxyConn]bool{}, start: time.Now()}
	cfg.rebalance = time.Minute
	cfg.quiet = func(pc *proxyConn, now time.Time, _ func() connLook) (bool, time.Time) {
		rb.mu.Lock()
		defer rb.mu.Unlock()
		return !rb.noisy[pc], now.Add(rebalanceQuiet / 4)
	}
	rb.testPool = poolOf(t, cfg, addrs...)
	return rb
}

// attach connects n clients to addr, and marks them noisy if asked.
func (rb *rbPool) attach(addr string, n int, noisy bool) {
	for range n {
		pc, _ := rb.testPool.attach(rb.t, rb.upstream(addr))
		rb.mu.Lock()
		rb.conns = append(rb.conns, pc)
		rb.noisy[pc] = noisy
		rb.mu.Unlock()
	}
}

// run advances time by d in steps of a second, reconnecting the clients
// of the connections the rebalancer closed.
func (rb *rbPool) run(d time.Duration) {
	for end := time.Now().Add(d); time.Now().Before(end); {
		time.Sleep(time.Second)
		synctest.Wait()
		var closed []*proxyConn
		rb.mu.Lock()
		kept := rb.conns[:0]
		for _, pc := range rb.conns {
			if connEnd(pc.ended.Load()) == connEndRebalance {
				closed = append(closed, pc)
				rb.closes = append(rb.closes, time.Now())
				rb.order = append(rb.order, pc)
			} else {
				kept = append(kept, pc)
			}
		}
		rb.conns = kept
		rb.mu.Unlock()
		for _, pc := range closed {
			rb.detach(pc.owner, pc)
			rb.attach(rb.pick(nil).addr, 1, false)
		}
	}
}

func (rb *rbPool) counts(addrs ...string) []int {
	rb.pool.mu.Lock()
	defer rb.pool.mu.Unlock()
	var out []int
	for _, a := range addrs {
		out = append(out, len(rb.upstreams[a].conns))
	}
	return out
}

func (rb *rbPool) rebalanceCloses(addr string) float64 {
	return testutil.ToFloat64(rb.m.connsClosed.WithLabelValues(addr, "rebalance"))
}

const (
	rbA = "10.0.0.1:6443"
	rbB = "10.0.0.2:6443"
	rbC = "10.0.0.3:6443"
)

// TestRebalanceSpreadsOldestFirst: four connections on one of three
// upstreams are spread 2/1/1 by two closes, the oldest connections first,
// no sooner than the settle time after the start, at most one per period
// (jittered by a quarter), each logged and counted.
func TestRebalanceSpreadsOldestFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rb := newRBPool(t, defaultTestPool, rbA, rbB, rbC)
		start := time.Now()
		var first []*proxyConn
		for range 4 {
			rb.attach(rbA, 1, false)
			first = append(first, rb.conns[len(rb.conns)-1])
			time.Sleep(time.Second)
		}
		rb.run(10 * time.Minute)
		if got := rb.counts(rbA, rbB, rbC); got[0] != 2 || got[1] != 1 || got[2] != 1 {
			t.Errorf("connections after 10 minutes: got %v; want [2 1 1]", got)
		}
		if len(rb.closes) != 2 {
			t.Fatalf("closes: got %d; want 2", len(rb.closes))
		}
		if rb.closes[0].Sub(start) < rebalanceSettle {
			t.Errorf("first close %v after the start; want at least the settle time %v", rb.closes[0].Sub(start), rebalanceSettle)
		}
		if gap := rb.closes[1].Sub(rb.closes[0]); gap < 45*time.Second {
			t.Errorf("closes %v apart; want at least three quarters of the period", gap)
		}
		if rb.order[0] != first[0] || rb.order[1] != first[1] {
			t.Errorf("closed connections: got %p, %p; want the two oldest, %p, %p", rb.order[0], rb.order[1], first[0], first[1])
		}
		if got := rb.rebalanceCloses(rbA); got != 2 {
			t.Errorf("connections_closed_total{reason=rebalance} of %s: got %v; want 2", rbA, got)
		}
		if got := strings.Count(rb.logs.String(), "closing a long-lived connection to rebalance"); got != 2 {
			t.Errorf("rebalance log lines: got %d; want 2", got)
		}
	})
}

// TestRebalanceSteersTheReconnect: for rebalanceSteer after a rebalancing
// close, new connections go to the upstream with the fewest long-lived
// connections, so that the closed one's client moves there; a retry of a
// failed dial, and every connection after the window, is picked at random.
func TestRebalanceSteersTheReconnect(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rb := newRBPool(t, defaultTestPool, rbA, rbB, rbC)
		rb.attach(rbA, 3, false)
		rb.attach(rbB, 2, false)
		for len(rb.closes) == 0 && time.Since(rb.start) < 10*time.Minute {
			rb.run(time.Second) // the reconnect goes where pick sends it
		}
		if len(rb.closes) != 1 {
			t.Fatalf("no rebalancing close in 10 minutes")
		}
		if got := rb.counts(rbA, rbB, rbC); got[0] != 2 || got[1] != 2 || got[2] != 1 {
			t.Errorf("connections after the close: got %v; want [2 2 1], the client moved to %s", got, rbC)
		}
		if got := picks(rb.pool, 100); got[rbC] != 100 {
			t.Errorf("picks within %v of the close: %v; want %s only", rebalanceSteer, got, rbC)
		}
		if u := rb.pick([]*upstream{rb.upstream(rbC)}); u == nil || u.addr == rbC {
			t.Errorf("a retry after a failed dial to %s picked %v; want another upstream", rbC, u)
		}
		time.Sleep(rebalanceSteer)
		if got := picks(rb.pool, 300); got[rbA] < 50 || got[rbB] < 50 || got[rbC] < 50 {
			t.Errorf("picks after the window: %v; want all three", got)
		}
	})
}

// TestRebalanceLeavesAlone covers the cases where nothing may move.
func TestRebalanceLeavesAlone(t *testing.T) {
	tests := []struct {
		name  string
		addrs []string
		setup func(rb *rbPool)
	}{
		{"a single upstream", []string{rbA}, func(rb *rbPool) { rb.attach(rbA, 5, false) }},
		{"two of three unhealthy", []string{rbA, rbB, rbC}, func(rb *rbPool) {
			rb.checks.set(rbB, true)
			rb.checks.set(rbC, true)
			rb.attach(rbA, 5, false)
		}},
		{"never quiet", []string{rbA, rbB, rbC}, func(rb *rbPool) { rb.attach(rbA, 5, true) }},
		{"one apart", []string{rbA, rbB}, func(rb *rbPool) { rb.attach(rbA, 3, false); rb.attach(rbB, 2, false) }},
		{"young connections", []string{rbA, rbB}, func(rb *rbPool) {
			rb.run(9*time.Minute + 40*time.Second)
			rb.attach(rbA, 5, false) // younger than half a period to the end
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rb := newRBPool(t, defaultTestPool, tt.addrs...)
				end := time.Now().Add(10 * time.Minute)
				tt.setup(rb)
				rb.run(time.Until(end))
				if len(rb.closes) != 0 {
					t.Errorf("closes: got %d; want none", len(rb.closes))
				}
			})
		})
	}
}

// TestRebalanceWaitsForFlappingUpstream: an upstream that comes and goes
// more often than the settle time never receives a moved connection: while
// it is down it takes none, and while it is up it has not settled.
func TestRebalanceWaitsForFlappingUpstream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rb := newRBPool(t, defaultTestPool, rbA, rbB)
		rb.attach(rbA, 4, false)
		for i := range 12 {
			rb.checks.set(rbB, i%2 == 0)
			rb.run(50 * time.Second)
		}
		if len(rb.closes) != 0 {
			t.Errorf("closes while %s flapped: got %d; want none", rbB, len(rb.closes))
		}
	})
}

// TestRebalanceSettleTime: an upstream restored after a fault takes moved
// connections only once it has been healthy for the settle time.
func TestRebalanceSettleTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rb := newRBPool(t, defaultTestPool, rbA, rbB)
		rb.checks.set(rbB, true)
		rb.attach(rbA, 4, false)
		rb.run(5 * time.Minute)
		rb.checks.set(rbB, false)
		rb.run(25 * time.Second) // the next check restores it
		u := rb.upstream(rbB)
		rb.pool.mu.Lock()
		restored, state := u.shownSince, u.shown
		rb.pool.mu.Unlock()
		if state != stateHealthy {
			t.Fatalf("%s: got %s; want healthy again", rbB, state)
		}
		rb.run(4 * time.Minute)
		if len(rb.closes) == 0 {
			t.Fatalf("no close within 4 minutes of the restore")
		}
		if d := rb.closes[0].Sub(restored); d < rebalanceSettle {
			t.Errorf("first close %v after the restore; want at least %v", d, rebalanceSettle)
		}
	})
}

// TestRebalanceNotDuringDrain: while an upstream drains, nothing moves.
func TestRebalanceNotDuringDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := defaultTestPool
		cfg.drainTimeout = time.Hour
		rb := newRBPool(t, cfg, rbA, rbB, rbC)
		rb.attach(rbA, 4, false)
		rb.attach(rbC, 1, false)
		rb.update([]string{rbA, rbB}) // rbC drains for an hour
		rb.run(10 * time.Minute)
		if len(rb.closes) != 0 {
			t.Errorf("closes during a drain: got %d; want none", len(rb.closes))
		}
	})
}
