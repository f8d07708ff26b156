//go:build linux

package main

import (
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"
)

// swept is a proxy with the sweep on in front of an echo upstream, and one
// connection through it.
type swept struct {
	up     *testUpstream
	px     *testProxy
	u      *upstream // up's pool entry
	client net.Conn
	upConn net.Conn // the proxy's socket to up
}

func newSwept(t *testing.T) swept {
	t.Helper()
	up := startUpstream(t, echo)
	px := startProxy(t, poolConfig{sweep: true}, up.addr)
	c := dialProxy(t, px.addr)
	if err := roundTrip(c, []byte("x")); err != nil {
		t.Fatal(err)
	}
	px.pool.mu.Lock()
	u := px.pool.upstreams[up.addr]
	px.pool.mu.Unlock()
	// The upstream's first check, started when it was listed, must not
	// end a suspicion the test starts, nor start one of its own later.
	waitFor(t, "the upstream's first health check", func() bool { return checked(px.pool, u) })
	px.pool.mu.Lock()
	defer px.pool.mu.Unlock()
	for pc := range u.conns {
		return swept{up: up, px: px, u: u, client: c, upConn: pc.upstream}
	}
	t.Fatal("no connection attached to the upstream")
	return swept{}
}

// TestSuspectUpstreamSocketsSwitchToSweepSettings: a failed check makes
// the upstream suspect and switches its sockets to 1 s keepalive (3 probes
// 1 s apart) and a 3 s user timeout, with the look at stalled connections
// pending; the next success switches them back and calls the look off.
func TestSuspectUpstreamSocketsSwitchToSweepSettings(t *testing.T) {
	sw := newSwept(t)
	check := func(when string, idle, interval, userTimeout int, lookPending bool) {
		t.Helper()
		for _, o := range []struct {
			name      string
			opt, want int
		}{
			{"TCP_KEEPIDLE", unix.TCP_KEEPIDLE, idle},
			{"TCP_KEEPINTVL", unix.TCP_KEEPINTVL, interval},
			{"TCP_USER_TIMEOUT", unix.TCP_USER_TIMEOUT, userTimeout},
		} {
			if got := sockOpt(t, sw.upConn, unix.IPPROTO_TCP, o.opt); got != o.want {
				t.Errorf("%s: %s got %d; want %d", when, o.name, got, o.want)
			}
		}
		sw.px.pool.mu.Lock()
		pending := sw.u.sweep.pending()
		sw.px.pool.mu.Unlock()
		if pending != lookPending {
			t.Errorf("%s: the look at stalled connections pending: got %v; want %v", when, pending, lookPending)
		}
	}
	// The dial leaves TCP_KEEPCNT alone: TCP_USER_TIMEOUT overrides it.
	check("normal", 30, 15, 30000, false)
	sw.px.pool.reportCheck(sw.u, checkResult{err: errCheck})
	check("after one failed check", 1, 1, 3000, true)
	if got := sockOpt(t, sw.upConn, unix.IPPROTO_TCP, unix.TCP_KEEPCNT); got != 3 {
		t.Errorf("TCP_KEEPCNT while suspect: got %d; want 3", got)
	}
	sw.px.pool.reportCheck(sw.u, checkResult{rtt: time.Millisecond})
	check("after recovery", 30, 15, 30000, false)
}

// TestSweepSparesLiveConnections checks that the sweep's look at stalled
// connections, stalledAfter into a suspicion, leaves the connections of a
// live upstream alone: a busy one, with data in flight, and an idle one,
// whose keepalive probes the upstream answers. (TestStalledInfo covers the
// criterion rule by rule.)
func TestSweepSparesLiveConnections(t *testing.T) {
	t.Parallel() // waits out stalledAfter on a proxy of its own
	sw := newSwept(t)
	idle := dialProxy(t, sw.px.addr)
	if err := roundTrip(idle, []byte("x")); err != nil {
		t.Fatal(err)
	}
	pl := sw.px.pool
	pl.reportCheck(sw.u, checkResult{err: errCheck})
	msg := make([]byte, 64<<10)
	for end := time.Now().Add(stalledAfter + time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if err := roundTrip(sw.client, msg); err != nil {
			t.Fatalf("busy connection while its upstream is suspect: %v", err)
		}
	}
	if err := roundTrip(idle, []byte("y")); err != nil {
		t.Fatalf("idle connection after the sweep's look: %v", err)
	}
	pl.mu.Lock()
	looked := sw.u.h.suspect && !sw.u.sweep.pending()
	pl.mu.Unlock()
	if !looked {
		t.Error("the upstream's suspicion ended before the sweep looked at its connections")
	}
	if got := testutil.ToFloat64(sw.px.m.deadConnsClosed); got != 0 {
		t.Errorf("dead connections counted: %v; want 0", got)
	}
}

func checked(pl *pool, u *upstream) bool {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return !u.lastCheck.IsZero()
}

func TestStalledInfo(t *testing.T) {
	stalled := unix.TCPInfo{State: unix.BPF_TCP_ESTABLISHED, Unacked: 2, Backoff: 3, Last_ack_recv: 4000}
	for _, tc := range []struct {
		name string
		edit func(*unix.TCPInfo)
		want time.Duration
	}{
		{"retransmitting without an ACK", func(*unix.TCPInfo) {}, 4 * time.Second},
		{"after its FIN", func(ti *unix.TCPInfo) { ti.State = unix.BPF_TCP_FIN_WAIT1 }, 4 * time.Second},
		{"nothing unacknowledged", func(ti *unix.TCPInfo) { ti.Unacked = 0 }, 0},
		{"not yet retransmitted", func(ti *unix.TCPInfo) { ti.Backoff = 0 }, 0},
		{"closed by the kernel", func(ti *unix.TCPInfo) { ti.State = unix.BPF_TCP_CLOSE }, 0},
		{"recent ACK", func(ti *unix.TCPInfo) { ti.Last_ack_recv = 200 }, 200 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ti := stalled
			tc.edit(&ti)
			if got := stalledInfo(&ti); got != tc.want {
				t.Errorf("got %v; want %v", got, tc.want)
			}
		})
	}
}
