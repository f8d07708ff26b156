package main

import (
	"cmp"
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// failThreshold is the number of consecutive failed checks or dials that
// exclude an upstream; one success re-includes it.
const failThreshold = 2

// upstream is one API server endpoint known to the pool. addr, log, errs,
// dialSeconds, connGauge, counters and recheck are set once and read without a lock;
// every other field is guarded by pool.mu.
type upstream struct {
	addr string
	log  *slog.Logger
	// errs is connection_errors_total{upstream=addr}. Once the upstream is
	// removed its series is deleted, so late increments land on a detached
	// counter and are not exported, as the spec requires.
	errs        prometheus.Counter
	dialSeconds prometheus.Observer
	connGauge   prometheus.Gauge
	counters    connCounters
	// recheck asks the probe loop for a check now: a failed client dial and
	// a slow dial called off send to it. One pending request is enough.
	recheck chan struct{}

	// h is its state: step moves it (see applyLocked), update, the drain and
	// removeLocked set draining and removed, and the eviction code its graceFrom.
	h health
	// lastErr is the last failed check, dial or probe.
	lastErrAt, lastCheck time.Time
	lastErr              error
	// lastGood is the last check that passed whole (with readyz, its probe
	// too): an error before it is history, not the upstream's state.
	lastGood time.Time
	// shown is the state's word that /upstreams showed last, since
	// shownSince; publishLocked keeps both.
	shown           string
	shownSince      time.Time
	tier            int           // set by latencySelector when hasTier
	rtt             time.Duration // smoothed connect time of successful checks
	hasTier, hasRTT bool
	// evicted is set once its connections were closed while unready, until
	// it is ready again.
	evicted    bool
	conns      map[*proxyConn]struct{}
	stopProbes context.CancelFunc

	// The deadlines of an upstream, one mechanism (see pool.arm): the end
	// of its drain (drainTimeout after shownSince, when it began), the
	// closing of its connections while it is unready and another is ready,
	// the sweep's look at stalled connections, and the mark of a probe
	// slower than slowProbe (see probing).
	drain, evict, sweep, slow deadline
}

// poolConfig holds the timing the pool applies to every upstream.
type poolConfig struct {
	// interval: between health checks. timeout: per health check.
	// drainTimeout: grace for connections of a removed or unready upstream.
	// quickRecheck: the delay of the check that follows a failed one, so two
	// failures take seconds rather than two intervals; 0 turns it off.
	interval, timeout, drainTimeout, quickRecheck time.Duration
	// jitter spreads the checks of a fleet started together: the check
	// after the first comes at a random point of the interval, and each
	// interval after it is shortened by up to this fraction (see
	// probeLoop); 0 keeps the checks exactly interval apart.
	jitter float64
	// sweep: see sweep.go. readyz: readiness is part of selection, and
	// checks return probe results.
	sweep, readyz bool
	// forget, if set, is told of an upstream whose probe loop ended or
	// whose client dial failed, so a check that keeps a connection per
	// upstream closes it and the next check connects afresh.
	forget func(addr string)
	// closeSpread: the last part of a drain's or an eviction's grace over
	// which the upstream's connections close (see spread.go); 0 closes
	// them in one instant at its end.
	closeSpread time.Duration
	// rebalance: the period of the rebalancer (see rebalance.go); 0 turns
	// it off. quiet is its rule for a quiet moment to close a connection
	// in (see closeJob.due); nil is quietDue.
	rebalance time.Duration
	quiet     func(pc *proxyConn, now time.Time, look func() connLook) (bool, time.Time)
}

// pool owns the set of upstreams: it adds and drains them as the endpoint
// list changes, runs one probe goroutine per upstream, and applies check and
// dial results to each upstream's state machine.
type pool struct {
	log   *slog.Logger
	m     *metrics
	cfg   poolConfig
	check checkFunc
	sel   selector

	ctx    context.Context //nolint:containedctx // the pool's lifetime, parent of its probes; close cancels it
	cancel context.CancelFunc
	// closer runs the forced closes and timed actions (see closer.go);
	// closeCtx, which closeConns and close cancel, stops it.
	closer      *closer
	closeCtx    context.Context //nolint:containedctx // as ctx
	stopClosing context.CancelFunc
	wg          sync.WaitGroup // probe loops and the closer

	// mu guards upstreams, closed, notes, unusableSince and the mutable
	// fields of every upstream.
	mu        sync.Mutex
	upstreams map[string]*upstream
	closed    bool
	notes     []logNote // written by unlock, after the lock is released
	// unusableSince is when the last usable upstream (healthy, not
	// draining) went, zero while one is.
	unusableSince time.Time

	snap atomic.Pointer[snapshot]
	// steer is set by the rebalancer's closes and read by pick.
	steer atomic.Pointer[steer]
}

func newPool(log *slog.Logger, m *metrics, cfg poolConfig, check checkFunc, sel selector) *pool {
	ctx, cancel := context.WithCancel(context.Background())
	p := &pool{log: log, m: m, cfg: cfg, check: check, sel: sel, ctx: ctx, cancel: cancel, upstreams: map[string]*upstream{}}
	p.closeCtx, p.stopClosing = context.WithCancel(ctx)
	run := func() { p.wg.Go(func() { p.closer.run(p.closeCtx) }) }
	p.closer = &closer{wake: make(chan struct{}, 1), start: sync.OnceFunc(run)}
	p.snap.Store(&snapshot{})
	if cfg.rebalance > 0 {
		if p.cfg.quiet == nil {
			p.cfg.quiet = quietDue
		}
		p.rebalanceLater()
	}
	return p
}

// deadline is a pending action of one upstream; see pool.arm.
type deadline struct{ j *closeJob }

func (d *deadline) pending() bool { return d.j != nil }

// stop calls d off and reports whether it was pending. p.mu must be held.
func (d *deadline) stop() (pending bool) {
	pending, d.j = d.j != nil, nil
	return pending
}

// arm has the closer run fn with p.mu held after delay, unless stop calls
// it off, arm replaces it, or the pool closes first. p.mu must be held. A
// job called off stays with the closer until its time and then does
// nothing.
func (p *pool) arm(d *deadline, delay time.Duration, fn func()) {
	if p.closed {
		return // close has stopped the others and may be waiting already
	}
	j := &closeJob{deadline: time.Now().Add(delay)}
	j.end = func() {
		p.mu.Lock()
		defer p.unlock()
		if d.j == j && !p.closed { // not called off while it waited for the lock
			d.j = nil
			fn()
		}
	}
	d.j = p.closer.add(j)
}

// stopDeadlinesLocked calls off every deadline of u. p.mu must be held.
func (u *upstream) stopDeadlinesLocked() {
	u.drain.stop()
	u.evict.stop()
	u.sweep.stop()
	u.slow.stop()
}

// close stops every probe and deadline and waits for them. It does not
// close proxied connections; the proxy does that on shutdown.
func (p *pool) close() {
	p.mu.Lock()
	p.closed = true
	for _, u := range p.upstreams {
		u.stopDeadlinesLocked()
	}
	p.unlock()
	p.cancel()
	p.wg.Wait()
}

// update makes addrs the endpoint list: new addresses are added, draining
// ones taken back, and those no longer listed start draining.
func (p *pool) update(addrs []string) {
	p.mu.Lock()
	defer p.unlock()
	if p.closed {
		return
	}
	for _, addr := range addrs {
		if u, ok := p.upstreams[addr]; !ok {
			p.addLocked(addr)
		} else if u.h.state == upDraining {
			u.h.state = u.h.resume
			u.drain.stop()
			p.startProbesLocked(u)
			p.note(u, slog.LevelInfo, "upstream re-added, drain aborted", "connections", len(u.conns))
		}
	}
	for addr, u := range p.upstreams {
		if !slices.Contains(addrs, addr) && u.h.state != upDraining {
			p.startDrainLocked(u)
		}
	}
	p.publishLocked()
}

func (p *pool) addLocked(addr string) {
	u := &upstream{
		addr: addr, log: p.log.With("upstream", addr),
		errs:        p.m.connectionErrors.WithLabelValues(addr),
		dialSeconds: p.m.dialSeconds.WithLabelValues(addr),
		connGauge:   p.m.upstreamConns.WithLabelValues(addr),
		counters:    newConnCounters(p.m, addr),
		recheck:     make(chan struct{}, 1),
		h:           newHealth(p.rules()),
		conns:       map[*proxyConn]struct{}{},
	}
	p.upstreams[addr] = u
	p.m.healthStatus.WithLabelValues(addr).Set(1)
	p.startProbesLocked(u)
	p.note(u, slog.LevelInfo, "upstream added")
}

func (p *pool) startProbesLocked(u *upstream) {
	ctx, cancel := context.WithCancel(p.ctx)
	u.stopProbes = cancel
	p.wg.Go(func() { p.probeLoop(ctx, u) })
}

// startDrainLocked stops routing to u and gives its connections
// drainTimeout to finish. Health checks stop while it drains.
func (p *pool) startDrainLocked(u *upstream) {
	u.h.resume, u.h.state = u.h.state, upDraining
	u.stopProbes()
	if len(u.conns) == 0 || p.cfg.drainTimeout == 0 {
		p.removeLocked(u, "upstream removed", "connections_closed", len(u.conns))
		return
	}
	p.note(u, slog.LevelInfo, "upstream draining", "connections", len(u.conns), "timeout", p.cfg.drainTimeout)
	w := p.spreadWindow()
	p.arm(&u.drain, p.cfg.drainTimeout-w, func() {
		if w > 0 {
			p.note(u, slog.LevelInfo, "drain timeout ending: closing connections", "connections", len(u.conns), "over", w)
			p.closeSpreadLocked(u, w, connEndDrain)
		}
		p.arm(&u.drain, w, func() {
			p.removeLocked(u, "drain timeout expired, closing connections", "connections", len(u.conns))
			p.publishLocked()
		})
	})
}

// removeLocked logs msg with args, takes u out of the pool, closes its
// remaining connections and deletes its metric series.
func (p *pool) removeLocked(u *upstream, msg string, args ...any) {
	p.note(u, slog.LevelInfo, msg, args...)
	u.stopDeadlinesLocked()
	u.h.state = upRemoved
	delete(p.upstreams, u.addr)
	for pc := range u.conns {
		pc.closeFor(connEndDrain)
	}
	clear(u.conns)
	p.m.forgetUpstream(u.addr)
}

// reportCheck applies one health-check result to u's state machine. It
// reports whether u failed but is still included, so that a quick check
// should confirm it: a failed connect while healthy, or a failed probe
// while ready.
func (p *pool) reportCheck(u *upstream, res checkResult) (confirm bool) {
	p.mu.Lock()
	defer p.unlock()
	u.lastCheck = time.Now()
	if res.notReady != nil {
		u.lastErr, u.lastErrAt = res.notReady, u.lastCheck
	}
	if res.err == nil && res.notReady == nil {
		u.lastGood = u.lastCheck
	}
	wasSlow := u.probedLocked()
	if u.h.state >= upDraining {
		return false // checks stop while draining; the state holds until removal
	}
	if res.err == nil && res.rtt > 0 { // a probe on the kept connection may have none
		u.rtt, u.hasRTT = nextRTT(u.rtt, u.hasRTT, res.rtt), true
	}
	// A new sample may move tiers and the hedge delay: every success
	// publishes too.
	if p.applyLocked(u, res) || res.err == nil || wasSlow {
		p.publishLocked()
	}
	if res.err != nil {
		return u.h.healthy()
	}
	return p.cfg.readyz && res.notReady != nil && u.h.ready()
}

// slowProbe is how long a readyz probe of a ready upstream may go
// unanswered before new connections prefer the others, as after a failed
// probe (a deliberate difference). An API server that lost etcd answers
// /readyz from its last check, at most a second old, and hangs the one
// probe that draws the next check: a probe that hangs is the first sign.
// A healthy one answers in a round trip and a millisecond or two.
const slowProbe = 50 * time.Millisecond

// probing arms u's slow mark for a probe starting now (started), or ends
// it for a probe whose result is dropped; reportCheck ends it for the
// others.
func (p *pool) probing(u *upstream, started bool) {
	if !p.cfg.readyz {
		return
	}
	p.mu.Lock()
	defer p.unlock()
	if !started {
		if u.probedLocked() {
			p.publishLocked()
		}
		return
	}
	p.arm(&u.slow, slowProbe, func() {
		if u.h.state == upReady {
			u.h.slow = true
			p.publishLocked()
		}
	})
}

// probedLocked ends u's slow mark and reports whether it was set.
func (u *upstream) probedLocked() (wasSlow bool) {
	u.slow.stop()
	wasSlow, u.h.slow = u.h.slow, false
	return wasSlow
}

// reportDial applies a failed client dial to u, a failed connect for
// readiness too, and while u is still included asks for a check at once.
// An excluded upstream keeps to its interval: with the whole control plane
// down every client dials it as a last resort, and its checks must not
// follow the clients' retry rate.
func (p *pool) reportDial(u *upstream, err error) {
	if p.cfg.forget != nil {
		// A kept readyz connection that answers says nothing of new
		// connects, which just failed: the check asked for connects afresh.
		p.cfg.forget(u.addr)
	}
	p.mu.Lock()
	defer p.unlock()
	if u.h.state < upDraining && p.applyLocked(u, checkResult{err: err}) {
		p.publishLocked()
	}
	p.confirmLocked(u)
}

func (p *pool) confirmLocked(u *upstream) {
	if u.h.healthy() {
		select {
		case u.recheck <- struct{}{}:
		default: // one pending request is enough
		}
	}
}

// state is where an upstream stands in the health and readiness rules, in
// order of preference for new connections. Pending and not-ready rank
// alike: either takes new connections only while no upstream is ready.
type state int

const (
	// upReady: readyz, its last probe passed. Two failed in a row make it
	// not ready, as the spec's failure threshold does.
	upReady state = iota
	// upAwaitingProbe: ready, but its last probe failed or a connect
	// failed since (deliberate differences, see health.probe and
	// health.failedConnect).
	upAwaitingProbe
	upHealthy  // tcp: its connects pass
	upPending  // readyz: reachable, and no probe passed since it was added or unreachable
	upNotReady // readyz: its probes fail
	upUnhealthy
	upDraining // no longer listed: its connections get the drain timeout
	upRemoved
)

// word is what /upstreams shows of s (see status.go).
func (s state) word() string {
	return [...]string{stateReady, stateReady, stateHealthy, statePending, stateNotReady, stateUnhealthy, stateDraining, "removed"}[s]
}

// health is an upstream's state with the counts its rules need. step is
// its transition function; applyLocked applies what a step changed.
type health struct {
	state  state
	resume state // the state a drain taken back returns to
	fails  int   // failed connects in a row
	// probeFails counts failed probes in a row; probed is set once a probe
	// has run, so upstream_ready is exported. slow is set while a probe of
	// a ready upstream is slower than slowProbe (see probing).
	probeFails   int
	probed, slow bool
	// suspect is set from a failed connect until a success may restore it;
	// its sockets then use the sweep's settings (see sweep.go). restored is
	// when it last turned healthy or stopped being suspect.
	suspect  bool
	restored time.Time
	// lastHealthy, the last successful connect, orders last-resort dials.
	lastHealthy time.Time
	// graceFrom is when the drain timeout before a not-ready upstream's
	// connections close starts: when the first failed probe of the streak
	// began, when a connection reached it after its connections were
	// closed (see connected), or, zero, when the closing comes due after no
	// upstream was ready (see updateEvictionsLocked).
	graceFrom time.Time
}

// healthRules are the pool's settings that step reads.
type healthRules struct {
	readyz   bool
	interval time.Duration
}

// newHealth is the state of an upstream just added: it takes picks before
// its first check, with readyz only while none is ready.
func newHealth(r healthRules) health {
	if r.readyz {
		return health{state: upPending}
	}
	return health{state: upHealthy}
}

// healthy reports whether h's connects pass, draining or not.
func (h health) healthy() bool { return h.base() < upUnhealthy }

// ready reports whether h's probes pass, draining or not.
func (h health) ready() bool { return h.base() <= upAwaitingProbe }

// base is h's state, or the one before its drain.
func (h health) base() state {
	if h.state >= upDraining {
		return h.resume
	}
	return h.state
}

// step returns h after one check or dial result at now. h is neither
// draining nor removed: checks stop then.
func (h health) step(res checkResult, now time.Time, r healthRules) health {
	if res.err != nil {
		return h.failedConnect()
	}
	// A success restores (healthy, not suspect) at most once per check
	// interval, while failures act at once. An overloaded upstream that
	// accepts some connections and not others would otherwise flip with
	// every client dial and the check each failed dial asks for, and each
	// flip re-applies socket options to all its connections under the pool
	// lock (15-18 ms a flip measured at 3,000 connections). A flapping
	// upstream so stays out until the first success an interval after its
	// last return; one that failed once returns at its first success.
	restore := now.Sub(h.restored) >= r.interval
	h.fails, h.lastHealthy = 0, now
	turned := h.state == upUnhealthy && restore
	if turned {
		h.state = newHealth(r).state // with readyz, pending until a probe passes
	}
	if restore && (h.suspect || turned) {
		h.suspect, h.restored = false, now
	}
	if !r.readyz || !res.probed || h.state == upUnhealthy {
		return h
	}
	return h.probe(res)
}

// failedConnect is step for a failed connect or dial.
func (h health) failedConnect() health {
	h.fails++
	h.suspect = true
	switch {
	case h.state == upUnhealthy:
	case h.fails >= failThreshold:
		// The spec's failure threshold; readiness starts over, so the
		// upstream is not ready until a probe passes again.
		h.state, h.probeFails = upUnhealthy, 0
	case h.state == upReady:
		// One failed connect leaves the last probe's verdict standing:
		// resetting it would call off the closing of other upstreams'
		// connections, and a lost SYN per drain timeout would put that off
		// for ever. Until a probe passes, though, the upstream is the last
		// choice among the ready, and an API server that restarted still
		// cut off from etcd gets no new connections meanwhile.
		h.state = upAwaitingProbe
	}
	return h
}

// probe is step for a /readyz probe that ran after a successful connect.
func (h health) probe(res checkResult) health {
	h.probed = true
	if res.notReady == nil {
		h.state, h.probeFails = upReady, 0
		return h
	}
	if h.probeFails == 0 {
		h.graceFrom = res.start
	}
	h.probeFails++
	// The failure threshold, for a ready upstream; one that has not passed
	// a probe since it was added or unreachable, or whose connect failed
	// since its last probe, is not ready at its first failed probe.
	switch {
	case h.state != upReady || h.probeFails >= failThreshold:
		h.state = upNotReady
	default:
		// Still ready, but the last choice among the ready (a deliberate
		// difference): an API server fails /readyz seconds after it lost
		// etcd, and the recheck that confirms it would otherwise take the
		// requests that fail meanwhile.
		h.state = upAwaitingProbe
	}
	return h
}

// rules are the pool's settings that an upstream's state steps by.
func (p *pool) rules() healthRules { return healthRules{p.cfg.readyz, p.cfg.interval} }

// applyLocked moves u's state by one check or dial result, applies what
// changed (metrics, log lines, the sweep's socket settings) and reports
// whether the state changed. u is neither removed nor draining.
func (p *pool) applyLocked(u *upstream, res checkResult) (changed bool) {
	was, now := u.h, time.Now()
	u.h = was.step(res, now, p.rules())
	if res.err != nil {
		u.lastErr, u.lastErrAt = res.err, now
	}
	if u.h.suspect != was.suspect {
		p.setSuspectLocked(u)
	}
	err := cmp.Or(res.err, res.notReady)
	if u.h.healthy() != was.healthy() {
		p.m.healthStatus.WithLabelValues(u.addr).Set(boolGauge(u.h.healthy()))
		if u.h.healthy() {
			p.note(u, slog.LevelInfo, "upstream healthy")
		} else {
			p.note(u, slog.LevelWarn, "upstream unhealthy", "err", err, "consecutive_failures", u.h.fails)
		}
	}
	if p.cfg.readyz {
		p.noteReadyLocked(u, was, err)
	}
	return u.h.state != was.state || u.h.probed != was.probed
}

// noteReadyLocked exports u's readiness and logs its change from was.
func (p *pool) noteReadyLocked(u *upstream, was health, err error) {
	if u.h.probed {
		p.m.upstreamReady.WithLabelValues(u.addr).Set(boolGauge(u.h.ready()))
	}
	switch {
	case u.h.ready() && !was.ready():
		p.note(u, slog.LevelInfo, "upstream ready")
	case was.ready() && !u.h.ready() || u.h.state == upNotReady && was.state != upNotReady:
		// Turning unready, or found unready by the first probe after a
		// reset: either way the operator learns why.
		p.note(u, slog.LevelWarn, "upstream not ready", "err", err)
	}
}

// connected records a successful client dial to u and attaches pc to it. It
// fails when u started draining or left the pool while pc was dialled.
func (p *pool) connected(u *upstream, pc *proxyConn) bool {
	p.mu.Lock()
	defer p.unlock()
	if u.h.state >= upDraining || p.closed {
		return false
	}
	if p.applyLocked(u, checkResult{}) {
		p.publishLocked()
	}
	pc.owner, pc.since = u, time.Now()
	u.conns[pc] = struct{}{}
	u.connGauge.Inc()
	// A connection that reaches an unready upstream while another is ready
	// (a last-resort dial) gets a drain timeout of its own from the next
	// state change or check, so it is usable meanwhile rather than closed
	// the moment it was made.
	if u.evicted {
		u.evicted, u.h.graceFrom = false, time.Now()
	}
	return true
}

// detach forgets pc; the last connection of a draining upstream ends its drain.
func (p *pool) detach(u *upstream, pc *proxyConn) {
	p.mu.Lock()
	defer p.unlock()
	if _, ok := u.conns[pc]; ok {
		delete(u.conns, pc)
		u.connGauge.Dec()
	}
	if u.h.state == upDraining && len(u.conns) == 0 {
		p.removeLocked(u, "upstream drained")
		p.publishLocked()
	}
}

// closeConns force-closes every attached connection, and those still
// waiting for their spread close, for shutdown.
func (p *pool) closeConns() {
	p.stopClosing()
	p.mu.Lock()
	defer p.unlock()
	for _, u := range p.upstreams {
		for pc := range u.conns {
			pc.closeFor(connEndShutdown)
		}
	}
}

// publishLocked rebuilds the snapshot, the evictions and the pool gauges.
func (p *pool) publishLocked() {
	s := &snapshot{}
	all := slices.SortedFunc(maps.Values(p.upstreams), func(a, b *upstream) int { return cmp.Compare(a.addr, b.addr) })
	var candidates []*upstream
	drains := 0
	now := time.Now()
	for _, u := range all {
		if w := u.h.state.word(); w != u.shown {
			u.shown, u.shownSince = w, now
		}
		switch {
		case u.h.state == upDraining && u.drain.pending():
			drains++
		case u.h.state == upDraining:
		case u.h.healthy():
			candidates = append(candidates, u)
			fallthrough
		default:
			s.fallback = append(s.fallback, u)
		}
	}
	slices.SortStableFunc(s.fallback, func(a, b *upstream) int { return b.h.lastHealthy.Compare(a.h.lastHealthy) })
	s.healthy = len(candidates)
	if p.cfg.readyz {
		candidates = p.readyFirstLocked(all, candidates)
	}
	s.groups = p.sel.order(all, candidates)
	s.hedgeDelay = hedgeDelay(s.groups)
	p.snap.Store(s)
	p.m.upstreamsActive.Set(float64(s.healthy))
	p.m.upstreamsTotal.Set(float64(len(p.upstreams)))
	p.m.drains.Set(float64(drains))
	p.noteUsableLocked(s.healthy)
}

// updateEvictionsLocked starts, calls off or keeps the eviction of each
// upstream's connections: an upstream that failed its probes while another
// healthy upstream is ready loses its connections after drainTimeout, so
// long-lived clients (kubelet watches) move to a ready one.
func (p *pool) updateEvictionsLocked(all []*upstream, ready int) {
	for _, u := range all {
		want := u.h.state == upNotReady && ready > 0
		switch {
		case !want:
			if u.evict.stop() {
				p.note(u, slog.LevelInfo, "closing of connections called off")
			}
			u.evicted = false
			if ready == 0 {
				// Nowhere to move them: the grace begins when an
				// upstream is ready again, so the first to recover
				// from a cluster-wide outage does not get every
				// other upstream's connections at once.
				u.h.graceFrom = time.Time{}
			}
		case u.evict.pending() || u.evicted:
		default:
			p.startEvictionLocked(u)
		}
	}
}

// startEvictionLocked arms the closing of u's connections for the drain
// timeout after u's first failed probe rather than after the verdict: the
// two probes that make the verdict take up to two check timeouts and the
// recheck, and an API server that lost etcd quorum would otherwise keep
// its watchers that much longer without events. The grace is for requests
// already running, which have had it since the first failure.
func (p *pool) startEvictionLocked(u *upstream) {
	if u.h.graceFrom.IsZero() {
		u.h.graceFrom = time.Now()
	}
	delay, w := p.cfg.drainTimeout-time.Since(u.h.graceFrom), p.spreadWindow()
	if delay <= w { // the verdict came within the window: what is left of it
		p.evictLocked(u, max(delay, 0))
		return
	}
	p.note(u, slog.LevelInfo, "upstream not ready while another is: closing its connections after the drain timeout",
		"connections", len(u.conns), "timeout", p.cfg.drainTimeout, "in", delay.Round(time.Millisecond))
	p.arm(&u.evict, delay-w, func() { p.evictLocked(u, w) })
}

// evictLocked closes u's connections over window (see spread.go).
func (p *pool) evictLocked(u *upstream, window time.Duration) {
	u.evicted = true
	p.note(u, slog.LevelInfo, "closing connections of unready upstream", "connections", len(u.conns), "over", window)
	p.closeSpreadLocked(u, window, connEndEviction)
}

// ready reports whether at least one upstream is healthy and not draining.
func (p *pool) ready() bool {
	return p.snap.Load().healthy > 0
}
