//go:build linux

package main

import (
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"
)

// blackHole returns a loopback address whose SYNs are dropped: a listener
// with a backlog of 0 whose accept queue the test fills and never drains.
// Dials to it hang until their timeout, as to a powered-off node.
func blackHole(t *testing.T) string {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*unix.SockaddrInet4).Port))
	for range 8 {
		c, err := net.DialTimeout("tcp", addr, 300*time.Millisecond)
		if err != nil {
			return addr // the queue is full: this SYN was dropped
		}
		t.Cleanup(func() { _ = c.Close() })
	}
	t.Fatal("accept queue never filled")
	return ""
}

// TestHedgedDialRidesThroughBlackHole: with one of two upstreams a black
// hole, a client that drew it is served by the hedge within the hedge
// delay, and the dials that lost to the hedge are not the hole's failures.
func TestHedgedDialRidesThroughBlackHole(t *testing.T) {
	hole := blackHole(t)
	alive := startUpstream(t, echo)
	px := startProxy(t, poolConfig{}, hole, alive.addr)
	for i := range 12 {
		start := time.Now()
		c := dialProxy(t, px.addr)
		if err := roundTrip(c, []byte("hedged")); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		// Without hedging, a pick of the hole costs the 2 s dial timeout.
		if d := time.Since(start); d > time.Second {
			t.Errorf("connection %d took %v; want under 1 s with hedging", i, d)
		}
		_ = c.Close()
	}
	started := testutil.ToFloat64(px.m.hedgedDials)
	won := testutil.ToFloat64(px.m.hedgedWins)
	if started < 1 || won < 1 {
		t.Errorf("hedged dials started %v, won %v; want both at least 1", started, won)
	}
	if got := testutil.ToFloat64(px.m.connectionErrors.WithLabelValues(hole)); got != 0 {
		t.Errorf("connection_errors_total{hole}: got %v; want 0 for dials that lost a race", got)
	}
}

// TestHedgingOffWaitsForDialTimeout is the control: without hedging, a
// dial to the black hole holds the client for the whole dial timeout.
func TestHedgingOffWaitsForDialTimeout(t *testing.T) {
	hole := blackHole(t)
	alive := startUpstream(t, echo)
	px := startProxyDial(t, poolConfig{}, nil, hole, alive.addr)
	px.hedge = false
	px.pool.mu.Lock()
	u := px.pool.upstreams[alive.addr]
	px.pool.mu.Unlock()
	// Its first check, had it ended later, would include it again.
	waitFor(t, "the first check of the live upstream", func() bool { return checked(px.pool, u) })
	// Only the hole is pickable, so the first dial goes there.
	px.pool.reportCheck(u, checkResult{err: errCheck})
	px.pool.reportCheck(u, checkResult{err: errCheck})
	start := time.Now()
	c := dialProxy(t, px.addr)
	if err := roundTrip(c, []byte("slow")); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 2*time.Second {
		t.Errorf("without hedging the connection took %v; want the 2 s dial timeout first", d)
	}
}
