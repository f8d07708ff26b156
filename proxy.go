package main

import (
	"context"
	"errors"
	"fmt"
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

	// quickRecheck is the delay of the check after a failed one.
	quickRecheck = time.Second

	// The hedge delay is hedgeFactor times the slowest connect time of the
	// preferred group, within [hedgeMin, hedgeMax]; hedgeMax when no
	// sample exists yet.
	hedgeFactor = 4
	hedgeMin    = 50 * time.Millisecond
	hedgeMax    = 500 * time.Millisecond

	// fdsPerConn is what the descriptor bound counts per proxied
	// connection: its two sockets, which are all an idle connection holds,
	// and one splice pipe (two descriptors). Pipes are borrowed from a pool
	// only while bytes move (see copyStream), so this leaves a pipe for
	// every connection moving bytes in one direction at a time; beyond
	// that, Go copies through user space when pipe(2) fails.
	fdsPerConn = 4
	// fdReserve descriptors are never used for proxied connections, so the
	// health server, the probes and discovery keep working while clients
	// hold every other descriptor.
	fdReserve = 256

	// memPerConn is what the memory bound counts per proxied connection,
	// about four times what an idle one takes (8-9 KiB of the process's
	// memory and a few KiB of socket memory, both charged to its cgroup),
	// leaving room for the buffers and larger stacks of connections moving
	// bytes; memReserve is kept for the rest of the daemon, which idles at
	// about 16 MiB. The bound is never below fewConnections: a memory
	// limit that small still runs an idle daemon, whose node agents need
	// a few dozen connections, discovery's own among them.
	memPerConn = 32 << 10
	memReserve = 24 << 20

	localRetryDelay  = 10 * time.Millisecond
	acceptProbe      = 10 * time.Millisecond
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second

	// workerIdle is how long a worker goroutine waits for its next task.
	workerIdle = 5 * time.Second

	// flushTimeout bounds how long a failed connection's live peer gets to
	// take what is queued for it (flushThenReset), and how long a yielded
	// direction may go on (session.failed). A peer that reads does so in
	// milliseconds; one that has stopped reading loses the rest when it
	// runs out.
	flushTimeout = 10 * time.Second
)

var (
	errNoUpstream = errors.New("no upstream available")
	errDraining   = errors.New("upstream started draining during the dial")
)

// socketSettings are the keepalive and user-timeout settings of an upstream
// socket.
type socketSettings struct {
	keepAlive   net.KeepAliveConfig
	userTimeout time.Duration
}

var (
	// normalSettings are what every upstream socket is dialed with. The
	// probe count is left alone: with TCP_USER_TIMEOUT set, Linux ignores
	// it and ends the connection once probes have gone unanswered for the
	// user timeout (tcp(7)). One system call fewer per connection.
	normalSettings = socketSettings{
		keepAlive:   net.KeepAliveConfig{Enable: true, Idle: tcpKeepAliveIdle, Count: -1},
		userTimeout: tcpUserTimeout,
	}
	// sweepSettings make the kernel drop a connection whose peer has
	// vanished within seconds: keepalive probes every second from 1 s idle,
	// and 3 s without an answer kill it, to probes or to unacknowledged data
	// alike (TCP_USER_TIMEOUT governs both; the count of 3 matters only
	// where the kernel lacks it). Recovery back to normalSettings leaves
	// that count, which the 30 s user timeout then overrides. A peer that
	// is alive but slow answers the probes and keeps its connections.
	sweepSettings = socketSettings{
		keepAlive:   net.KeepAliveConfig{Enable: true, Idle: time.Second, Interval: time.Second, Count: 3},
		userTimeout: 3 * time.Second,
	}
)

// apply sets s on c if c is a TCP connection; failures are ignored, as the
// connection still works with the settings it had.
func (s socketSettings) apply(c net.Conn) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return
	}
	s.setProbing(tc)
	s.setIdle(tc)
}

