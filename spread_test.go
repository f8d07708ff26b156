package main

import (
	"maps"
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// closeClock records when the pool closed each of a set of connections.
type closeClock struct {
	mu sync.Mutex
	at []time.Time
}

type clockedConn struct {
	net.Conn
	clock *closeClock
	once  sync.Once
}

func (c *clockedConn) Close() error {
	c.once.Do(func() {
		c.clock.mu.Lock()
		c.clock.at = append(c.clock.at, time.Now())
		c.clock.mu.Unlock()
	})
	return c.Conn.Close()
}

func (c *closeClock) times() []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Time(nil), c.at...)
}

// attachClocked attaches n connections to u whose closes clock records.
func (tp *testPool) attachClocked(t *testing.T, u *upstream, n int, clock *closeClock) {
	t.Helper()
	for range n {
		pc, _, _ := pipeConn()
		pc.client = &clockedConn{Conn: pc.client, clock: clock}
		if !tp.connected(u, pc) {
			t.Fatalf("connected to %s failed", u.addr)
		}
	}
}

// perBucket counts times in 100 ms buckets from start.
func perBucket(times []time.Time, start time.Time) map[int]int {
	b := map[int]int{}
	for _, at := range times {
		b[int(at.Sub(start)/(100*time.Millisecond))]++
	}
	return b
}

// A drain closes the upstream's connections spread over the last
// closeSpread of the drain timeout, one per slot of the window, and none
// after the timeout: a fleet that learnt of the removal together
// reconnects over the window, not in one instant, and no later than
// before.
func TestDrainClosesSpread(t *testing.T) {
	const a, b = "10.0.0.1:6443", "10.0.0.2:6443"
	for _, spread := range []time.Duration{0, 2 * time.Second} {
		synctest.Test(t, func(t *testing.T) {
			cfg := defaultTestPool
			cfg.closeSpread = spread
			tp := poolOf(t, cfg, a, b)
			var clock closeClock
			const conns = 20
			tp.attachClocked(t, tp.upstream(a), conns, &clock)
			removed := time.Now()
			tp.update([]string{b})
			time.Sleep(cfg.drainTimeout + time.Second)
			synctest.Wait()
			times := clock.times()
			if len(times) != conns {
				t.Fatalf("spread %v: %d of %d connections closed; want all", spread, len(times), conns)
			}
			from := removed.Add(cfg.drainTimeout - spread)
			worst := 0
			for bucket, n := range perBucket(times, from) {
				if bucket < 0 || time.Duration(bucket)*100*time.Millisecond > spread {
					t.Errorf("spread %v: %d closes %v after the window began; want all within it", spread, n, time.Duration(bucket)*100*time.Millisecond)
				}
				worst = max(worst, n)
			}
			if last := slices.MaxFunc(times, time.Time.Compare); last.After(removed.Add(cfg.drainTimeout)) {
				t.Errorf("spread %v: the last close came %v after the drain timeout; want none after it", spread, last.Sub(removed.Add(cfg.drainTimeout)))
			}
			want := conns
			if spread > 0 {
				want = 1
			}
			if worst != want {
				t.Errorf("spread %v: at most %d closes per 100 ms; want %d", spread, worst, want)
			}
			if tp.upstream(a) != nil {
				t.Error("drained upstream still in the pool after the drain timeout")
			}
		})
	}
}

// A drain taken back during the window stops the closing: the upstream's
// remaining connections stay.
func TestSpreadCalledOffByReAdd(t *testing.T) {
	const a, b = "10.0.0.1:6443", "10.0.0.2:6443"
	synctest.Test(t, func(t *testing.T) {
		cfg := defaultTestPool
		cfg.closeSpread = 2 * time.Second
		tp := poolOf(t, cfg, a, b)
		var clock closeClock
		const conns = 20
		tp.attachClocked(t, tp.upstream(a), conns, &clock)
		tp.update([]string{b})
		time.Sleep(cfg.drainTimeout - time.Second) // half the window gone
		synctest.Wait()
		tp.update([]string{a, b})
		closed := len(clock.times())
		time.Sleep(cfg.drainTimeout)
		synctest.Wait()
		if closed == 0 || closed == conns {
			t.Fatalf("half way through the window: %d of %d closed; want some", closed, conns)
		}
		if n := len(clock.times()); n != closed {
			t.Errorf("after the re-add: %d more closed; want none", n-closed)
		}
	})
}

