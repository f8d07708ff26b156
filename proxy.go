package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

const (
	// tcpKeepAliveIdle and tcpUserTimeout apply to both sides of every
	// proxied connection, as the spec requires.
	tcpKeepAliveIdle = 30 * time.Second
	tcpUserTimeout   = 30 * time.Second

	// fdsPerConn is what one proxied connection holds: the client socket, the
	// upstream socket, and one splice pipe (two descriptors) per direction,
	// which Go keeps for as long as the copy runs.
	fdsPerConn = 6
	// fdReserve descriptors are never used for proxied connections, so the
	// health server, the probes and discovery keep working while clients
	// hold every other descriptor.
	fdReserve = 256

	localRetryDelay  = 10 * time.Millisecond
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
)

var (
	errNoUpstream = errors.New("no upstream available")
	errDraining   = errors.New("upstream started draining during the dial")
)

// proxyConn is one proxied connection: the accepted client socket and the
// upstream socket it was joined to.
type proxyConn struct {
	client   net.Conn
	upstream net.Conn // set before the pool learns of pc, never changed after
}

// close force-closes both sockets; the copy goroutines then end on their own.
func (pc *proxyConn) close() {
	_ = pc.client.Close()
	_ = pc.upstream.Close()
}

type dialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// proxy is the TCP data path: the accept loop and one goroutine per client
// connection, all owned by serve and waited for by shutdown.
type proxy struct {
	log         *slog.Logger
	m           *metrics
	pool        *pool
	dial        dialFunc
	dialTimeout time.Duration

	// slots bounds the proxied connections by the descriptor limit; see
	// fdsPerConn. A slot is taken before Accept, so at the limit clients
	// wait in the listen backlog instead of being reset.
	slots chan struct{}
	wg    sync.WaitGroup // connection goroutines

	// stalledSince is when Accept started failing (UnixNano), 0 while it works.
	stalledSince atomic.Int64
}

func newProxy(log *slog.Logger, m *metrics, pl *pool, dialTimeout time.Duration, maxConns int) *proxy {
	d := &net.Dialer{
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: tcpKeepAliveIdle},
		Control: func(_, _ string, rc syscall.RawConn) error {
			return setUserTimeout(rc, tcpUserTimeout)
		},
	}
	return &proxy{
		log: log, m: m, pool: pl,
		dial:        d.DialContext,
		dialTimeout: dialTimeout,
		slots:       make(chan struct{}, max(maxConns, 1)),
	}
}

// listenTCP opens the proxy listener. Accepted connections inherit the
// keepalive settings from the ListenConfig.
func listenTCP(ctx context.Context, addr string) (net.Listener, error) {
	lc := net.ListenConfig{
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: tcpKeepAliveIdle},
	}
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	return ln, nil
}

// connLimit derives the number of proxied connections from the open-files
// limit, keeping fdReserve descriptors for everything else.
func connLimit(nofile uint64) int {
	if nofile <= fdReserve+fdsPerConn {
		return 1
	}
	return int(min((nofile-fdReserve)/fdsPerConn, 1<<20))
}

