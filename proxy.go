package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

const (
	// quickRecheck is the delay of the check after a failed one.
	quickRecheck = time.Second

	// The hedge delay is hedgeFactor times the slowest connect time of the
	// preferred group, within [hedgeMin, hedgeMax]; hedgeMax when no sample
	// exists yet.
	hedgeFactor = 4
	hedgeMin    = 50 * time.Millisecond
	hedgeMax    = 500 * time.Millisecond

	// flushTimeout bounds how long a failed connection's live peer gets to
	// take what is queued for it, and how long the other direction may go
	// on after one direction stopped on its broken destination. A peer that
	// reads does so in milliseconds.
	flushTimeout = 10 * time.Second

	// Log lines about being at the connection limit and about refused
	// clients are at most this often.
	warnEvery = time.Minute
)

var (
	errNoUpstream = errors.New("no upstream available")
	errDraining   = errors.New("upstream started draining during the dial")
)

type dialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// proxy is the TCP data path: the accept loop, one goroutine per client
// connection (handle), which dials an upstream and owns the two copies of
// the connection. serve owns the handlers; shutdown waits for them.
type proxy struct {
	log         *slog.Logger
	m           *metrics
	pool        *pool
	dial        dialFunc
	dialTimeout time.Duration
	hedge       bool // start a second dial when the first is slow
	// graceful: the listening socket outlives the process, so connections
	// outlive serve until shutdown, which closes answered ones first
	// (listeners.go). Set before serve.
	graceful bool
	// stopConns ends the handlers' context when graceful: serve sets it,
	// shutdown calls it.
	stopConns context.CancelFunc

	// slots bounds the proxied connections (see limits.go). The accept
	// loop takes one for each client before it accepts the next, so at the
	// limit clients wait in the listen backlog instead of being reset.
	slots chan struct{}
	idle  idlePolicy     // which silent connections are closed (see idle.go)
	wg    sync.WaitGroup // handlers

	// stalledSince is when Accept started failing (UnixNano), 0 while it
	// works; the liveness beat reads it.
	stalledSince atomic.Int64

	limitWarn, refusedWarning rateLog // see warnEvery
	endsLog                   rateLog // the "connection closed" lines (connlog.go)
}

func newProxy(log *slog.Logger, m *metrics, pl *pool, dialTimeout time.Duration, maxConns int) *proxy {
	d := &net.Dialer{KeepAliveConfig: normalKeepAlive(), Control: upstreamControl(log)}
	m.connLimit.Set(float64(max(maxConns, 1)))
	return &proxy{
		log: log, m: m, pool: pl, dial: d.DialContext, dialTimeout: dialTimeout, hedge: true,
		slots: make(chan struct{}, max(maxConns, 1)), idle: defaultIdlePolicy(),
		limitWarn: rateLog{every: warnEvery}, refusedWarning: rateLog{every: warnEvery},
		endsLog: rateLog{every: connLogEvery, burst: connLogBurst},
	}
}

// proxyConn is one proxied connection: the accepted client socket and the
// upstream socket it was joined to.
type proxyConn struct {
	client, upstream net.Conn  // upstream is set before the pool learns of pc, never changed after
	owner            *upstream // set by pool.connected, never changed after
	since            time.Time // set by pool.connected, never changed after
	// dead is set once pc is counted in dead_connections_closed_total, by
	// the copy that met the kernel's ETIMEDOUT or by the sweep.
	dead atomic.Bool
	// ended is its connEnd, set once by the first to claim it (see
	// connlog.go).
	ended atomic.Uint32
}

// close force-closes both sockets; the copies then end on their own.
func (pc *proxyConn) close() {
	_ = pc.client.Close()
	_ = pc.upstream.Close()
}

// closeFor force-closes pc, counting it as ended for reason unless its end
// was claimed already.
func (pc *proxyConn) closeFor(reason connEnd) {
	pc.claim(reason)
	pc.close()
}

// upstreamControl returns the upstream dialer's Control function, which
// sets TCP_USER_TIMEOUT and the buffer bounds before the socket connects. A
// kernel or sandbox that refuses an option must not fail the dial: that
// would be blamed on the upstream and refuse every client while the checks
// pass. Keepalive still ends dead connections; the first refusal of each
// kind is logged.
func upstreamControl(log *slog.Logger) func(network, address string, rc syscall.RawConn) error {
	var timeoutOnce, buffersOnce sync.Once
	return func(_, _ string, rc syscall.RawConn) error {
		if err := setUserTimeout(rc, tcpUserTimeout); err != nil {
			timeoutOnce.Do(func() {
				log.Warn("upstream sockets get no TCP_USER_TIMEOUT; keepalive alone ends connections to vanished upstreams", "err", err)
			})
		}
		if err := errors.Join(setRcvBuf(rc, sockRcvBuf), setNotsentLowat(rc, sockNotsentLowat)); err != nil {
			buffersOnce.Do(func() {
				log.Warn("upstream sockets keep the kernel's buffer sizes; a client that does not read pins more memory than the connection bound counts", "err", err)
			})
		}
		return nil
	}
}

