package main

// Beyond the spec: long-lived connections find their way back after a
// recovery. A kubelet's, kube-proxy's or CNI agent's HTTP/2 connection
// carries its watches for days, so after a failover it stays on the API
// server it moved to: after a rolling restart of the control plane, the
// API server restarted last carries almost none of the fleet's watches.
// Every period (jittered), while the node's long-lived connections are
// skewed across the upstreams new connections go to, the rebalancer
// closes one connection of the most loaded upstream at a moment its client
// has been answered and nothing is in flight; the client reconnects
// through the balancer and its watches resume from their resource
// version.

import (
	"cmp"
	"log/slog"
	"slices"
	"time"
)

const (
	// defaultRebalancePeriod bounds the closes: at most one per node per
	// period. A fleet of 5,000 skewed nodes then reconnects about 80
	// clients a second across its API servers, a fraction of what their
	// probes cost, and a node with three clients (kubelet, kube-proxy, CNI
	// agent) is spread again within a few minutes of the last restart.
	defaultRebalancePeriod = time.Minute
	// rebalanceSettle: while an upstream new connections go to has been
	// usable for less than this, nothing moves: one that flaps, or has just
	// restarted and takes the fleet's reconnects, proves itself first.
	rebalanceSettle = 2 * time.Minute
	// rebalanceQuiet: how long a connection's client must have been
	// answered, with nothing unacknowledged either way, before it closes:
	// no request is in flight on it then (see infoAnswered). Longer than an
	// HTTP/2 client's reaction and its pause between the requests it has
	// ready; short enough that a watch with an event every half second
	// (the e2e workload's) still has quiet moments.
	rebalanceQuiet = 200 * time.Millisecond
	// rebalanceWait: how long each period waits for such a moment. A
	// connection that is never quiet is never closed.
	rebalanceWait = 10 * time.Second
	// rebalanceSteer: how long after a rebalancing close new connections
	// go to the upstream with the fewest long-lived connections, so that
	// the closed connection's client, reconnecting, moves there: with
	// random selection two closes in three moved nothing. Longer than a
	// client-go reflector's backoff after a broken watch (up to 1.6 s);
	// the short requests sent there meanwhile change no balance.
	rebalanceSteer = 2 * time.Second
)

// steer is where new connections go until a time (see rebalanceSteer).
type steer struct {
	to    *upstream
	until time.Time
}

// steered returns the upstream a recent rebalancing close steers a first
// dial to, or nil: none, the time is up, or it is no longer among the
// most preferred pickable upstreams.
func (p *pool) steered(groups [][]*upstream, tried []*upstream) *upstream {
	s := p.steer.Load()
	if s == nil || len(tried) > 0 || len(groups) == 0 || !slices.Contains(groups[0], s.to) || time.Now().After(s.until) {
		return nil
	}
	return s.to
}

// quietDue is the daemon's poolConfig.quiet: pc's client has been answered
// for rebalanceQuiet and neither socket holds unacknowledged bytes.
func quietDue(_ *proxyConn, now time.Time, look func() connLook) (bool, time.Time) {
	if look().queued {
		return false, now.Add(rebalanceQuiet / 4)
	}
	return answeredDue(rebalanceQuiet, now, look)
}

// rebalanceLater has the closer look for a connection to move one period
// from now, varied by up to a quarter either way so a fleet's nodes do not
// act together; each look schedules the next when it ends, so the
// rebalancer runs until the closer stops (shutdown, or the pool's close).
func (p *pool) rebalanceLater() {
	p.closer.add(&closeJob{deadline: time.Now().Add(jitter(p.cfg.rebalance, p.cfg.rebalance/4)), end: p.rebalanceOnce})
}