// serve accepts connections on ln until ctx is done. It survives every
// accept error: descriptor exhaustion and the like back off and retry, so
// the proxy never stops accepting while its health probes stay green.
func (p *proxy) serve(ctx context.Context, ln net.Listener) {
	stop := context.AfterFunc(ctx, func() { _ = ln.Close() })
	defer stop()
	var backoff time.Duration
	for {
		select {
		case p.slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		c, err := ln.Accept()
		if err != nil {
			<-p.slots
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			backoff = p.acceptFailed(err, backoff)
			if !sleepCtx(ctx, backoff) {
				return
			}
			continue
		}
		if backoff != 0 {
			backoff = 0
			p.stalledSince.Store(0)
			p.log.Info("accepting connections again")
		}
		p.wg.Go(func() {
			defer func() { <-p.slots }()
			p.handle(ctx, c)
		})
	}
}

// acceptFailed logs the first failure of an episode and returns the next,
// doubled, backoff.
func (p *proxy) acceptFailed(err error, backoff time.Duration) time.Duration {
	if backoff == 0 {
		p.stalledSince.Store(time.Now().UnixNano())
		p.log.Error("accept failing, backing off until it works again", "err", err)
		return acceptBackoffMin
	}
	return min(2*backoff, acceptBackoffMax)
}

// acceptStalledFor reports how long Accept has been failing (0 if it works).
func (p *proxy) acceptStalledFor() time.Duration {
	since := p.stalledSince.Load()
	if since == 0 {
		return 0
	}
	return time.Since(time.Unix(0, since))
}

// handle joins one client connection to an upstream and copies between them.
func (p *proxy) handle(ctx context.Context, client net.Conn) {
	defer client.Close()
	if tc, ok := client.(*net.TCPConn); ok {
		if rc, err := tc.SyscallConn(); err == nil {
			_ = setUserTimeout(rc, tcpUserTimeout) // best effort: keepalive still applies
		}
	}
	pc := &proxyConn{client: client}
	u, err := p.connect(ctx, pc)
	if err != nil {
		p.log.Debug("client connection closed without upstream", "client", client.RemoteAddr().String(), "err", err)
		return
	}
	defer p.pool.detach(u, pc)
	defer pc.upstream.Close()
	if ctx.Err() != nil {
		return // shutdown raced the dial; the connection must not outlive it
	}
	p.m.connectionsTotal.Inc()
	p.m.connectionsActive.Inc()
	defer p.m.connectionsActive.Dec()
	pipe(client, pc.upstream)
}

// connect dials upstreams for pc until one answers: first every pickable
// upstream (each at most once), then, as a last resort, the non-draining
// ones that are not pickable, most recently healthy first. On success
// pc.upstream is set and pc is attached to the returned upstream.
func (p *proxy) connect(ctx context.Context, pc *proxyConn) (*upstream, error) {
	tried := make([]*upstream, 0, 4)
	drainRetried := false
	var lastErr error = errNoUpstream
	for {
		u := p.pool.pick(tried)
		lastResort := u == nil
		if lastResort {
			if u = p.pool.lastResort(tried); u == nil {
				return nil, lastErr
			}
		}
		tried = append(tried, u)
		conn, err := p.dialPatiently(ctx, u.addr)
		if err != nil {
			if ctx.Err() != nil || isLocalExhaustion(err) {
				return nil, err // shutdown or our own limits: not the upstream's fault
			}
			p.pool.report(u, err)
			if !lastResort {
				u.errs.Inc()
			}
			u.log.Debug("dial failed", "err", err, "last_resort", lastResort)
			lastErr = err
			continue
		}
		pc.upstream = conn
		if p.pool.connected(u, pc) {
			return u, nil
		}
		_ = conn.Close()
		if drainRetried {
			return nil, errDraining
		}
		drainRetried, lastErr = true, errDraining
	}
}

// dialPatiently dials addr, and while the dial fails because this process
// is out of descriptors, waits and tries again within the dial timeout: a
// moment of exhaustion then delays clients instead of dropping them.
func (p *proxy) dialPatiently(ctx context.Context, addr string) (net.Conn, error) {
	deadline := time.Now().Add(p.dialTimeout)
	for {
		c, err := p.dialUpstream(ctx, addr)
		if err == nil || !isLocalExhaustion(err) || time.Now().After(deadline) {
			return c, err
		}
		if !sleepCtx(ctx, localRetryDelay) {
			return nil, err
		}
	}
}

func (p *proxy) dialUpstream(ctx context.Context, addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, p.dialTimeout)
	defer cancel()
	c, err := p.dial(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial upstream %s: %w", addr, err)
	}
	return c, nil
}

// shutdown force-closes every proxied connection and waits up to timeout for
// the connection goroutines. serve must have returned.
func (p *proxy) shutdown(timeout time.Duration) error {
	p.pool.closeConns()
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("proxy goroutines still running after %s", timeout)
	}
}

// pipe copies both ways until both directions have finished.
func pipe(client, upstream net.Conn) {
	done := make(chan struct{})
	go copyHalf(upstream, client, done)
	copyHalf(client, upstream, nil)
	<-done
}

// copyHalf copies src to dst. A clean end of src is passed on as a
// half-close of dst; an error tears down both sockets so the other direction
// ends too. io.Copy between two *net.TCPConn uses splice(2): the bytes never
// enter user space, which is why neither side is wrapped in anything.
func copyHalf(dst, src net.Conn, done chan<- struct{}) {
	if done != nil {
		defer close(done)
	}
	if _, err := io.Copy(dst, src); err != nil {
		_ = dst.Close()
		_ = src.Close()
		return
	}
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	} else {
		_ = dst.Close()
	}
}

// isLocalExhaustion reports errors caused by this process or host running
// out of resources; they say nothing about the upstream.
func isLocalExhaustion(err error) bool {
	for _, e := range []error{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.EADDRNOTAVAIL} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// sleepCtx waits d or until ctx is done; it reports whether d elapsed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