// listenTCP opens the proxy listener. Accepted connections get their
// receive buffer from the listening socket's, and their keepalive from
// prepareClient alone: KeepAlive -1 spares Go's default settings at each
// accept, four system calls that prepareClient would undo.
func listenTCP(ctx context.Context, addr string) (net.Listener, error) {
	lc := net.ListenConfig{KeepAlive: -1, Control: func(_, _ string, rc syscall.RawConn) error {
		_ = setRcvBuf(rc, sockRcvBuf) // best effort, as on the upstream sockets
		return nil
	}}
	return lc.Listen(ctx, "tcp", addr) // an error names the address
}

// activatedProxyListener gives a listener the service manager or the
// running instance passed what listenTCP gives its own: the receive
// buffer.
func activatedProxyListener(ln *net.TCPListener) net.Listener {
	if rc, err := ln.SyscallConn(); err == nil {
		_ = setRcvBuf(rc, sockRcvBuf)
	}
	return ln
}

// serve accepts connections on sl until ctx is done. It survives every
// accept error (see steadyListener), so the proxy never stops accepting
// while its health probes stay green.
func (p *proxy) serve(ctx context.Context, sl *steadyListener) {
	stop := context.AfterFunc(ctx, func() { _ = sl.Close() })
	defer stop()
	p.reapIdle(ctx)
	// A client accepted just before the stop must not lose its dial with
	// it when the stop is graceful.
	connCtx := ctx
	if p.graceful {
		connCtx, p.stopConns = context.WithCancel(context.WithoutCancel(ctx))
	}
	for {
		c, err := sl.Accept()
		if err != nil {
			return // closed
		}
		if !p.takeSlot(ctx) {
			_ = c.Close()
			return
		}
		p.wg.Go(func() { p.handle(connCtx, c) }) // handle gives the slot back
	}
}

// handle serves one client connection from its slot to its end: it joins
// the client to an upstream and copies both ways until both directions
// have ended, then gives the slot back.
func (p *proxy) handle(ctx context.Context, client net.Conn) {
	defer func() { <-p.slots }()
	defer client.Close()
	prepareClient(client)
	pc := &proxyConn{client: client}
	u, err := p.connect(ctx, pc)
	if err != nil {
		p.refused(ctx, client, err)
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
	start := time.Now()
	first, second := p.copyBoth(pc)
	pc.claim(naturalEnd(pc, first))
	toUpstream, toClient := first.n, second.n
	if first.src != pc.client {
		toUpstream, toClient = toClient, toUpstream
	}
	p.logEnd(ctx, pc, start, toUpstream, toClient)
}

// prepareClient sets the spec's keepalive, TCP_USER_TIMEOUT and
// TCP_NOTSENT_LOWAT on an accepted client socket, the settings it does not
// get from the listener; best effort: a connection works without them.
// (A passed listener's accept also applies Go's default keepalive first,
// which this replaces.) TCP_NOTSENT_LOWAT set on the listener
// would not reach it: Go's listeners are MPTCP ones where the kernel has
// MPTCP, which keep that option for MPTCP connections, not the plain TCP
// ones that TCP clients get.
func prepareClient(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: tcpKeepAliveIdle, Interval: 15 * time.Second, Count: 9})
		if rc, err := tc.SyscallConn(); err == nil {
			_ = setUserTimeout(rc, tcpUserTimeout)
			_ = setNotsentLowat(rc, sockNotsentLowat)
		}
	}
}

// refused counts and logs a client that no upstream could be dialled for:
// every one at debug level, and a warning with how many since the last at
// most once per warnEvery, so that a control plane out of reach does not
// flood the log with a line per client.
func (p *proxy) refused(ctx context.Context, client net.Conn, err error) {
	if ctx.Err() != nil {
		return // shutdown called the dials off
	}
	p.m.clientsRefused.Inc()
	p.log.Debug("client connection closed without upstream", "client", client.RemoteAddr().String(), "err", err)
	if left, due := p.refusedWarning.note(time.Now()); due {
		p.log.Warn("client connections refused: no upstream could be reached", "refused", left+1, "err", err)
	}
}

// copyResult is how one direction of a connection ended.
type copyResult struct {
	dst, src net.Conn
	n        int64 // bytes copied
	err      error // nil: src ended cleanly
}

