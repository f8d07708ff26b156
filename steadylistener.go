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

	mu    sync.Mutex    // guards shut and the listener's deadline
	shut  chan struct{} // nil while the gate is open; closed as it opens
	shuts atomic.Int64  // how often the gate has shut, written under mu

	closed    chan struct{} // closed by Close, to end a backoff or a wait
	closeOnce sync.Once
}

// newSteadyListener returns ln's accept loop, its gate open.
func newSteadyListener(ln net.Listener, log *slog.Logger, what string, stalledSince *atomic.Int64) *steadyListener {
	return &steadyListener{Listener: ln, log: log, what: what, stalledSince: stalledSince,
		retry: backoff{first: acceptBackoffMin, limit: acceptBackoffMax}, closed: make(chan struct{})}
}

func (l *steadyListener) Accept() (net.Conn, error) {
	for {
		shuts, ok := l.wait()
		if !ok {
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
		case errors.Is(err, os.ErrDeadlineExceeded):
			// The gate shut, and wait holds the next try until it opens;
			// or the try after a failing one waited instead of failing:
			// Accept works again, even though no client has arrived to
			// prove it.
			if l.shuts.Load() == shuts {
				l.recovered()
			}
		default:
			if l.retry.cur == 0 {
				l.stalledSince.Store(time.Now().UnixNano())
				l.log.Error(l.what+"accept failing, backing off until it works again", "err", err)
			}
			// Once closed, the next Accept says so.
			await(l.closed, l.retry.next())
		}
	}
}

// recovered ends an episode of failing Accepts, if one is on.
func (l *steadyListener) recovered() {
	if l.retry.cur == 0 {
		return
	}
	l.retry.reset()
	l.stalledSince.Store(0)
	l.log.Info(l.what + "accepting again")
}

// set opens or shuts the gate; shutting it ends an Accept in progress, with
// a deadline in the past.
func (l *steadyListener) set(open bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case open && l.shut != nil:
		close(l.shut)
		l.shut = nil
	case !open && l.shut == nil:
		l.shut = make(chan struct{})
		l.shuts.Add(1)
		setAcceptDeadline(l.Listener, time.Unix(1, 0))
	}
}

func (l *steadyListener) isOpen() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.shut == nil
}

// wait returns once the gate is open, with how often it has shut, having
// set the deadline of the try: none while Accept works, acceptProbe after
// it failed, as accept4 fails with EMFILE even with no client waiting, as
// it takes a descriptor first; the short deadline tells "works, nobody
// waiting" from "still out". ok is false once l is closed.
func (l *steadyListener) wait() (shuts int64, ok bool) {
	for {
		l.mu.Lock()
		shut := l.shut
		if shut == nil {
			var deadline time.Time
			if l.retry.cur != 0 {
				deadline = time.Now().Add(acceptProbe)
			}
			setAcceptDeadline(l.Listener, deadline)
		}
		shuts = l.shuts.Load()
		l.mu.Unlock()
		if shut == nil {
			return shuts, true
		}
		select {
		case <-shut:
		case <-l.closed:
			return 0, false
		}
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