// setProbing sets all of s but the idle time, which setIdle sets last.
// Setting the idle time reschedules the keepalive timer, due at once on a
// socket idle for longer, and the timer may run before the next system
// call. A probe it sends is followed by the next one after the interval in
// force then: with the idle time set first, as SetKeepAliveConfig does, a
// swept connection could wait the old 15 s interval instead of 1 s.
func (s socketSettings) setProbing(tc *net.TCPConn) {
	ka := s.keepAlive
	ka.Idle = -1 // left as it is
	_ = tc.SetKeepAliveConfig(ka)
	if rc, err := tc.SyscallConn(); err == nil {
		_ = setUserTimeout(rc, s.userTimeout)
	}
}

// setIdle sets the keepalive idle time of s; see setProbing.
func (s socketSettings) setIdle(tc *net.TCPConn) {
	_ = tc.SetKeepAliveConfig(net.KeepAliveConfig{Enable: s.keepAlive.Enable, Idle: s.keepAlive.Idle, Interval: -1, Count: -1})
}

// hedgeDelay derives the hedge delay from the connect times of the
// preferred group.
func hedgeDelay(groups [][]*upstream) time.Duration {
	var slowest time.Duration
	if len(groups) > 0 {
		for _, u := range groups[0] {
			if u.hasRTT {
				slowest = max(slowest, u.rtt)
			}
		}
	}
	if slowest == 0 {
		return hedgeMax
	}
	return min(max(hedgeFactor*slowest, hedgeMin), hedgeMax)
}

// proxyConn is one proxied connection: the accepted client socket and the
// upstream socket it was joined to.
type proxyConn struct {
	client   net.Conn
	upstream net.Conn // set before the pool learns of pc, never changed after
	// dead is set once pc is counted in dead_connections_closed_total: by
	// the copy that met the kernel's ETIMEDOUT or by the pool's sweep
	// (see pool.closeStalled), whichever comes first.
	dead atomic.Bool
}

// close force-closes both sockets; the copy goroutines then end on their own.
func (pc *proxyConn) close() {
	_ = pc.client.Close()
	_ = pc.upstream.Close()
}

type dialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// proxy is the TCP data path: the accept loop, a worker per client
// connection while it dials (see workers), then one goroutine per direction
// while it copies, all owned by serve and waited for by shutdown.
type proxy struct {
	log         *slog.Logger
	m           *metrics
	pool        *pool
	dial        dialFunc
	dialTimeout time.Duration
	hedge       bool // start a second dial when the first is slow

	// slots bounds the proxied connections by the descriptor limit; see
	// fdsPerConn. A slot is taken before Accept, so at the limit clients
	// wait in the listen backlog instead of being reset.
	slots   chan struct{}
	wg      sync.WaitGroup // connection goroutines
	workers workers        // run connection setup and dials

	// stalledSince is when Accept started failing (UnixNano), 0 while it works.
	stalledSince atomic.Int64
	// peak is the most client connections open at once since the last
	// takePeak, which resets it; only serve raises it.
	peak atomic.Int64
	// refusedLogged is when refused last warned (UnixNano), refusedSince
	// how many clients were refused since.
	refusedLogged, refusedSince atomic.Int64
}

func newProxy(log *slog.Logger, m *metrics, pl *pool, dialTimeout time.Duration, maxConns int) *proxy {
	d := &net.Dialer{
		KeepAliveConfig: normalSettings.keepAlive,
		Control:         userTimeoutControl(log),
	}
	m.connLimit.Set(float64(max(maxConns, 1)))
	return &proxy{
		log: log, m: m, pool: pl,
		dial:        d.DialContext,
		dialTimeout: dialTimeout,
		hedge:       true,
		slots:       make(chan struct{}, max(maxConns, 1)),
		workers:     workers{tasks: make(chan func()), quit: make(chan struct{})},
	}
}

