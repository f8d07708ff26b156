package main

// Beyond the spec: the dead-connection sweep. A kubelet watch on an API
// server that vanished (power loss, a black-holed link) would otherwise
// stay open until keepalive gives up, 30 s or more, or for ever while its
// data is retransmitted. From the first failed check or dial of an upstream
// until the next success, its sockets get 1 s keepalive and a 3 s
// TCP_USER_TIMEOUT, so the kernel ends connections to a vanished peer
// within seconds, while a peer that is alive but slow answers the probes
// and keeps them.

import (
	"log/slog"
	"net"
	"time"
)

const (
	// tcpKeepAliveIdle and tcpUserTimeout apply to both sides of every
	// proxied connection, as the spec requires.
	tcpKeepAliveIdle = 30 * time.Second
	tcpUserTimeout   = 30 * time.Second

	// The sweep's settings: probes every second from 1 s idle, and 3 s
	// without an answer end the connection, to probes or to unacknowledged
	// data alike (TCP_USER_TIMEOUT governs both; the count matters only
	// where the kernel lacks it).
	sweepIdle        = time.Second
	sweepUserTimeout = 3 * time.Second
	sweepCount       = 3

	// stalledAfter is when, into a suspicion, the sweep closes what the
	// kernel will not end soon (see closeStalledLocked): its user timeout,
	// which ends every other dead connection by then, and some slack.
	stalledAfter = sweepUserTimeout + 500*time.Millisecond
)

// normalKeepAlive is what every upstream socket is dialled with. The probe
// count is left alone: with TCP_USER_TIMEOUT set, Linux ignores it and ends
// the connection once probes have gone unanswered for the user timeout.
func normalKeepAlive() net.KeepAliveConfig {
	return net.KeepAliveConfig{Enable: true, Idle: tcpKeepAliveIdle, Count: -1}
}

// setSweep switches c between the normal and the sweep's keepalive and user
// timeout. Failures are ignored: the connection works with what it had.
//
// The idle time is set last. Setting it reschedules the keepalive timer,
// due at once on a socket idle for longer, and a probe it sends is followed
// by the next one after the interval in force then: with the idle time set
// first, as SetKeepAliveConfig does, a swept connection could wait the old
// 15 s interval instead of 1 s.
func setSweep(c net.Conn, on bool) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return
	}
	ka, userTimeout := normalKeepAlive(), tcpUserTimeout
	if on {
		ka = net.KeepAliveConfig{Enable: true, Idle: sweepIdle, Interval: sweepIdle, Count: sweepCount}
		userTimeout = sweepUserTimeout
	}
	idle := ka.Idle
	ka.Idle = -1 // left as it is, for now
	_ = tc.SetKeepAliveConfig(ka)
	if rc, err := tc.SyscallConn(); err == nil {
		_ = setUserTimeout(rc, userTimeout)
	}
	_ = tc.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: idle, Interval: -1, Count: -1})
}

// setSuspectLocked switches u's sockets to the sweep's settings when u has
// turned suspect, and back when it is not any more. p.mu must be held.
func (p *pool) setSuspectLocked(u *upstream) {
	if !p.cfg.sweep {
		return
	}
	if u.h.suspect {
		p.note(u, slog.LevelInfo, "upstream suspect: sweeping its connections", "connections", len(u.conns))
		p.arm(&u.sweep, stalledAfter, func() { p.closeStalledLocked(u) })
	} else {
		u.sweep.stop()
	}
	for pc := range u.conns {
		setSweep(pc.upstream, u.h.suspect)
	}
}

// closeStalledLocked closes those of u's connections whose upstream socket
// retransmits unacknowledged data and has had no ACK for the sweep's user
// timeout. Their data was already being retransmitted when the sweep
// began, and the kernel applies the new user timeout only when the
// retransmission timer next fires, after a few backoffs up to 30 s away;
// it then ends them without another try, so closing them now only does it
// sooner. (A backed-off socket sends nothing meanwhile, keepalive probes
// included, so a peer that came back could not tell it so anyway.)
func (p *pool) closeStalledLocked(u *upstream) {
	closed := 0
	for pc := range u.conns {
		if stalledFor(pc.upstream) >= sweepUserTimeout && !pc.dead.Swap(true) {
			p.m.deadConnsClosed.Inc() // before the client can see the close
			pc.closeFor(connEndSweep)
			closed++
		}
	}
	if closed > 0 {
		p.note(u, slog.LevelInfo, "closed connections whose data the suspect upstream stopped acknowledging", "connections", closed)
	}
}
