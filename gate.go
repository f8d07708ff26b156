package main

// A gate holds a listener's Accept without closing the listener, for the
// hand-over (handover.go). Two instances accept from the same sockets, so
// what a client reaches is whichever accepts: a broken successor's clients
// failed while its predecessor answered its readiness probes for it. So
// the instance that handed its sockets over shuts its health socket's
// gate, and every probe reaches the successor; and a successor keeps its
// proxy socket's gate shut until its own checks pass an upstream. Closing
// the listener instead would give its socket up for good; a deadline in
// the past ends an Accept that is waiting, and the descriptor stays.

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// gate is a listener whose Accept waits while the gate is shut.
type gate struct {
	net.Listener // one with SetDeadline (setAcceptDeadline)

	mu       sync.Mutex // guards open, changed and deadline
	open     bool
	changed  chan struct{} // closed at the next change of open
	deadline time.Time     // the accept loop's own (SetDeadline), applied while open

	closed    chan struct{} // closed by Close, to end a wait
	closeOnce sync.Once
}

func newGate(ln net.Listener, open bool) *gate {
	g := &gate{Listener: ln, changed: make(chan struct{}), closed: make(chan struct{})}
	g.set(open)
	return g
}

// set opens or shuts the gate; shutting it ends an Accept in progress.
func (g *gate) set(open bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.open = open
	close(g.changed)
	g.changed = make(chan struct{})
	if open {
		setAcceptDeadline(g.Listener, g.deadline)
	} else {
		setAcceptDeadline(g.Listener, time.Unix(1, 0))
	}
}

func (g *gate) isOpen() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.open
}

// Accept waits while the gate is shut, then accepts.
func (g *gate) Accept() (net.Conn, error) {
	for {
		if err := g.wait(); err != nil {
			return nil, err
		}
		c, err := g.Listener.Accept()
		if err != nil && errors.Is(err, os.ErrDeadlineExceeded) && g.shutSince() {
			continue
		}
		return c, err
	}
}

// wait returns once the gate is open, net.ErrClosed once it is closed.
func (g *gate) wait() error {
	for {
		g.mu.Lock()
		open, changed := g.open, g.changed
		g.mu.Unlock()
		if open {
			return nil
		}
		select {
		case <-changed:
		case <-g.closed:
			return fmt.Errorf("accept on %s: %w", g.Addr(), net.ErrClosed)
		}
	}
}

// shutSince reports whether an Accept that ended at a deadline was ended by
// set rather than by the accept loop's own deadline, which has not passed.
func (g *gate) shutSince() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return !g.open || g.deadline.IsZero() || time.Now().Before(g.deadline)
}

// SetDeadline sets the accept loop's own deadline, which the proxy's uses
// to tell a failing Accept from an idle one.
func (g *gate) SetDeadline(t time.Time) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.deadline = t
	if g.open {
		setAcceptDeadline(g.Listener, t)
	}
	return nil
}

func (g *gate) Close() error {
	g.closeOnce.Do(func() { close(g.closed) })
	return g.Listener.Close()
}

// steadyListener is the accept loop of the proxy and of the health server:
// it retries every accept error but a closed listener, backing off, so
// neither stops accepting while the health probes stay green. net/http
// retries only the errors it deems temporary, such as EMFILE, and returns
// on the others, such as ENOMEM and ENOBUFS: the proxy would go on without
// /healthz, /readyz and /metrics until a restart, which cuts every proxied
// connection.
type steadyListener struct {
	net.Listener
	log  *slog.Logger
	what string // begins its log lines: "" or "health server "
	// accepted, if set, wraps each accepted connection.
	accepted func(net.Conn) net.Conn
	// stalledSince is when Accept started failing (UnixNano), 0 while it
	// works; the proxy's liveness beat reads it.
	stalledSince *atomic.Int64
	retry        backoff // zero while Accept works; Accept's own

	closed    chan struct{} // closed by Close, to end a backoff
	closeOnce sync.Once
}

func newSteadyListener(ln net.Listener, log *slog.Logger, what string, stalledSince *atomic.Int64) *steadyListener {
	return &steadyListener{Listener: ln, log: log, what: what, stalledSince: stalledSince,
		retry: backoff{first: acceptBackoffMin, limit: acceptBackoffMax}, closed: make(chan struct{})}
}

func (l *steadyListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		switch {
		case err == nil:
			l.recovered()
			if l.accepted != nil {
				c = l.accepted(c)
			}
			return c, nil
		case errors.Is(err, net.ErrClosed):
			return nil, err
		case l.retry.cur != 0 && errors.Is(err, os.ErrDeadlineExceeded):
			// Accept waited instead of failing: it works again, even
			// though no client has arrived to prove it.
			l.recovered()
		default:
			if l.retry.cur == 0 {
				l.stalledSince.Store(time.Now().UnixNano())
				l.log.Error(l.what+"accept failing, backing off until it works again", "err", err)
			}
			if !await(l.closed, l.retry.next()) {
				return nil, fmt.Errorf("accept on %s: %w", l.Addr(), net.ErrClosed)
			}
			// accept4 fails with EMFILE even with no client waiting, as
			// it takes a descriptor first; a short deadline on the next
			// try tells "works, nobody waiting" from "still out".
			setAcceptDeadline(l.Listener, time.Now().Add(acceptProbe))
		}
	}
}

// recovered ends an episode of failing Accepts, if one is on.
func (l *steadyListener) recovered() {
	if l.retry.cur == 0 {
		return
	}
	l.retry.reset()
	setAcceptDeadline(l.Listener, time.Time{})
	l.stalledSince.Store(0)
	l.log.Info(l.what + "accepting again")
}

func (l *steadyListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// setAcceptDeadline sets the deadline of Accept on listeners that have one.
func setAcceptDeadline(ln net.Listener, t time.Time) {
	if dl, ok := ln.(interface{ SetDeadline(t time.Time) error }); ok {
		_ = dl.SetDeadline(t)
	}
}