// userTimeoutControl returns the upstream dialer's Control function: it
// sets TCP_USER_TIMEOUT on the socket before it connects. A kernel or
// sandbox that refuses the option must not fail the dial, which would be
// blamed on the upstream and refuse every client while health checks,
// which do not set it, pass; as on client sockets (prepareClient), keepalive
// still ends dead connections. The first refusal is logged.
func userTimeoutControl(log *slog.Logger) func(network, address string, rc syscall.RawConn) error {
	var once sync.Once
	return func(_, _ string, rc syscall.RawConn) error {
		if err := setUserTimeout(rc, normalSettings.userTimeout); err != nil {
			once.Do(func() {
				log.Warn("upstream sockets get no TCP_USER_TIMEOUT; keepalive alone ends connections to vanished upstreams", "err", err)
			})
		}
		return nil
	}
}

// listenTCP opens the proxy listener. Accepted connections inherit the
// keepalive settings from the ListenConfig.
func listenTCP(ctx context.Context, addr string) (net.Listener, error) {
	lc := listenConfig(net.KeepAliveConfig{Enable: true, Idle: tcpKeepAliveIdle, Interval: 15 * time.Second, Count: 9})
	return lc.Listen(ctx, "tcp", addr) // an error names the address
}

// maxConnections returns the bound on proxied connections and what sets
// it: the open-files limit (see connLimit) or, where it is lower, the
// memory limit of the process's cgroup (see memConnLimit). Without the
// latter, a local process opening connections until the daemon's memory
// ran out would get it killed, and every proxied connection with it.
func maxConnections(nofile, memory uint64) (int, string) {
	limit := connLimit(nofile)
	if m := memConnLimit(memory); m > 0 && m < limit {
		return m, limitByMemory
	}
	return limit, limitByFiles
}

// What sets the connection limit, as start-up logs it.
const (
	limitByFiles  = "open files"
	limitByMemory = "memory"
)

// memConnLimit derives the number of proxied connections from a memory
// limit in bytes, keeping memReserve for everything else; 0 for no limit.
func memConnLimit(memory uint64) int {
	if memory == 0 {
		return 0
	}
	if memory <= memReserve+fewConnections*memPerConn {
		return fewConnections
	}
	return int(min((memory-memReserve)/memPerConn, 1<<20))
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
	var limitLogged time.Time
	for {
		if !p.takeSlot(ctx, &limitLogged) {
			return
		}
		c, err := ln.Accept()
		if err != nil {
			<-p.slots
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			if backoff != 0 && isTimeout(err) {
				// Accept waited instead of failing: it works again,
				// even though no client has arrived to prove it.
				backoff = p.acceptRecovered(ln)
				continue
			}
			backoff = p.acceptFailed(err, backoff)
			if !sleepCtx(ctx, backoff) {
				return
			}
			// accept4 fails with EMFILE even with no client waiting, as
			// it takes a descriptor first; a short deadline on the next
			// try tells "works, nobody waiting" from "still exhausted".
			setAcceptDeadline(ln, time.Now().Add(acceptProbe))
			continue
		}
		if backoff != 0 {
			backoff = p.acceptRecovered(ln)
		}
		p.notePeak()
		p.wg.Add(1)
		p.workers.run(func() { defer p.wg.Done(); p.handle(ctx, c) }) // handle gives the slot back
	}
}

// takeSlot takes a connection slot for the next Accept, waiting while every
// slot is in use, and reports false if ctx ends first. Being at the limit
// is logged at once and every limitLogEvery while it lasts, but not more
// often (logged is when it last was), so connections coming and going at
// the limit do not flood the log; the end of a logged wait is logged too.
func (p *proxy) takeSlot(ctx context.Context, logged *time.Time) bool {
	select {
	case p.slots <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	default:
	}
	warned := false
	for {
		wait := limitLogEvery - time.Since(*logged)
		if wait <= 0 {
			*logged, warned, wait = time.Now(), true, limitLogEvery
			p.log.Warn("at the connection limit: new clients wait in the listen backlog; raise the open-files limit for more",
				"limit", cap(p.slots))
		}
		if p.waitSlot(ctx, wait) {
			if warned {
				p.log.Info("below the connection limit again", "limit", cap(p.slots))
			}
			return true
		}
		if ctx.Err() != nil {
			return false
		}
	}
}

