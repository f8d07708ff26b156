package main

// Beyond the spec: an accept loop that never gives up. Descriptor
// exhaustion and the like back off and retry, so neither the proxy nor the
// health server stops accepting while the health probes stay green.
//
// The same loop holds a gate, which stops Accept without closing the
// listener, for the hand-over (handover.go). Two instances accept from the
// same sockets, so what a client reaches is whichever accepts: a broken
// successor's clients failed while its predecessor answered its readiness
// probes for it. So the instance that handed its sockets over shuts its
// health socket's gate, and every probe reaches the successor; and a
// successor keeps its proxy socket's gate shut until its own checks pass
// an upstream. Closing the listener instead would give its socket up for
// good; a deadline in the past ends an Accept that is waiting, and the
// descriptor stays.

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

const (
	// The backoff of a failing Accept, and the deadline of the try that
	// follows it (see steadyListener.Accept).
	acceptProbe      = 10 * time.Millisecond
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
)

// steadyListener is the accept loop of the proxy, of the health server and
// of the hand-over socket: it retries every accept error but a closed
// listener, backing off, so none stops accepting while the health probes
// stay green. net/http retries only the errors it deems temporary, such as
// EMFILE, and returns on the others, such as ENOMEM and ENOBUFS: the proxy
// would go on without /healthz, /readyz and /metrics until a restart,
// which cuts every proxied connection. Its Accept waits while its gate is
// shut (set).
type steadyListener struct {
	net.Listener // one with SetDeadline (setAcceptDeadline)
	log          *slog.Logger
	what         string // begins its log lines: "", "health server " or "hand-over socket "
	// accepted, if set, wraps each accepted connection.
	accepted func(net.Conn) net.Conn
	// stalledSince is when Accept started failing (UnixNano), 0 while it
	// works; the proxy's liveness beat reads it.
	stalledSince *atomic.Int64
	retry        backoff // zero while Accept works; Accept's own

	mu       sync.Mutex // guards open, changed and deadline
	open     bool
	changed  chan struct{} // closed at the next change of open
	deadline time.Time     // that of the try after a failing Accept, applied while open

	closed    chan struct{} // closed by Close, to end a backoff or a wait
	closeOnce sync.Once
}

// newSteadyListener returns ln's accept loop, its gate open.
func newSteadyListener(ln net.Listener, log *slog.Logger, what string, stalledSince *atomic.Int64) *steadyListener {
	return &steadyListener{Listener: ln, log: log, what: what, stalledSince: stalledSince, open: true,
		retry: backoff{first: acceptBackoffMin, limit: acceptBackoffMax}, changed: make(chan struct{}), closed: make(chan struct{})}
}

func (l *steadyListener) Accept() (net.Conn, error) {
	for {
		if !l.wait() {
			return nil, fmt.Errorf("accept on %s: %w", l.Addr(), net.ErrClosed)
		}
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
		case errors.Is(err, os.ErrDeadlineExceeded) && l.shutSince():
			// The gate shut: wait until it opens.
		case l.retry.cur != 0 && errors.Is(err, os.ErrDeadlineExceeded):
			// Accept waited instead of failing: it works again, even
			// though no client has arrived to prove it.
			l.recovered()
		default:
			if l.retry.cur == 0 {
				l.stalledSince.Store(time.Now().UnixNano())
				l.log.Error(l.what+"accept failing, backing off until it works again", "err", err)
			}
			// accept4 fails with EMFILE even with no client waiting, as
			// it takes a descriptor first; a short deadline on the next
			// try tells "works, nobody waiting" from "still out". Once
			// closed, the next Accept says so.
			if await(l.closed, l.retry.next()) {
				l.setDeadline(time.Now().Add(acceptProbe))
			}
		}
	}
}

// recovered ends an episode of failing Accepts, if one is on.
func (l *steadyListener) recovered() {
	if l.retry.cur == 0 {
		return
	}
	l.retry.reset()
	l.setDeadline(time.Time{})
	l.stalledSince.Store(0)
	l.log.Info(l.what + "accepting again")
}

// set opens or shuts the gate; shutting it ends an Accept in progress.
func (l *steadyListener) set(open bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open = open
	close(l.changed)
	l.changed = make(chan struct{})
	l.applyDeadline()
}

func (l *steadyListener) isOpen() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

// wait returns true once the gate is open, false once l is closed.
func (l *steadyListener) wait() bool {
	for {
		l.mu.Lock()
		open, changed := l.open, l.changed
		l.mu.Unlock()
		if open {
			return true
		}
		select {
		case <-changed:
		case <-l.closed:
			return false
		}
	}
}

// shutSince reports whether an Accept that ended at a deadline was ended by
// set rather than by the try's own deadline, which has not passed.
func (l *steadyListener) shutSince() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.open || l.deadline.IsZero() || time.Now().Before(l.deadline)
}

// setDeadline sets the deadline of the tries after a failing Accept.
func (l *steadyListener) setDeadline(t time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.deadline = t
	l.applyDeadline()
}

// applyDeadline gives the listener the try's deadline while the gate is
// open, one in the past while it is shut. l.mu must be held.
func (l *steadyListener) applyDeadline() {
	if l.open {
		setAcceptDeadline(l.Listener, l.deadline)
	} else {
		setAcceptDeadline(l.Listener, time.Unix(1, 0))
	}
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

// acceptStalledFor reports how long Accept has been failing (0 if it works).
func (p *proxy) acceptStalledFor() time.Duration {
	if since := p.stalledSince.Load(); since != 0 {
		return time.Since(time.Unix(0, since))
	}
	return 0
}
