package main

// Beyond the spec: what keeps the health server answerable under local
// abuse. The kubelet restarts the daemon after three failed probes, which
// drops every proxied connection on the node, so a flood of connections to
// the health port must never delay a probe: connections that send nothing
// are kept away (TCP_DEFER_ACCEPT), the open ones are capped without the
// accept loop ever waiting (connCap), a request's body is never waited for
// (dropBodies), and accept errors are retried (steadyListener).

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
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
	// healthDeferAccept keeps a connection that sends nothing away from the
	// server for about this long (TCP_DEFER_ACCEPT), so a flood of silent
	// connects costs the kernel a little and the server nothing meanwhile.
	healthDeferAccept = 5 * time.Second
)

// listenHealth opens the health server's listener, with TCP_DEFER_ACCEPT
// where the kernel has it.
func listenHealth(ctx context.Context, addr string) (net.Listener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		_ = setDeferAccept(rc, healthDeferAccept) // best effort: connCap still bounds the cost
		return nil
	}}
	return lc.Listen(ctx, "tcp", addr) // an error names the address
}

// activatedHealthListener gives a listener the service manager opened the
// deferred accept of listenHealth.
func activatedHealthListener(ln *net.TCPListener) net.Listener {
	if rc, err := ln.SyscallConn(); err == nil {
		_ = setDeferAccept(rc, healthDeferAccept)
	}
	return ln
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
// the cap, a new connection closes the one that has waited longest outside
// a request: idle, or not read from yet. A client hoarding connections
// loses its own oldest, while a probe, which sends its request at once (it
// reaches Accept only with data, see healthDeferAccept), is read long before
// it could be the oldest. If every connection is inside a request, which
// the read and write timeouts bound, the new one is closed instead. Its
// track method is the server's ConnState hook.
type connCap struct {
	max                      int
	closedWaiting, closedNew prometheus.Counter
	log                      *slog.Logger
	warn                     rateLog

	mu sync.Mutex // guards the fields below
	// members holds every open connection the cap has not closed, with its
	// element in waiting, or nil while it is inside a request.
	members map[net.Conn]*list.Element
	waiting *list.List // of net.Conn, longest waiting first
}

func newConnCap(limit int, log *slog.Logger, m *metrics) *connCap {
	return &connCap{
		max: limit, log: log, warn: rateLog{every: warnEvery},
		closedWaiting: m.healthConnsClosed.WithLabelValues(reasonWaiting),
		closedNew:     m.healthConnsClosed.WithLabelValues(reasonNew),
		members:       map[net.Conn]*list.Element{}, waiting: list.New(),
	}
}

// track records c entering state and closes the connection the cap gives
// up. It closes it with the lock held: released first, net/http could
// report it inside a request, and the cap would cut a request it counts as
// waiting. A close without linger does not block.
func (cc *connCap) track(c net.Conn, state http.ConnState) {
	cc.mu.Lock()
	victim := cc.enterLocked(c, state)
	if victim != nil {
		_ = victim.Close() // net/http reports it closed soon; it no longer counts
	}
	cc.mu.Unlock()
	if victim == nil {
		return
	}
	if n, due := cc.warn.note(); due {
		cc.log.Warn("health server at its connection limit, closing connections", "limit", cc.max, "closed", n)
	}
}

// enterLocked moves c to state and returns the connection to close, if any.
func (cc *connCap) enterLocked(c net.Conn, state http.ConnState) net.Conn {
	e, member := cc.members[c]
	if e != nil {
		cc.waiting.Remove(e)
	}
	switch {
	case state == http.StateNew && len(cc.members) >= cc.max && cc.waiting.Len() == 0:
		cc.closedNew.Inc()
		return c
	case state == http.StateNew:
		var victim net.Conn
		if len(cc.members) >= cc.max {
			victim, _ = cc.waiting.Remove(cc.waiting.Front()).(net.Conn)
			delete(cc.members, victim)
			cc.closedWaiting.Inc()
		}
		cc.members[c] = cc.waiting.PushBack(c)
		return victim
	case !member: // closed by the cap; net/http catches up
	case state == http.StateIdle:
		cc.members[c] = cc.waiting.PushBack(c)
	case state == http.StateActive:
		cc.members[c] = nil
	default: // closed or hijacked
		delete(cc.members, c)
	}
	return nil
}

// steadyListener keeps the health server accepting through every accept
// error but a closed listener. net/http retries only the errors it deems
// temporary, such as EMFILE, and returns on the others, such as ENOMEM and
// ENOBUFS: the proxy would go on without /healthz, /readyz and /metrics, and
// only a restart, which cuts every proxied connection, would bring them
// back. Like the proxy's accept loop, it backs off and retries.
type steadyListener struct {
	net.Listener
	log       *slog.Logger
	closed    chan struct{} // closed by Close, to end a backoff
	closeOnce sync.Once
}

func (l *steadyListener) Accept() (net.Conn, error) {
	var backoff time.Duration
	for {
		c, err := l.Listener.Accept()
		if err == nil || errors.Is(err, net.ErrClosed) {
			if err == nil && backoff != 0 {
				l.log.Info("health server accepting again")
			}
			return c, err
		}
		if backoff == 0 {
			l.log.Error("health server accept failing, backing off until it works again", "err", err)
		}
		backoff = min(max(2*backoff, acceptBackoffMin), acceptBackoffMax)
		if !await(l.closed, backoff) {
			return nil, fmt.Errorf("accept on %s: %w", l.Addr(), net.ErrClosed)
		}
	}
}

func (l *steadyListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}