// waitSlot waits up to d for a connection slot and reports whether it
// took one; it gives up early when ctx ends.
func (p *proxy) waitSlot(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case p.slots <- struct{}{}:
		return true
	case <-ctx.Done():
	case <-t.C:
	}
	return false
}

// limitLogEvery spaces the log lines about being at the connection limit.
const limitLogEvery = time.Minute

// acceptFailed logs the first failure of an episode and returns the next,
// doubled, backoff.
func (p *proxy) acceptFailed(err error, backoff time.Duration) time.Duration {
	if backoff == 0 {
		p.stalledSince.Store(time.Now().UnixNano())
		p.log.Error("accept failing, backing off until it works again", "err", err)
	}
	return nextAcceptBackoff(backoff)
}

// nextAcceptBackoff is the wait after a failed accept that followed a wait
// of prev, 0 for the first failure: from acceptBackoffMin, doubling to
// acceptBackoffMax. The health server's listener backs off the same way.
func nextAcceptBackoff(prev time.Duration) time.Duration {
	return min(max(2*prev, acceptBackoffMin), acceptBackoffMax)
}

// acceptRecovered ends an episode of failing Accepts and returns the reset
// backoff.
func (p *proxy) acceptRecovered(ln net.Listener) time.Duration {
	setAcceptDeadline(ln, time.Time{})
	p.stalledSince.Store(0)
	p.log.Info("accepting connections again")
	return 0
}

