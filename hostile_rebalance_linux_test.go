package main

import (
	"io"
	"net"
	"testing"
	"testing/synctest"
	"time"
)

// answeredPair returns a proxy connection of real loopback sockets whose
// client has sent a request and read its answer, as a watch's has.
func answeredPair(t *testing.T) *proxyConn {
	t.Helper()
	client, accepted := tcpPair(t)
	_, upstream := tcpPair(t)
	// A request within replyLagMillis of the handshake would read as a
	// reaction to it (see TestQuietMoment).
	time.Sleep(20 * time.Millisecond)
	for _, c := range []net.Conn{client, accepted} { // the request, then its answer
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []net.Conn{accepted, client} {
		if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
	}
	return &proxyConn{client: accepted, upstream: upstream}
}

// TestHostileSilentConnectionsSteerTheRebalancer: two long-lived, answered
// connections on each of three upstreams, and 12 more on the first that
// never sent a byte, which a local process that read /upstreams piled
// there. The silent ones are never quiet, so the rebalancer cannot close
// them; counted, they made the first upstream look loaded, and it closed
// the legitimate connections there, one per period. Over ten periods none
// of them may close. The kernel's TCP_INFO of real sockets judges them.
func TestHostileSilentConnectionsSteerTheRebalancer(t *testing.T) {
	const perUpstream, silent = 2, 12
	addrs := []string{rbA, rbB, rbC}
	legit := make([]*proxyConn, 0, perUpstream*len(addrs))
	for range cap(legit) {
		legit = append(legit, answeredPair(t))
	}
	hoard := make([]*proxyConn, 0, silent)
	for range silent {
		_, accepted := tcpPair(t)
		_, upstream := tcpPair(t)
		hoard = append(hoard, &proxyConn{client: accepted, upstream: upstream})
	}
	waitFor(t, "the legitimate connections quiet", func() bool {
		for _, pc := range legit {
			if !quietNow(pc) {
				return false
			}
		}
		return true
	})
	synctest.Test(t, func(t *testing.T) {
		cfg := defaultTestPool
		cfg.rebalance = time.Minute // quiet is quietDue: the kernel's word
		tp := poolOf(t, cfg, addrs...)
		for _, pc := range hoard { // the oldest: the first to go, were they quiet
			tp.connected(tp.upstream(rbA), pc)
		}
		for i, pc := range legit {
			tp.connected(tp.upstream(addrs[i%len(addrs)]), pc)
		}
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		closed := 0
		for _, pc := range legit {
			if connEnd(pc.ended.Load()) == connEndRebalance {
				closed++
			}
		}
		hoardClosed := 0
		for _, pc := range hoard {
			if connEnd(pc.ended.Load()) == connEndRebalance {
				hoardClosed++
			}
		}
		st := tp.describe(nil)
		t.Logf("figures: %d legitimate connections (%d per upstream), %d never-spoken on %s; over 10 periods the rebalancer closed %d legitimate and %d never-spoken; /upstreams long_lived_connections %d/%d/%d",
			len(legit), perUpstream, silent, rbA, closed, hoardClosed, st[0].LongLived, st[1].LongLived, st[2].LongLived)
		if closed != 0 {
			t.Errorf("legitimate connections closed by the rebalancer: got %d; want 0", closed)
		}
		for _, s := range st {
			if s.LongLived != perUpstream {
				t.Errorf("long_lived_connections of %s: got %d; want %d (never-spoken ones left out)", s.Address, s.LongLived, perUpstream)
			}
		}
	})
}
