package main

// Beyond the spec: what keeps the health server answerable under local
// abuse. The kubelet restarts the daemon after three failed probes, which
// drops every proxied connection on the node, so a flood of connections to
// the health port must never delay a probe: connections that send nothing
// are kept away (TCP_DEFER_ACCEPT), the open ones are capped without the
// accept loop ever waiting (connCap), each with a small send buffer
// (healthSendBuffer), a request's body is never waited for (dropBodies),
// and accept errors are retried (steadylistener.go).

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

const (
	// healthMaxConns bounds the open connections (see connCap). Each costs
	// about 19 KiB (a goroutine, its buffers, the socket): unbounded, 7,000
	// idle keep-alive connections from one local process once took 150 MB,
	// past the pod's limit, and the OOM kill dropped every proxied
	// connection on the node. 128 fit in the descriptor reserve (fdReserve)
	// with room for the probes and discovery.
	healthMaxConns = 128
	// healthStallAfter is how long a connection may stay inside a request,
	// or unread, before connCap takes it for one that waits on its client.
	// A probe is answered in milliseconds, a scrape in a few.
	healthStallAfter = time.Second
	// healthBlockedAfter is how long a read or write may be under way
	// before connCap takes it for one waiting on the client: on loopback
	// one that does not wait takes microseconds, and an answer cut in the
	// middle of its write by an eviction would be wasted.
	healthBlockedAfter = 100 * time.Millisecond
	// healthSendBuffer is each connection's SO_SNDBUF (the kernel doubles
	// it for its bookkeeping). Autotuned, the send queues of 128 clients
	// that never read reached 44 MiB, charged to the pod's memory limit;
	// this holds them to 128 × 8 KiB = 1 MiB. Small also means a client
	// that pipelines requests and never reads gets few answers, each a
	// write, before it blocks: the server spends little on it. A reading
	// client, such as Prometheus taking a 12 KiB page, does not notice.
	healthSendBuffer = 4 << 10
	// healthRecvBuffer is the listener's SO_RCVBUF, which the sockets it
	// accepts inherit: autotuned, what 400 pipelining clients sent ahead
	// of their answers queued 13 MiB in the server's receive queues. A
	// request is a few hundred bytes, its headers at most the server's
	// MaxHeaderBytes, which a smaller window only paces.
	healthRecvBuffer = 4 << 10
)

// listenHealth opens the health server's listener, with TCP_DEFER_ACCEPT
// and a small receive buffer where the kernel has them.
func listenHealth(ctx context.Context, addr string) (net.Listener, error) {
	return (&net.ListenConfig{Control: healthListenerOptions}).Listen(ctx, "tcp", addr) // an error names the address
}

// activatedHealthListener gives a listener the service manager opened, or
// the running instance handed over, the options of listenHealth.
func activatedHealthListener(ln *net.TCPListener) net.Listener {
	if rc, err := ln.SyscallConn(); err == nil {
		_ = healthListenerOptions("", "", rc)
	}
	return ln
}

// healthListenerOptions sets the health listener's options, best effort:
// connCap still bounds the connections without them, so it never fails. It
// is a net.ListenConfig Control function.
func healthListenerOptions(_, _ string, rc syscall.RawConn) error {
	// A connection that sends nothing stays away from the server for about
	// this long (TCP_DEFER_ACCEPT), so a flood of silent connects costs the
	// kernel a little and the server nothing meanwhile.
	_ = setDeferAccept(rc, 5*time.Second)
	_ = setRcvBuf(rc, healthRecvBuffer)
	return nil
}

// dropBodies closes the connection of a request that comes with a body
// right after the reply, without reading the body. No health endpoint reads
// one, and net/http would otherwise read up to 256 KiB of it after the
// reply, for up to the read timeout: a client declaring a body it never
// sends would hold a connection inside a request that long.
func dropBodies(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength != 0 || len(r.TransferEncoding) > 0 {
			// A read deadline in the past makes net/http's reading of the
			// body fail at once, once the reply is written.
			_ = http.NewResponseController(w).SetReadDeadline(time.Now())
			w.Header().Set("Connection", "close")
		}
		h.ServeHTTP(w, r)
	})
}

// connCap holds the health server to max open connections without ever
// making its accept loop wait, which would starve the kubelet's probes. At
// the cap, each new connection closes another, first of:
//   - stalled: waiting on its client, in a write for over
//     healthBlockedAfter (it does not read its answers) or in a read before
//     its first request is whole (it trickles), or inside a request or
//     unread for over healthStallAfter; the longest stalled first;
//   - idle, the longest idle first;
//   - busy: inside its second or later request (no probe pipelines), the
//     longest first.
//
// A connection inside its first request, or accepted with it (see
// healthListenerOptions) but not yet read, is never closed: that is how a
// probe looks while it waits for a CPU. If only such are left, the new
// connection is closed instead. Closing only connections outside a request let 128
// clients that pipeline requests and never read hold every slot for the
// write timeout, while each newcomer closed the one before it: the
// kubelet's probe. Its track method is the server's ConnState hook.
type connCap struct {
	max    int
	closed *prometheus.CounterVec // by reason
	log    *slog.Logger
	warn   rateLog

	mu sync.Mutex // guards members
	// members holds every open connection the cap has not closed, with
	// where net/http last reported it.
	members map[net.Conn]capSlot
}

// capSlot is where a connection is: StateNew, StateActive or StateIdle,
// since when, and whether it has been idle. net/http reports a connection
// idle between any two of its requests, pipelined or not, so an active one
// that has been is inside its second or later request.
type capSlot struct {
	state  http.ConnState
	since  time.Time
	served bool
}