// setAcceptDeadline sets the deadline of Accept on listeners that have one.
func setAcceptDeadline(ln net.Listener, t time.Time) {
	if dl, ok := ln.(interface{ SetDeadline(t time.Time) error }); ok {
		_ = dl.SetDeadline(t)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// acceptStalledFor reports how long Accept has been failing (0 if it works).
func (p *proxy) acceptStalledFor() time.Duration {
	since := p.stalledSince.Load()
	if since == 0 {
		return 0
	}
	return time.Since(time.Unix(0, since))
}

// handle joins one client connection to an upstream and starts the two
// copy goroutines, which end the connection and give its slot back. It
// returns as soon as they run: its stack grew while dialing, and an idle
// connection should only keep the two small stacks of its copies.
func (p *proxy) handle(ctx context.Context, client net.Conn) {
	prepareClient(client)
	pc := &proxyConn{client: client}
	u, err := p.connect(ctx, pc)
	if err != nil {
		p.refused(ctx, client, err)
		p.end(nil, pc)
		return
	}
	if ctx.Err() != nil {
		p.end(u, pc) // shutdown raced the dial; the connection must not outlive it
		return
	}
	p.m.connectionsTotal.Inc()
	p.m.connectionsActive.Inc()
	s := &session{p: p, u: u, pc: pc}
	s.running.Store(2)
	p.wg.Go(func() { s.copy(pc.upstream, pc.client) })
	p.wg.Go(func() { s.copy(pc.client, pc.upstream) })
}

// refused counts and logs a client that no upstream could be dialled for.
// Every refusal is logged at debug level; a warning, with how many were
// refused since the last one, at most once per refusedLogEvery, so that a
// control plane out of reach does not flood the log with a line per client.
func (p *proxy) refused(ctx context.Context, client net.Conn, err error) {
	if ctx.Err() != nil {
		return // shutdown called the dials off
	}
	p.m.clientsRefused.Inc()
	p.log.Debug("client connection closed without upstream", "client", client.RemoteAddr().String(), "err", err)
	n := p.refusedSince.Add(1)
	now := time.Now().UnixNano()
	last := p.refusedLogged.Load()
	if now-last < int64(refusedLogEvery) || !p.refusedLogged.CompareAndSwap(last, now) {
		return
	}
	p.refusedSince.Add(-n)
	p.log.Warn("client connections refused: no upstream could be reached", "refused", n, "err", err)
}

// refusedLogEvery spaces the warnings about refused clients.
const refusedLogEvery = time.Minute

// end closes a client connection that is over and gives its slot back.
// u is the upstream pc is attached to, nil if none.
func (p *proxy) end(u *upstream, pc *proxyConn) {
	if u != nil {
		_ = pc.upstream.Close()
		p.pool.detach(u, pc)
	}
	_ = pc.client.Close()
	<-p.slots
}

// open returns the client connections open now, counting one that is
// being accepted.
func (p *proxy) open() int {
	return len(p.slots)
}

// notePeak raises peak to the connections open now; serve calls it after
// each accept.
func (p *proxy) notePeak() {
	if n := int64(p.open()); n > p.peak.Load() {
		p.peak.Store(n)
	}
}

// takePeak returns the most client connections open at once since the last
// call (0 if none was accepted since) and starts counting afresh.
func (p *proxy) takePeak() int {
	return int(p.peak.Swap(0))
}

// session is one proxied connection while its two directions copy.
type session struct {
	p       *proxy
	u       *upstream
	pc      *proxyConn
	running atomic.Int32 // directions still copying
	// torn is set by the direction that tears the connection down after
	// an error; the other one then leaves the sockets to it.
	torn atomic.Bool
	// yielded is set by a direction that stopped on its broken
	// destination, leaving the teardown to the other direction: that one
	// then reads the broken socket's last bytes and an end that may look
	// clean, as the error went to the stopped direction's write.
	yielded atomic.Bool
	// giveUp is armed by a yield: the other direction may be stuck writing
	// to a peer that does not read, with nothing left reading the broken
	// side, so after flushTimeout the connection is closed whatever it is
	// doing (see failed).
	giveUp atomic.Pointer[time.Timer]
}

// copy copies one direction; the last direction to finish ends the
// connection. A clean end of src is passed on as a half-close of dst while
// the other direction goes on; once both have ended, closing the sockets
// sends the FINs, one system call fewer. An error ends the connection as
// failed says. Neither socket is wrapped in anything: copyStream needs the
// *net.TCPConn itself to wait on it and to splice.
func (s *session) copy(dst, src net.Conn) {
	if err := copyStream(dst, src); err != nil || s.yielded.Load() {
		s.failed(err, dst, src)
	} else if s.running.Load() > 1 {
		closeWrite(dst)
	}
	if s.running.Add(-1) > 0 {
		return
	}
	if s.yielded.Load() {
		s.tearDown() // the other direction ended before it saw the yield
	}
	s.p.m.connectionsActive.Dec()
	s.p.end(s.u, s.pc)
}

// failed handles a copy from src to dst that ended in err, or that ended
// after the other direction yielded (err may then be nil). (It is a
// function of its own to keep copy's frame small; see smallCopy.)
//
// What the proxy has accepted from one peer reaches the other if that one
// is still there, as it would on a direct connection, where bytes the
// kernel acknowledged stay readable after a reset. So a direction whose
// destination broke (reset or timed out) yields while the other one runs:
// that one still has the broken socket's last bytes to deliver, and ends
// on its error, or on an end that looks clean when this direction's write
// took the error. Otherwise the connection is torn down (see tearDown).
func (s *session) failed(err error, dst, src net.Conn) {
	if errors.Is(err, syscall.ETIMEDOUT) {
		// The kernel gave up on a peer that stopped answering: keepalive
		// or TCP_USER_TIMEOUT, sooner while the upstream is suspect.
		// Counted before the client can see the close.
		if !s.pc.dead.Swap(true) {
			s.p.m.deadConnsClosed.Inc()
			s.u.log.Debug("connection to vanished peer closed", "err", err)
		}
	}
	if s.torn.Load() {
		return
	}
	if s.running.Load() > 1 && connBroken(dst) && !connBroken(src) {
		s.yielded.Store(true)
		s.giveUp.Store(time.AfterFunc(flushTimeout, s.abort))
		return
	}
	s.tearDown()
}

// abort ends a yielded connection that did not end within flushTimeout:
// both sockets close at once, which ends both directions.
func (s *session) abort() {
	if s.torn.CompareAndSwap(false, true) {
		s.pc.close()
	}
}

// tearDown ends a failed connection, once: a broken socket closes at once,
// which ends the copy still reading it; a live one first gets what is
// queued on it, then a reset, which passes on that the connection failed
// (a FIN would pass a cut-off answer for a whole one). See flushThenReset.
func (s *session) tearDown() {
	if !s.torn.CompareAndSwap(false, true) {
		return
	}
	if t := s.giveUp.Load(); t != nil {
		t.Stop()
	}
	var live []net.Conn
	for _, c := range []net.Conn{s.pc.client, s.pc.upstream} {
		if connBroken(c) {
			_ = c.Close()
		} else {
			live = append(live, c)
		}
	}
	flushThenReset(live...)
}

// prepareClient sets TCP_USER_TIMEOUT on an accepted client socket, the one
// setting it does not inherit from the listener (see listenTCP).
func prepareClient(client net.Conn) {
	if tc, ok := client.(*net.TCPConn); ok {
		if rc, err := tc.SyscallConn(); err == nil {
			_ = setUserTimeout(rc, tcpUserTimeout) // best effort: keepalive still applies
		}
	}
}

// connect dials upstreams for pc until one answers: first the pickable
// upstreams in the selector's order (each at most once), then, as a last
// resort, the non-draining ones that are not pickable, most recently healthy
// first. When a dial has not completed after the hedge delay, a second one
// starts to the next pickable upstream and the first to connect wins. On
// success pc.upstream is set and pc is attached to the returned upstream.
func (p *proxy) connect(ctx context.Context, pc *proxyConn) (*upstream, error) {
	ctx, cancel := context.WithCancel(ctx)
	cd := &connDial{p: p, ctx: ctx, cancel: cancel, results: make(chan attempt), lastErr: errNoUpstream}
	defer cd.wait()
	if !cd.start(false) {
		return nil, cd.lastErr
	}
	cd.hedgeDelay = p.pool.snap.Load().hedgeDelay
	hedge := time.NewTimer(cd.hedgeDelay)
	defer hedge.Stop()
	for cd.inflight > 0 {
		select {
		case a := <-cd.results:
			cd.inflight--
			if cd.finish(a, pc) {
				return a.u, nil
			}
			// The dial still in flight, or the next one, gets a hedge
			// of its own: one hanging dial must not hold the client
			// for the dial timeout while other upstreams are there.
			if cd.inflight > 0 || cd.start(false) {
				cd.hedgeDelay = p.pool.snap.Load().hedgeDelay
				hedge.Reset(cd.hedgeDelay)
			}
		case <-hedge.C:
			if p.hedge && cd.inflight == 1 && cd.start(true) {
				p.m.hedgedDials.Inc()
			}
		}
	}
	return nil, cd.lastErr
}

// attempt is one dial of a client connection to one upstream.
type attempt struct {
	u          *upstream
	lastResort bool // u was not pickable when the dial started
	hedged     bool // started because an earlier dial was slow
	conn       net.Conn
	err        error
	start      time.Time     // when connect started the dial
	took       time.Duration // from start until it connected, failed or was called off
}

// connDial is the dial state of one client connection. Only the goroutine
// running connect touches it; the dials, on workers, report on results.
type connDial struct {
	p            *proxy
	ctx          context.Context //nolint:containedctx // the dials of one connection share it: cancelled once one won, or on shutdown
	cancel       context.CancelFunc
	results      chan attempt
	tried        []*upstream
	inflight     int
	drainRetried bool
	won          bool
	stop         bool          // no further dials: out of descriptors or drain retried
	hedgeDelay   time.Duration // of the hedge timer last armed
	lastErr      error
}

// start begins a dial to the next upstream and reports whether it did.
// Hedged dials go only to pickable upstreams.
func (cd *connDial) start(hedged bool) bool {
	if cd.stop || cd.ctx.Err() != nil {
		return false
	}
	a := attempt{u: cd.p.pool.pick(cd.tried), hedged: hedged, start: time.Now()}
	if a.u == nil {
		if hedged {
			return false
		}
		if a.u = cd.p.pool.lastResort(cd.tried); a.u == nil {
			return false
		}
		a.lastResort = true
	}
	cd.tried = append(cd.tried, a.u)
	cd.inflight++
	cd.p.workers.run(func() { cd.p.dialAttempt(cd.ctx, a, cd.results) })
	return true
}

// finish handles one finished dial and reports whether it won.
func (cd *connDial) finish(a attempt, pc *proxyConn) bool {
	if a.err != nil {
		cd.failed(a)
		return false
	}
	if cd.ctx.Err() != nil { // shutdown
		_ = a.conn.Close()
		return false
	}
	pc.upstream = a.conn
	if cd.p.pool.connected(a.u, pc) {
		if a.hedged {
			cd.p.m.hedgedWins.Inc()
		}
		cd.won = true
		cd.cancel() // the other dial, if any, lost
		return true
	}
	// a.u started draining while it was dialed: one retry elsewhere.
	_ = a.conn.Close()
	pc.upstream = nil
	cd.lastErr = errDraining
	cd.stop = cd.drainRetried
	cd.drainRetried = true
	return false
}

// failed accounts a failed dial. A dial cancelled because another won, or
// because of shutdown, says nothing about its upstream; nor does a dial
// that failed because this process is out of descriptors.
func (cd *connDial) failed(a attempt) {
	if cd.ctx.Err() != nil {
		return
	}
	cd.lastErr = a.err
	if isLocalExhaustion(a.err) {
		cd.stop = true
		return
	}
	cd.blame(a)
}

// blame counts the failed dial a against its upstream. A last-resort dial
// counts in connection_errors_total only while some upstream is available,
// as the spec has it: in readyz mode that is an unready but healthy
// upstream dialled after every ready one failed.
func (cd *connDial) blame(a attempt) {
	cd.p.pool.reportDial(a.u, a.err)
	if !a.lastResort || cd.p.pool.ready() {
		a.u.errs.Inc()
	}
	a.u.log.Debug("dial failed", "err", a.err, "last_resort", a.lastResort, "hedged", a.hedged)
}

// wait cancels the dials still in flight and waits for them, closing any
// that connected after another had won.
func (cd *connDial) wait() {
	cd.cancel()
	for ; cd.inflight > 0; cd.inflight-- {
		a := <-cd.results
		switch {
		case a.err == nil:
			_ = a.conn.Close()
		case cd.won && !errors.Is(a.err, context.Canceled) && !isLocalExhaustion(a.err):
			// It failed on its own, not called off, as another won.
			cd.blame(a)
		case cd.won && a.took >= cd.hedgeDelay && !isLocalExhaustion(a.err):
			// Called off after the hedge delay: not a failure, but the
			// upstream may have vanished, and a check now starts the sweep
			// of its connections if so. Whether the dial was the hedge or
			// the one hedged does not tell which was slow: a first dial
			// may win just after its hedge started, and a slow dial that
			// connects has shown its upstream alive. A dial still waiting
			// for descriptors never reached its upstream.
			cd.p.pool.confirmSlow(a.u)
		}
	}
}

// dialAttempt runs one dial and reports it on results, which connect reads
// until every dial it started has reported.
func (p *proxy) dialAttempt(ctx context.Context, a attempt, results chan<- attempt) {
	a.conn, a.err = p.dialPatiently(ctx, a.u.addr)
	a.took = time.Since(a.start)
	if a.err == nil {
		a.u.dialSeconds.Observe(a.took.Seconds())
	}
	results <- a
}

// dialPatiently dials addr, and while the dial fails because this process
// is out of descriptors, waits and tries again, for up to the dial timeout:
// a moment of exhaustion then delays clients instead of dropping them. The
// dial that gets its sockets has a dial timeout of its own, so a failure
// within it is the upstream's, and time spent waiting for descriptors is
// never blamed on the upstream. A client may so wait up to twice the dial
// timeout; a hedged dial usually spares it that.
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
		return nil, fmt.Errorf("dial upstream %s: %w", addr, unreachableFromHere(ctx, err))
	}
	return c, nil
}