// rebalanceOnce closes at most one connection: the oldest long-lived one
// of the most loaded upstream that is quiet within rebalanceWait, while the
// skew lasts.
func (p *pool) rebalanceOnce() {
	var from, to *upstream
	p.closer.add(&closeJob{reason: connEndRebalance, due: p.cfg.quiet, deadline: time.Now().Add(rebalanceWait), limit: 1, end: p.rebalanceLater,
		conns: func(look func(*proxyConn) connLook) []*proxyConn {
			var conns []*proxyConn
			from, to, conns = p.rebalanceCandidates(time.Now(), look)
			return conns
		},
		closed: func(pc *proxyConn, _ func() connLook) {
			p.steer.Store(&steer{to: to, until: time.Now().Add(rebalanceSteer)})
			p.mu.Lock()
			defer p.unlock()
			p.note(from, slog.LevelInfo, "closing a long-lived connection to rebalance", "client", pc.client.RemoteAddr().String(),
				"age", time.Since(pc.since).Round(time.Second), "connections", len(from.conns), "to", to.addr)
		}})
}

// rebalanceCandidates returns the upstream to take a connection from, the
// one to steer its client to, and the first's long-lived connections,
// oldest first; no connections while nothing is to move: fewer than two
// upstreams take new connections, one of them became usable less than
// rebalanceSettle ago, a drain or an eviction is under way, or the
// connections are not skewed.
func (p *pool) rebalanceCandidates(now time.Time, look func(*proxyConn) connLook) (from, to *upstream, conns []*proxyConn) {
	p.mu.Lock()
	defer p.unlock()
	for _, u := range p.upstreams {
		// A closed pool publishes nothing more, so with upstreams left it
		// stops here, and without any it has no groups below.
		if p.closed || u.h.state == upDraining || u.evicted || u.evict.pending() {
			return nil, nil, nil
		}
	}
	s := p.snap.Load()
	if len(s.groups) == 0 {
		return nil, nil, nil
	}
	counts := make([]int, 0, len(s.groups[0]))
	for _, u := range s.groups[0] {
		if (u.shown != stateHealthy && u.shown != stateReady) || now.Sub(u.shownSince) < rebalanceSettle {
			return nil, nil, nil
		}
		counts = append(counts, len(p.longLived(u, now, look)))
	}
	most, least, ok := skewed(counts)
	if !ok {
		return nil, nil, nil
	}
	from, to = s.groups[0][most], s.groups[0][least]
	conns = p.longLived(from, now, look)
	slices.SortFunc(conns, func(a, b *proxyConn) int { return a.since.Compare(b.since) })
	return from, to, conns
}

// skewed returns the indexes of the most and the least loaded of counts,
// and whether the first holds at least two more than the second: only
// then does one close leave the two closer, never emptier than one, and
// never the other way round. Fewer than two counts are never skewed.
func skewed(counts []int) (most, least int, ok bool) {
	if len(counts) < 2 {
		return 0, 0, false
	}
	for i, n := range counts {
		if n > counts[most] {
			most = i
		}
		if n < counts[least] {
			least = i
		}
	}
	return most, least, counts[most] >= counts[least]+2
}

// longLived returns u's connections older than half a period (see below)
// whose client has spoken. One that never sent a byte is never quiet (see
// quietDue), so it never closes: counted, a local process that piled such
// connections on one upstream had the rebalancer close the real watches
// there, one per period (issue 44). Where TCP_INFO cannot tell (outside Linux, no TCP
// socket), a connection counts. p.mu must be held.
//
// The age that counts is half a period (without the rebalancer, of the
// default one). Short requests end long before; the clients' watch
// connections last for hours. Periods are at least three quarters of one
// apart, so the client of a connection closed at one has reconnected and
// counts at the next: a longer age would hide it, and the next period
// would close another for nothing.
func (p *pool) longLived(u *upstream, now time.Time, look func(*proxyConn) connLook) []*proxyConn {
	var out []*proxyConn
	age := cmp.Or(p.cfg.rebalance, defaultRebalancePeriod) / 2
	for pc := range u.conns {
		if now.Sub(pc.since) < age {
			continue
		}
		if l := look(pc); l.spoke || !l.ok {
			out = append(out, pc)
		}
	}
	return out
}
