package main

// Beyond the spec: silent connections give way. Without it, local
// connections that send nothing held every slot for ever: a new client,
// the kubelet's among them, waited in the backlog and gave up, while each
// silent one also held a connection to an API server. A Kubernetes client
// speaks first (its TLS ClientHello, within milliseconds of connecting) and
// then never stays silent for long: client-go pings an HTTP/2 connection
// after 30 s without a frame. So, on Linux, where TCP_INFO says when a
// socket last carried data:
//
//   - When every slot is taken and a client waits, the proxy closes one
//     connection for it: one whose client has sent nothing since it
//     connected at least newQuietFor ago, the one that connected first;
//     else the one silent in both directions the longest, once for at least
//     spokenQuietFor. Where none qualifies, the owner of the most slots
//     gives one up (fairshare.go), and else the new client waits for a
//     slot.
//   - Any connection silent in both directions for idleTimeout is closed.

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"time"
)

const (
	// newQuietFor: a client that has sent nothing this long after
	// connecting is no Kubernetes client, or one that no longer needs the
	// connection.
	newQuietFor = time.Second
	// spokenQuietFor is twice client-go's HTTP/2 ping interval: a
	// connection in use is never silent as long.
	spokenQuietFor = time.Minute
	// idleTimeout is long enough for any client that pings, and short
	// enough that a silent connection to an API server is not held all day.
	idleTimeout = 10 * time.Minute
	// reclaimPoll is how often a client waiting for a slot looks again for
	// a connection to close.
	reclaimPoll = 250 * time.Millisecond

	// The reasons of idleConnsClosed.
	reasonLimit   = "limit"
	reasonTimeout = "timeout"
)

// idlePolicy is the proxy's copy of the constants above; tests shorten it.
type idlePolicy struct {
	newQuiet, spokenQuiet, timeout time.Duration
}

func defaultIdlePolicy() idlePolicy {
	return idlePolicy{newQuiet: newQuietFor, spokenQuiet: spokenQuietFor, timeout: idleTimeout}
}

// idleCandidate is a connection with what TCP_INFO says of its client
// socket: quiet and spoke of its look (see connLook).
type idleCandidate struct {
	pc *proxyConn
	connLook
}

// qualifies reports whether c may be closed to make room at the bound.
func (pol idlePolicy) qualifies(c idleCandidate) bool {
	if c.spoke {
		return c.quiet >= pol.spokenQuiet
	}
	return c.quiet >= pol.newQuiet
}

// giveWay orders candidates as they give way: silent clients first, then
// the one quiet longer.
func giveWay(a, b idleCandidate) int {
	switch {
	case a.spoke == b.spoke:
		return cmp.Compare(b.quiet, a.quiet)
	case a.spoke:
		return 1
	}
	return -1
}

// conns returns every attached connection.
func (p *pool) conns() []*proxyConn {
	p.mu.Lock()
	defer p.unlock()
	var all []*proxyConn
	for _, u := range p.upstreams {
		all = slices.AppendSeq(all, maps.Keys(u.conns))
	}
	return all
}

// allConns is conns, as a closer job's.
func (p *pool) allConns(func(*proxyConn) connLook) []*proxyConn { return p.conns() }

// candidates returns the attached connections whose client socket TCP_INFO
// describes, in the order they give way (stable, between equals);
// closed ones and, outside Linux, all are left out.
func (p *proxy) candidates() []idleCandidate {
	var out []idleCandidate
	for _, pc := range p.pool.conns() {
		if quiet, spoke, ok := quietFor(pc.client); ok {
			out = append(out, idleCandidate{pc, connLook{quiet: quiet, spoke: spoke}})
		}
	}
	slices.SortStableFunc(out, giveWay)
	return out
}

// reclaim closes the connection that gives way first to a waiting client,
// if one qualifies, which its handler then ends as any other failed one.
// Once closed it is no candidate any more, so a look before its slot is
// back closes the next one, not it again.
func (p *proxy) reclaim() {
	cands := p.candidates()
	if i := slices.IndexFunc(cands, p.idle.qualifies); i >= 0 {
		cands[i].pc.closeFor(connEndIdle)
		p.countIdle(&cands[i], reasonLimit)
	} else if victim, owner, held := shareVictim(cands, ownersOf(cands)); victim != nil {
		victim.pc.closeFor(connEndIdle)
		p.countIdle(victim, reasonShare, "owner", owner, "owner_slots", held)
	}
}

// reapIdle has the closer close connections silent for the idle timeout
// until ctx ends. It looks at each when its timeout would come, and at
// least every tenth of it for new connections: a connection is closed
// within 1.1 times it.
func (p *proxy) reapIdle(ctx context.Context) {
	p.pool.closer.add(&closeJob{reason: connEndIdle, conns: p.pool.allConns, due: p.idle.due, every: p.idle.timeout / 10,
		over: func() bool { return ctx.Err() != nil },
		closed: func(pc *proxyConn, look func() connLook) {
			p.countIdle(&idleCandidate{pc, look()}, reasonTimeout)
		}})
}

// due is the idle timeout's rule: pc has carried no data either way for
// it. Without TCP_INFO nothing is ever due.
func (pol idlePolicy) due(_ *proxyConn, now time.Time, look func() connLook) (bool, time.Time) {
	switch l := look(); {
	case !l.ok:
		return false, time.Time{}
	case l.quiet >= pol.timeout:
		return true, time.Time{}
	default:
		return false, now.Add(pol.timeout - l.quiet)
	}
}

// countIdle logs and counts the idle close of c's connection.
func (p *proxy) countIdle(c *idleCandidate, reason string, args ...any) {
	msg := "closing a silent connection"
	if reason == reasonShare {
		msg = "closing a connection of the owner of the most slots for a waiting client"
	}
	p.log.Debug(msg, append([]any{"reason", reason, "client", c.pc.client.RemoteAddr().String(),
		"silent", c.quiet.Round(time.Millisecond), "client_spoke", c.spoke}, args...)...)
	p.m.idleConnsClosed.WithLabelValues(reason).Inc()
}