// shutdown force-closes every proxied connection and waits up to
// shutdownTimeout for the connection goroutines. serve must have returned.
func (p *proxy) shutdown() error {
	p.pool.closeConns()
	if !waitShutdown(func() { p.wg.Wait(); p.workers.stop() }) {
		return fmt.Errorf("proxy goroutines still running after %s", shutdownTimeout)
	}
	return nil
}

// workers runs the short tasks of the data path, setting up a connection
// and dialing, on goroutines that wait workerIdle for the next task before
// they end. A new goroutine starts with a 2 KiB stack and grows it, copying
// it each time, while it dials; a worker has done so already. The copy
// goroutines are not workers: they are long-lived, and an idle connection
// should keep only their small stacks.
type workers struct {
	tasks    chan func() // unbuffered: a send succeeds only to an idle worker
	quit     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// run runs task on an idle worker, or on a new one if none is idle.
func (w *workers) run(task func()) {
	select {
	case w.tasks <- task:
	default:
		w.wg.Go(func() { w.loop(task) })
	}
}

func (w *workers) loop(task func()) {
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		task()
		idle.Reset(workerIdle)
		select {
		case task = <-w.tasks:
		case <-idle.C:
			return
		case <-w.quit:
			return
		}
	}
}

// stop ends the idle workers and waits for the busy ones to finish. run
// must not be called while stop runs; a task run after it gets a worker
// that ends with the task.
func (w *workers) stop() {
	w.stopOnce.Do(func() { close(w.quit) })
	w.wg.Wait()
}

