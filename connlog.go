package main

// Beyond the spec: how each proxied connection ended, as HAProxy's tcplog
// and stats give it. Every end is counted by upstream and reason
// (connections_closed_total) and, at debug level, logged in one line with
// its bytes each way; the bytes are counted as they pass
// (upstream_bytes_total).

import (
	"context"
	"errors"
	"log/slog"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// connEnd is how a proxied connection ended. The first to claim a
// connection's end wins (proxyConn.claim): a close the daemon forces
// (drain, eviction, sweep, idle, shutdown) or, for the rest, what the
// handler saw when the copies ended.
type connEnd uint32

const (
	connEndNone connEnd = iota
	connEndClientClosed
	connEndUpstreamClosed
	connEndReset
	connEndTimeout
	connEndError
	connEndDrain
	connEndEviction
	connEndSweep
	connEndIdle
	connEndShutdown
	connEndRebalance
	numConnEnds
)

// endNames are the reason label values, indexed by connEnd.
func endNames() [numConnEnds]string {
	return [numConnEnds]string{"", "client_closed", "upstream_closed", "reset", "timeout", "error",
		"drain", "eviction", "sweep", "idle", "shutdown", "rebalance"}
}

// connCounters are an upstream's byte and end counters, made with the
// upstream so that every series exists from the start (rates work from the
// first scrape) and an increment after its removal lands on a counter no
// longer exported.
type connCounters struct {
	toUpstream, toClient prometheus.Counter
	ends                 [numConnEnds]prometheus.Counter
}

func newConnCounters(m *metrics, addr string) connCounters {
	c := connCounters{
		toUpstream: m.upstreamBytes.WithLabelValues(addr, dirToUpstream),
		toClient:   m.upstreamBytes.WithLabelValues(addr, dirToClient),
	}
	for r := connEndNone + 1; r < numConnEnds; r++ {
		c.ends[r] = m.connsClosed.WithLabelValues(addr, endNames()[r])
	}
	return c
}

// claim records reason as pc's end and counts it, unless pc's end was
// claimed before.
func (pc *proxyConn) claim(reason connEnd) {
	if pc.ended.CompareAndSwap(uint32(connEndNone), uint32(reason)) {
		pc.owner.counters.ends[reason].Inc()
	}
}

// naturalEnd is how pc ended when the daemon did not close it: from the
// direction that ended first.
func naturalEnd(pc *proxyConn, first copyResult) connEnd {
	switch {
	case first.err == nil && first.src == pc.client:
		return connEndClientClosed
	case first.err == nil:
		return connEndUpstreamClosed
	case errors.Is(first.err, syscall.ETIMEDOUT):
		return connEndTimeout
	case errors.Is(first.err, syscall.ECONNRESET), errors.Is(first.err, syscall.EPIPE):
		return connEndReset
	}
	return connEndError
}

// connLogEvery and connLogBurst bound the debug lines of ended connections:
// a storm of reconnects must not fill the log queue, so past connLogBurst
// lines in connLogEvery the rest are only counted, and the next line says
// how many were left out.
const (
	connLogEvery = time.Second
	connLogBurst = 50
)

// logEnd logs pc's end at debug level, if debug is on and endsLog allows.
// Handlers of every connection share endsLog.
func (p *proxy) logEnd(ctx context.Context, pc *proxyConn, start time.Time, toUpstream, toClient int64) {
	if !p.log.Enabled(ctx, slog.LevelDebug) {
		return
	}
	suppressed, ok := p.endsLog.note(time.Now())
	if !ok {
		return
	}
	args := []any{"client", pc.client.RemoteAddr().String(), "upstream", pc.owner.addr,
		"duration", time.Since(start).Round(time.Millisecond), "to_upstream_bytes", toUpstream, "to_client_bytes", toClient,
		"end", endNames()[pc.ended.Load()]}
	if suppressed > 0 {
		args = append(args, "suppressed", suppressed)
	}
	p.log.DebugContext(ctx, "connection closed", args...)
}