// copyHalf copies src to dst until src ends and reports how, counting the
// bytes on counted. Between two TCP sockets the copy splices on Linux, so
// bulk bytes never enter user space. It is a named function so that it
// shows in stack dumps.
func copyHalf(results chan<- copyResult, dst, src net.Conn, counted prometheus.Counter) {
	n, err := copyCounted(dst, src, counted)
	results <- copyResult{dst: dst, src: src, n: n, err: err}
}

// copyChunk is how many bytes of a direction pass between two additions to
// upstream_bytes_total, so a long-lived connection's bytes show while it
// runs, at most this much late. It is the most Go's splice moves in one
// call (its pipe's 1 MiB): a smaller chunk cuts every bulk splice short
// and multiplies the system calls per gigabyte.
const copyChunk = 1 << 20

// copyCounted copies src to dst until src ends, adding to bytes every
// copyChunk, and returns the total; a clean end is a nil error. io.CopyN
// splices between TCP sockets as io.Copy does.
func copyCounted(dst, src net.Conn, bytes prometheus.Counter) (int64, error) {
	var total int64
	for {
		n, err := io.CopyN(dst, src, copyChunk)
		total += n
		bytes.Add(float64(n))
		switch {
		case errors.Is(err, io.EOF):
			return total, nil
		case err != nil:
			return total, err
		}
	}
}

// copyBoth runs the two directions of pc and returns when both have ended.
// A clean end of one direction is passed on as a half-close, while the
// other goes on. What the proxy has accepted from one peer reaches the other
// if that one is still there, as it would on a direct connection, where
// bytes the kernel acknowledged stay readable after a reset: so a direction
// whose destination broke while its source is live leaves the other
// direction to deliver the broken socket's last bytes, for flushTimeout at
// most. Any failure then tears the connection down (see tearDown). It
// returns the direction that ended first and the other.
func (p *proxy) copyBoth(pc *proxyConn) (first, second copyResult) {
	results := make(chan copyResult, 2)
	go copyHalf(results, pc.upstream, pc.client, pc.owner.counters.toUpstream)
	go copyHalf(results, pc.client, pc.upstream, pc.owner.counters.toClient)
	first = <-results
	p.noteDead(pc, first.err)
	switch {
	case first.err == nil:
		// A clean end passes on as a half-close. A failure is ignored: the
		// socket is broken, and the copy reading it will say so.
		if cw, ok := first.dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
	case connBroken(first.dst) && !connBroken(first.src):
		select {
		case second = <-results:
			p.noteDead(pc, second.err)
			tearDown(pc)
		case <-time.After(flushTimeout):
			pc.close() // the other direction is stuck on a peer that does not read
			second = <-results
		}
		return first, second
	default:
		tearDown(pc)
	}
	second = <-results
	p.noteDead(pc, second.err)
	if second.err != nil {
		tearDown(pc)
	}
	return first, second
}

// noteDead counts pc in dead_connections_closed_total, once, when err says
// the kernel gave up on a peer that stopped answering: keepalive or
// TCP_USER_TIMEOUT, sooner while the upstream is suspect.
func (p *proxy) noteDead(pc *proxyConn, err error) {
	if errors.Is(err, syscall.ETIMEDOUT) && !pc.dead.Swap(true) {
		p.m.deadConnsClosed.Inc()
	}
}

// tearDown ends a failed connection: a broken socket closes at once, which
// ends the copy still reading it; a live one first gets what is queued on
// it acknowledged, for flushTimeout at most, then a reset, which passes on
// that the connection failed (a FIN would pass a cut-off answer for a whole
// one). Closing a live socket at once would throw its queue away: the
// kernel resets a socket closed with input unread, and a peer still
// sending leaves some.
func tearDown(pc *proxyConn) {
	var live []net.Conn
	for _, c := range []net.Conn{pc.client, pc.upstream} {
		if connBroken(c) {
			_ = c.Close()
		} else {
			live = append(live, c)
		}
	}
	deadline := time.Now().Add(flushTimeout)
	for pause := time.Millisecond; slices.ContainsFunc(live, queued) && time.Now().Before(deadline); pause = min(2*pause, 50*time.Millisecond) {
		time.Sleep(pause)
	}
	for _, c := range live {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // the close sends a reset
		}
		_ = c.Close()
	}
}

// shutdown force-closes every proxied connection and waits up to
// shutdownTimeout for the handlers. serve must have returned.
func (p *proxy) shutdown() error {
	if p.stopConns != nil {
		p.stopConns() // before closing: a handler still dialling then ends at its check
	}
	p.pool.closeConns()
	if !waitShutdown(p.wg.Wait) {
		return fmt.Errorf("proxy goroutines still running after %s", shutdownTimeout)
	}
	return nil
}
