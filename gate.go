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
	"net"
	"os"
	"sync"
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