// Shutdown does not wait for a spread: closeConns closes what is left at
// once, and the pool's close ends the closer.
func TestShutdownEndsSpread(t *testing.T) {
	const a, b = "10.0.0.1:6443", "10.0.0.2:6443"
	synctest.Test(t, func(t *testing.T) {
		cfg := defaultTestPool
		cfg.closeSpread = 2 * time.Second
		tp := newTestPool(cfg)
		tp.update([]string{a, b})
		synctest.Wait()
		var clock closeClock
		const conns = 20
		tp.attachClocked(t, tp.upstream(a), conns, &clock)
		tp.update([]string{b})
		time.Sleep(cfg.drainTimeout - 1500*time.Millisecond) // a quarter into the window
		synctest.Wait()
		if n := len(clock.times()); n == 0 || n == conns {
			t.Fatalf("half a second into the spread: %d of %d closed; want some, not all", n, conns)
		}
		stopped := time.Now()
		tp.closeConns()
		synctest.Wait()
		for _, at := range clock.times() {
			if at.After(stopped) {
				t.Errorf("a connection closed %v after shutdown began; want at once", at.Sub(stopped))
			}
		}
		if n := len(clock.times()); n != conns {
			t.Errorf("after closeConns: %d of %d closed; want all", n, conns)
		}
		tp.close()
	})
}

// An eviction (an unready upstream while another is ready) spreads its
// closes the same way, from the moment the drain timeout since the first
// failed probe ends.
func TestEvictionClosesSpread(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const a = "10.0.0.1:6443"
		cfg := readyzTestPool
		cfg.drainTimeout, cfg.closeSpread = 30*time.Second, 2*time.Second
		tp := poolOf(t, cfg, a, "10.0.0.2:6443")
		var clock closeClock
		const conns = 20
		tp.attachClocked(t, tp.upstream(a), conns, &clock)
		start := time.Now()
		tp.checks.setUnready(a, true)
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		times := clock.times()
		if len(times) != conns {
			t.Fatalf("%d of %d connections of the unready upstream closed; want all", len(times), conns)
		}
		// a's first failed probe is its check at 20 s: the grace ends at 50 s.
		if end := start.Add(20*time.Second + cfg.drainTimeout); slices.MaxFunc(times, time.Time.Compare).After(end) {
			t.Errorf("eviction: the last close came after the grace ended")
		}
		first, last := slices.MinFunc(times, time.Time.Compare), slices.MaxFunc(times, time.Time.Compare)
		// Buckets counted from the first close, not the window's start:
		// two closes of neighbouring slots may share one.
		worst := slices.Max(slices.Collect(maps.Values(perBucket(times, first))))
		if span := last.Sub(first); worst > 2 || span < cfg.closeSpread*3/4 || span >= cfg.closeSpread {
			t.Errorf("eviction closes: at most %d per 100 ms over %v; want at most 2 over most of %v", worst, span, cfg.closeSpread)
		}
	})
}

// A node with one connection to the upstream waits too, at a random moment
// of the window: a kubelet has one, and twenty nodes with one each stand
// for a fleet here, twenty upstreams of one pool with one connection each.
func TestSingleConnectionsSpread(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := defaultTestPool
		cfg.closeSpread = 2 * time.Second
		const nodes = 20
		var addrs []string
		for i := range nodes {
			addrs = append(addrs, "10.0.1."+strconv.Itoa(i+1)+":6443")
		}
		tp := poolOf(t, cfg, append(addrs, "10.0.0.2:6443")...)
		var clock closeClock
		for _, a := range addrs {
			tp.attachClocked(t, tp.upstream(a), 1, &clock)
		}
		removed := time.Now()
		tp.update([]string{"10.0.0.2:6443"})
		time.Sleep(cfg.drainTimeout)
		synctest.Wait()
		times := clock.times()
		if len(times) != nodes {
			t.Fatalf("%d of %d closed; want all", len(times), nodes)
		}
		// Twenty random moments in twenty 100 ms buckets: more than eight
		// in one has odds below 1 in 10,000; without the spread all
		// twenty share one.
		if worst := slices.Max(slices.Collect(maps.Values(perBucket(times, removed.Add(cfg.drainTimeout-cfg.closeSpread))))); worst > 8 {
			t.Errorf("single connections of %d upstreams: %d closed in one 100 ms; want them spread", nodes, worst)
		}
	})
}
