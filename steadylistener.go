package main

// Beyond the spec: an accept loop that never gives up. Descriptor
// exhaustion and the like back off and retry, so neither the proxy nor the
// health server stops accepting while the health probes stay green.

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

// acceptStalledFor reports how long Accept has been failing (0 if it works).
func (p *proxy) acceptStalledFor() time.Duration {
	if since := p.stalledSince.Load(); since != 0 {
		return time.Since(time.Unix(0, since))
	}
	return 0
}
