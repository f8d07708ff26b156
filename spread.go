package main

// Beyond the spec: the connections of a draining or unready upstream close
// spread over the last part of their grace instead of in one instant at its
// end. Every node of a fleet learns of a removed API server from the same
// watch event, so their drains end together, and every kubelet,
// kube-proxy and CNI agent would reconnect to the survivors in the same
// 100 ms (e2e/cmd/fleet -fault). The window ends where the grace did, so
// nothing moves later than before.

import (
	"maps"
	"math/rand/v2"
	"slices"
	"time"
)

// closeSpread is the daemon's poolConfig.closeSpread: two seconds spread a
// fleet's reconnects over twenty times the 100 ms they would share.
const closeSpread = 2 * time.Second

// spreadWindow is the part of a grace over which its connections close:
// its last closeSpread, and at most half of it, so each connection keeps
// at least half the grace --drain-timeout gives.
func (p *pool) spreadWindow() time.Duration {
	return min(p.cfg.closeSpread, p.cfg.drainTimeout/2)
}

// closeSpreadLocked closes u's connections over window, each at a random
// moment of its own slot of it (in the map's random order), so one node's
// closes are even and a fleet's are random; one connection waits too, as a
// kubelet has one. A drain taken back or an upstream ready again stops the
// closing: it goes on while u drains, or is evicted, as when it began.
// Shutdown (closeConns) closes the rest at once; on a closed pool they close
// at once. p.mu must be held.
func (p *pool) closeSpreadLocked(u *upstream, window time.Duration, reason connEnd) {
	conns := slices.Collect(maps.Keys(u.conns))
	if window <= 0 || len(conns) == 0 || p.closed {
		for _, pc := range conns {
			pc.closeFor(reason)
		}
		return
	}
	start, slot := time.Now(), window/time.Duration(len(conns))
	at := make(map[*proxyConn]time.Time, len(conns))
	for i, pc := range conns {
		at[pc] = start.Add(time.Duration(i)*slot + rand.N(slot)) //nolint:gosec // spreading needs no unpredictability
	}
	p.closer.add(&closeJob{reason: reason,
		conns: func(func(*proxyConn) connLook) []*proxyConn { return conns },
		due: func(pc *proxyConn, now time.Time, _ func() connLook) (bool, time.Time) {
			return !now.Before(at[pc]), at[pc]
		},
		over: func() bool {
			p.mu.Lock()
			defer p.mu.Unlock()
			return u.h.state < upDraining && !u.evicted
		}})
}