// The order in which connCap closes connections, first to last; it never
// closes one of rankUnread (unread, or inside its first request).
const (
	rankStalled = iota
	rankIdle
	rankBusy
	rankUnread
)

// rankReasons are the reason label values of health_connections_closed_total
// (metrics.healthConnsClosed), by the rank of the connection connCap closed:
// one waiting on its client, an idle one, one inside a request; a new
// connection closed for want of another is counted as new.
func rankReasons() [rankUnread + 1]string {
	return [...]string{rankStalled: "stalled", rankIdle: "waiting", rankBusy: "busy", rankUnread: "new"}
}

func newConnCap(limit int, log *slog.Logger, m *metrics) *connCap {
	return &connCap{
		max: limit, closed: m.healthConnsClosed, log: log, warn: rateLog{every: warnEvery},
		members: map[net.Conn]capSlot{},
	}
}

// track records c entering state and closes the connection the cap gives
// up. It closes it with the lock held: released first, net/http could
// report it in a new state, and the cap would cut a connection it ranked
// by the old one. The close sends a reset, which does not block and frees
// what the socket still queues at once: closed with a FIN, a socket whose
// peer never reads keeps its unsent bytes, orphaned, for minutes.
func (cc *connCap) track(c net.Conn, state http.ConnState) {
	cc.mu.Lock()
	victim, reason := cc.enterLocked(c, state, time.Now())
	if victim != nil {
		closeAbortive(victim) // net/http reports it closed soon; it no longer counts
	}
	cc.mu.Unlock()
	if victim == nil {
		return
	}
	cc.closed.WithLabelValues(reason).Inc()
	if left, due := cc.warn.note(time.Now()); due {
		cc.log.Warn("health server at its connection limit, closing connections", "limit", cc.max, "closed", left+1)
	}
}

// enterLocked moves c to state at now and returns the connection to close,
// if any, and why.
func (cc *connCap) enterLocked(c net.Conn, state http.ConnState, now time.Time) (victim net.Conn, reason string) {
	if state == http.StateNew && len(cc.members) >= cc.max {
		if victim, reason = cc.pickLocked(now); victim == nil {
			return c, reason // never a member
		}
		delete(cc.members, victim)
	}
	switch s, member := cc.members[c]; {
	case state == http.StateNew, member && (state == http.StateActive || state == http.StateIdle):
		cc.members[c] = capSlot{state: state, since: now, served: s.served || state == http.StateIdle}
	default: // closed or hijacked, or closed by the cap and net/http catching up
		delete(cc.members, c)
	}
	return victim, reason
}

// pickLocked returns the member to close first (see connCap) and why, or
// nil if none may go, with the reason of closing the new one instead. A scan is cheaper than keeping the order: the cap is
// small, and a member's rank changes with time alone.
func (cc *connCap) pickLocked(now time.Time) (net.Conn, string) {
	pick, pickRank, pickSince := net.Conn(nil), rankUnread, time.Time{}
	for c, s := range cc.members {
		r, since := capRank(c, s, now)
		if r < pickRank || (r == pickRank && r != rankUnread && since.Before(pickSince)) {
			pick, pickRank, pickSince = c, r, since
		}
	}
	return pick, rankReasons()[pickRank]
}

// capRank places c, where s says it is, in connCap's order of closing at
// now, with the time that orders it within its rank.
func capRank(c net.Conn, s capSlot, now time.Time) (int, time.Time) {
	if hc, ok := c.(*healthConn); ok {
		if since, ok := hc.since(&hc.writing); ok && now.Sub(since) > healthBlockedAfter {
			return rankStalled, since
		}
		// Once a request is read, net/http keeps a read under way to see
		// the client go: only before the first does a read wait on it.
		if since, ok := hc.since(&hc.reading); ok && now.Sub(since) > healthBlockedAfter && s.state == http.StateNew {
			return rankStalled, since
		}
	}
	switch {
	case s.state == http.StateIdle:
		return rankIdle, s.since
	case now.Sub(s.since) > healthStallAfter:
		return rankStalled, s.since
	case s.state == http.StateActive && s.served:
		return rankBusy, s.since
	default:
		return rankUnread, s.since
	}
}

// healthConn is an accepted health connection that lets connCap see it wait
// on its client: a write blocked on a full send buffer, a read for a
// request not yet sent. A probe's request is there when it is accepted and
// its answer, a few hundred bytes, never blocks, however loaded the server.
type healthConn struct {
	*net.TCPConn
	accepted time.Time
	// reading and writing are each 1 + the time from accepted to the start
	// of the Read or Write under way, or 0 outside one: monotonic, and no
	// allocation per call.
	reading, writing atomic.Int64
}

func (c *healthConn) Read(p []byte) (int, error)  { return c.timed(&c.reading, c.TCPConn.Read, p) }
func (c *healthConn) Write(p []byte) (int, error) { return c.timed(&c.writing, c.TCPConn.Write, p) }

// timed runs io on p with op marking it under way.
func (c *healthConn) timed(op *atomic.Int64, io func([]byte) (int, error), p []byte) (int, error) {
	op.Store(1 + int64(time.Since(c.accepted)))
	defer op.Store(0)
	return io(p)
}

// since reports whether the call op tracks is under way, and since when.
func (c *healthConn) since(op *atomic.Int64) (time.Time, bool) {
	d := op.Load()
	return c.accepted.Add(time.Duration(d - 1)), d != 0
}

// newHealthConn gives an accepted health connection its small send buffer
// (best effort: connCap still bounds the count) and the tracking of connCap.
func newHealthConn(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	_ = tc.SetWriteBuffer(healthSendBuffer)
	return &healthConn{TCPConn: tc, accepted: time.Now()}
}