// isLocalExhaustion reports errors caused by this process or host running
// out of resources; they say nothing about the upstream. EADDRNOTAVAIL is
// one (out of ephemeral ports) unless unreachableFromHere has found that
// the host has no address or route for the upstream.
func isLocalExhaustion(err error) bool {
	for _, e := range []error{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.EADDRNOTAVAIL} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// unreachableFromHere tells apart the two causes of a connect failing with
// EADDRNOTAVAIL: this host out of ephemeral ports, which says nothing about
// the upstream, or this host having no source address or route for it,
// which is the upstream's failure and lasts (an IPv6 upstream on a node
// with IPv6 disabled). Counted as exhaustion, such an upstream would have
// its checks skipped and stay healthy for ever. A UDP connect to the same
// address makes the same route and source choice, sends nothing and takes
// no TCP port: if it fails too, other than for want of a descriptor or of
// a UDP port (EAGAIN), err is returned as an unreachableError. Any other
// err is returned as it is.
func unreachableFromHere(ctx context.Context, err error) error {
	var op *net.OpError
	if !errors.Is(err, syscall.EADDRNOTAVAIL) || !errors.As(err, &op) || op.Addr == nil || ctx.Err() != nil {
		return err
	}
	var d net.Dialer
	c, uerr := d.DialContext(ctx, "udp", op.Addr.String())
	if uerr == nil {
		_ = c.Close()
		return err
	}
	if errors.Is(uerr, syscall.EAGAIN) || isLocalExhaustion(uerr) && !errors.Is(uerr, syscall.EADDRNOTAVAIL) {
		return err // no descriptor or UDP port to tell with: assume the local cause
	}
	return unreachableError{err}
}

// unreachableError is a connect error for an address this host has no
// source address or route for. It does not unwrap, so that it is not taken
// for local exhaustion.
type unreachableError struct{ err error }

func (e unreachableError) Error() string {
	return e.err.Error() + " (this host has no address or route for it)"
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
