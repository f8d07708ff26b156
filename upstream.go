package main

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

// failThreshold is the number of consecutive failed checks or dials that
// exclude an upstream; one success re-includes it.
const failThreshold = 2

// upstream is one API server endpoint known to the pool. addr, log, errs,
// dialSeconds, connGauge and recheck are set once and read without a lock;
// every other field is guarded by pool.mu.
type upstream struct {
	addr string
	log  *slog.Logger
	// errs is connection_errors_total{upstream=addr}. Once the upstream is
	// removed its series is deleted from the vector, so late increments land
	// on a detached counter and are not exported, as the spec requires.
	errs prometheus.Counter
	// dialSeconds and connGauge are this upstream's children of
	// upstream_dial_duration_seconds and upstream_connections.
	dialSeconds prometheus.Observer
	connGauge   prometheus.Gauge

	healthy     bool
	failStreak  int
	lastHealthy time.Time // last successful check or dial; orders last-resort dials
	lastErr     error     // last failed check or dial
	lastErrAt   time.Time
	lastCheck   time.Time // when the last health check ended
	tier        int       // latency tier; set by latencySelector when hasTier
	hasTier     bool
	rtt         time.Duration // smoothed connect time of successful checks
	hasRTT      bool
	// suspect is set from the first failed check or dial until the next
	// success; while set, the upstream's sockets use sweepSettings.
	suspect bool
	// sweepDone is closed when suspicion ends, or the upstream is removed,
	// before the sweep's look at stalled connections (see closeStalled);
	// nil when none is pending.
	sweepDone chan struct{}
	// recheck asks the probe loop for a check now; a failed client dial of
	// the included upstream and a slow dial called off poke it. Buffered:
	// one pending request is enough.
	recheck chan struct{}

	// Readiness, with --health-check=readyz only. readyPending is set for a
	// new upstream and for one made unhealthy by failed connects (checks
	// or client dials): not ready until the next probe passes, and its
	// connections are not moved meanwhile.
	ready        bool
	readyPending bool
	readyKnown   bool // a probe has run: upstream_ready is exported
	readyStreak  int
	// reprobe is set by a failed connect while u stays healthy: it keeps
	// its readiness, but gets new connections only if no other ready
	// upstream is free of it, and it is not ready at once if the next
	// probe fails (see stepReadiness). A passing probe clears it.
	reprobe bool
	// evictDone is closed when a pending eviction (closing the connections
	// of an unready upstream while another is ready) is called off; evicted
	// is set once it fired, until the condition ends.
	evictDone chan struct{}
	evicted   bool

	draining      bool
	drainDeadline time.Time
	drainDone     chan struct{} // closed when the current drain ends early (aborted or emptied)
	removed       bool
	conns         map[*proxyConn]struct{}
	stopProbes    context.CancelFunc
}

// snapshot is an immutable view of the pool that the accept path reads
// without locking. The pool publishes a new one on every state change.
type snapshot struct {
	groups   [][]*upstream // healthy, not draining, by preference (see selector)
	fallback []*upstream   // not draining, most recently healthy first (last resort)
	healthy  int           // healthy, not draining upstreams
	// hedgeDelay is how long a dial may take before a second one starts.
	hedgeDelay time.Duration
}

// poolConfig holds the timing the pool applies to every upstream.
type poolConfig struct {
	interval     time.Duration // between health checks
	timeout      time.Duration // per health check
	drainTimeout time.Duration // grace period for connections of a removed upstream
	// quickRecheck is the delay of the check that follows a failed one, so
	// two failures take seconds rather than two intervals; 0 turns it off.
	quickRecheck time.Duration
	// sweep switches a suspect upstream's sockets to sweepSettings so the
	// kernel finds connections to a vanished peer within seconds.
	sweep bool
	// readyz makes readiness part of selection; checks then return probe
	// results.
	readyz bool
}

// pool owns the set of upstreams: it adds and drains them as discovery
// changes the endpoint list, runs one health-check goroutine per upstream,
// and applies check and dial results to each upstream's state machine.
type pool struct {
	log   *slog.Logger
	m     *metrics
	cfg   poolConfig
	check checkFunc // one health check; see probe.go
	sel   selector

	ctx    context.Context //nolint:containedctx // the pool's own lifetime, parent of its goroutines; close cancels it
	cancel context.CancelFunc
	wg     sync.WaitGroup // probe, drain, eviction and sweep goroutines

	// mu guards upstreams and the mutable fields of every upstream in it.
	mu        sync.Mutex
	upstreams map[string]*upstream

	snap atomic.Pointer[snapshot]
}

func newPool(log *slog.Logger, m *metrics, cfg poolConfig, check checkFunc, sel selector) *pool {
	ctx, cancel := context.WithCancel(context.Background())
	p := &pool{
		log: log, m: m, cfg: cfg, check: check, sel: sel,
		ctx: ctx, cancel: cancel,
		upstreams: make(map[string]*upstream),
	}
	p.snap.Store(&snapshot{})
	return p
}

// close stops every probe, drain, eviction and sweep goroutine and waits for
// them. It does not close proxied connections; the proxy does that on
// shutdown.
func (p *pool) close() {
	p.cancel()
	p.wg.Wait()
}

// update makes addrs the endpoint list: new addresses are added, addresses
// that were draining are taken back, and addresses no longer listed start
// draining.
func (p *pool) update(addrs []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	listed := make(map[string]bool, len(addrs))
	for _, addr := range addrs {
		listed[addr] = true
		u, ok := p.upstreams[addr]
		switch {
		case !ok:
			p.addLocked(addr)
		case u.draining:
			p.abortDrainLocked(u)
		}
	}
	for addr, u := range p.upstreams {
		if !listed[addr] && !u.draining {
			p.startDrainLocked(u)
		}
	}
	p.publishLocked()
}

func (p *pool) addLocked(addr string) {
	u := &upstream{
		addr:        addr,
		log:         p.log.With("upstream", addr),
		errs:        p.m.connectionErrors.WithLabelValues(addr),
		dialSeconds: p.m.dialSeconds.WithLabelValues(addr),
		connGauge:   p.m.upstreamConns.WithLabelValues(addr),
		healthy:     true, // a new upstream takes picks before its first check
		conns:       make(map[*proxyConn]struct{}),
		recheck:     make(chan struct{}, 1),

		readyPending: true, // not ready until its first probe passes
	}
	p.upstreams[addr] = u
	p.m.healthStatus.WithLabelValues(addr).Set(1)
	p.startProbesLocked(u)
	u.log.Info("upstream added")
}

func (p *pool) startProbesLocked(u *upstream) {
	ctx, cancel := context.WithCancel(p.ctx)
	u.stopProbes = cancel
	p.wg.Go(func() { p.probeLoop(ctx, u) })
}

// startDrainLocked stops routing to u and gives its connections
// drainTimeout to finish. Health checks stop while it drains.
func (p *pool) startDrainLocked(u *upstream) {
	u.draining = true
	u.stopProbes()
	if len(u.conns) == 0 || p.cfg.drainTimeout == 0 {
		u.log.Info("upstream removed", "connections_closed", len(u.conns))
		p.removeLocked(u)
		return
	}
	u.drainDone = make(chan struct{})
	u.drainDeadline = time.Now().Add(p.cfg.drainTimeout)
	p.m.drains.Inc()
	u.log.Info("upstream draining", "connections", len(u.conns), "timeout", p.cfg.drainTimeout)
	done := u.drainDone
	p.wg.Go(func() { p.drainWait(u, done) })
}

// drainWait force-closes what is left of u's connections when the drain
// timeout expires, unless the drain ended first.
func (p *pool) drainWait(u *upstream, done chan struct{}) {
	if !p.waitFor(p.cfg.drainTimeout, done) {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if u.drainDone != done { // aborted or finished in the meantime
		return
	}
	u.log.Info("drain timeout expired, closing connections", "connections", len(u.conns))
	p.removeLocked(u)
	p.publishLocked()
}

// waitFor waits d and reports whether it passed before done closed or the
// pool shut down.
func (p *pool) waitFor(d time.Duration, done <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return false
	case <-p.ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func (p *pool) abortDrainLocked(u *upstream) {
	u.draining = false
	p.endDrainLocked(u)
	p.startProbesLocked(u)
	u.log.Info("upstream re-added, drain aborted", "connections", len(u.conns))
}

func (p *pool) endDrainLocked(u *upstream) {
	if u.drainDone != nil {
		close(u.drainDone)
		u.drainDone = nil
		p.m.drains.Dec()
	}
}

// removeLocked takes u out of the pool, closes its remaining connections and
// deletes its metric series.
func (p *pool) removeLocked(u *upstream) {
	p.endDrainLocked(u)
	p.cancelEvictionLocked(u)
	p.endSweepLocked(u)
	u.removed = true
	delete(p.upstreams, u.addr)
	for pc := range u.conns {
		pc.close()
	}
	clear(u.conns)
	p.m.forgetUpstream(u.addr)
}

// reportCheck applies one health-check result to u's state machine; res.rtt
// is the connect time of a successful check. It reports whether u failed but is
// still included, so a quick check should confirm the failure: a failed
// connect while u is healthy, or a failed /readyz probe while u is ready.
func (p *pool) reportCheck(u *upstream, res checkResult) (confirm bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	u.lastCheck = time.Now()
	if res.notReady != nil {
		u.lastErr, u.lastErrAt = res.notReady, u.lastCheck
	}
	if res.err == nil && !u.removed && !u.draining {
		u.rtt = nextRTT(u.rtt, u.hasRTT, res.rtt)
		u.hasRTT = true
	}
	changed := p.applyResultLocked(u, res)
	// A new sample may move tiers and the hedge delay, so every success
	// publishes too.
	if changed || res.err == nil {
		p.publishLocked()
	}
	if res.err != nil {
		return u.healthy
	}
	return p.cfg.readyz && res.notReady != nil && u.ready
}

// applyResultLocked moves u's health and, with readyz, its readiness by one
// check or dial result, and reports whether either changed.
func (p *pool) applyResultLocked(u *upstream, res checkResult) bool {
	changed := p.applyLocked(u, res.err)
	if p.cfg.readyz && p.applyReadyLocked(u, res) {
		changed = true
	}
	return changed
}

// applyReadyLocked moves u's readiness by one check result and reports
// whether it changed.
func (p *pool) applyReadyLocked(u *upstream, res checkResult) bool {
	if u.removed || u.draining {
		return false
	}
	wasReady, wasPending, wasReprobe := u.ready, u.readyPending, u.reprobe
	if !u.stepReadiness(res) {
		return false
	}
	if res.probed {
		u.readyKnown = true
	}
	if u.readyKnown {
		p.m.upstreamReady.WithLabelValues(u.addr).Set(boolGauge(u.ready))
	}
	switch {
	case u.ready && !wasReady:
		u.log.Info("upstream ready")
	case !u.ready && (wasReady || wasPending && !u.readyPending):
		// Turning unready, or found unready by the first probe after a
		// reset: either way the operator learns why.
		u.log.Warn("upstream not ready", "err", cmp.Or(res.err, res.notReady))
	}
	return u.ready != wasReady || u.readyPending != wasPending || u.reprobe != wasReprobe
}

// stepReadiness applies one check result to u's readiness state and
// reports false when the result says nothing about it.
func (u *upstream) stepReadiness(res checkResult) bool {
	switch {
	case res.err != nil && u.healthy:
		// One failed connect leaves the last probe's verdict standing:
		// resetting it would call off the closing of other upstreams'
		// connections, and a lost SYN per drain timeout would put that
		// off for ever. Until a probe passes, though, u is the last
		// choice among the ready (publishLocked), and one failed probe
		// makes it not ready: an API server that restarted still cut
		// off from etcd gets no new connections meanwhile.
		u.reprobe = true
	case res.err != nil: // unreachable: not ready until a probe passes again
		u.ready, u.readyPending, u.readyStreak, u.reprobe = false, true, 0, false
	case !res.probed:
		return false
	case res.notReady == nil:
		u.ready, u.readyPending, u.readyStreak, u.reprobe = true, false, 0, false
	default:
		u.readyStreak++
		if u.readyPending || u.reprobe || u.readyStreak >= failThreshold {
			u.ready, u.readyPending = false, false
		}
		u.reprobe = false
	}
	return true
}

// reportDial applies a failed client dial to u's state machine and, while
// u is still included, asks for a check at once, so a dead upstream is
// confirmed without waiting an interval. An excluded upstream keeps to the
// interval: with the whole control plane down every client dials it as a
// last resort, and its checks must not follow the clients' retry rate.
func (p *pool) reportDial(u *upstream, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	// A failed dial counts as a failed connect, for readiness too.
	if p.applyResultLocked(u, checkResult{err: err}) {
		p.publishLocked()
	}
	if u.healthy {
		p.requestCheck(u)
	}
}

// confirmSlow asks for a check of u now, after a dial to it was called off
// slow, while u is included: an excluded upstream keeps to its interval.
func (p *pool) confirmSlow(u *upstream) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if u.healthy {
		p.requestCheck(u)
	}
}

// requestCheck asks u's probe loop for a check now. A pending request is
// enough; more are dropped.
func (p *pool) requestCheck(u *upstream) {
	select {
	case u.recheck <- struct{}{}:
	default:
	}
}

// applyLocked moves u's state machine by one result and reports whether the
// pickable set changed.
func (p *pool) applyLocked(u *upstream, err error) (changed bool) {
	if u.removed || u.draining {
		return false // checks stop while draining; the state holds until removal
	}
	if err == nil {
		u.failStreak = 0
		u.lastHealthy = time.Now()
		p.setSuspectLocked(u, false)
		if !u.healthy {
			u.healthy = true
			changed = true
			u.log.Info("upstream healthy")
		}
	} else {
		u.failStreak++
		u.lastErr, u.lastErrAt = err, time.Now()
		p.setSuspectLocked(u, true)
		if u.healthy && u.failStreak >= failThreshold {
			u.healthy = false
			changed = true
			u.log.Warn("upstream unhealthy", "err", err, "consecutive_failures", u.failStreak)
		}
	}
	if changed {
		p.m.healthStatus.WithLabelValues(u.addr).Set(boolGauge(u.healthy))
	}
	return changed
}

// setSuspectLocked switches u's open sockets between the normal and the
// sweep settings when u's suspicion changes.
func (p *pool) setSuspectLocked(u *upstream, suspect bool) {
	if !p.cfg.sweep || u.suspect == suspect {
		return
	}
	u.suspect = suspect
	settings := normalSettings
	if suspect {
		settings = sweepSettings
		u.log.Info("upstream suspect: sweeping its connections", "connections", len(u.conns))
		done := make(chan struct{})
		u.sweepDone = done
		p.wg.Go(func() { p.closeStalled(u, done) })
	} else {
		p.endSweepLocked(u)
	}
	for pc := range u.conns {
		settings.apply(pc.upstream)
	}
}

// stalledAfter is when, after an upstream became suspect, closeStalled
// looks for connections the kernel will not end soon: the sweep's user
// timeout, which ends every other dead connection by then, and some slack.
var stalledAfter = sweepSettings.userTimeout + 500*time.Millisecond

// closeStalled closes those of u's connections whose upstream socket
// retransmits unacknowledged data and has had no ACK for the sweep's user
// timeout, stalledAfter into a suspicion that done has not ended. These are
// the connections whose data was already being retransmitted when the
// sweep began: the kernel applies the new user timeout only when the
// retransmission timer next fires, which after a few backoffs is up to
// 30 s away, and then ends them without another try, as the timeout is
// long past. closeStalled only does it sooner. (A backed-off socket sends
// nothing meanwhile, keepalive probes included, so a peer that came back
// could not tell it so anyway.)
func (p *pool) closeStalled(u *upstream, done chan struct{}) {
	if !p.waitFor(stalledAfter, done) {
		return
	}
	p.mu.Lock()
	if u.sweepDone != done {
		p.mu.Unlock()
		return
	}
	u.sweepDone = nil
	conns := make([]*proxyConn, 0, len(u.conns))
	for pc := range u.conns {
		conns = append(conns, pc)
	}
	p.mu.Unlock()
	closed := 0
	for _, pc := range conns {
		if stalledFor(pc.upstream) >= sweepSettings.userTimeout && !pc.dead.Swap(true) {
			p.m.deadConnsClosed.Inc() // before the client can see the close
			pc.close()
			closed++
		}
	}
	if closed > 0 {
		u.log.Info("closed connections whose data the suspect upstream stopped acknowledging", "connections", closed)
	}
}

func (p *pool) endSweepLocked(u *upstream) {
	if u.sweepDone != nil {
		close(u.sweepDone)
		u.sweepDone = nil
	}
}

// connected records a successful client dial to u and attaches pc to it. It
// fails when u started draining or left the pool while pc was being dialed.
func (p *pool) connected(u *upstream, pc *proxyConn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if u.draining || u.removed {
		return false
	}
	if p.applyLocked(u, nil) {
		p.publishLocked()
	}
	u.conns[pc] = struct{}{}
	u.connGauge.Inc()
	// Its connections were closed while it is unready and another is
	// ready. A new one (a last-resort dial) gets the same treatment, armed
	// at the next state change or check, so it is usable meanwhile rather
	// than closed the moment the proxy chose it.
	u.evicted = false
	return true
}

// closeConns force-closes every attached connection, for shutdown.
func (p *pool) closeConns() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, u := range p.upstreams {
		for pc := range u.conns {
			pc.close()
		}
	}
}

// detach forgets pc; the last connection of a draining upstream ends its drain.
func (p *pool) detach(u *upstream, pc *proxyConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := u.conns[pc]; ok {
		delete(u.conns, pc)
		u.connGauge.Dec()
	}
	if u.draining && !u.removed && len(u.conns) == 0 {
		u.log.Info("upstream drained")
		p.removeLocked(u)
		p.publishLocked()
	}
}

// publishLocked rebuilds the snapshot and the pool gauges.
func (p *pool) publishLocked() {
	s := &snapshot{}
	all := make([]*upstream, 0, len(p.upstreams))
	var candidates []*upstream
	for _, u := range p.upstreams {
		all = append(all, u)
		if u.draining {
			continue
		}
		s.fallback = append(s.fallback, u)
		if u.healthy {
			candidates = append(candidates, u)
		}
	}
	byAddr := func(a, b *upstream) int { return cmp.Compare(a.addr, b.addr) }
	slices.SortFunc(all, byAddr)
	slices.SortFunc(candidates, byAddr)
	slices.SortFunc(s.fallback, func(a, b *upstream) int {
		if c := b.lastHealthy.Compare(a.lastHealthy); c != 0 {
			return c
		}
		return byAddr(a, b)
	})
	s.healthy = len(candidates)
	if p.cfg.readyz {
		// Ready upstreams only while any is ready; with none ready, every
		// TCP-healthy one, so losing quorum everywhere degrades to tcp.
		ready := slices.DeleteFunc(slices.Clone(candidates), func(u *upstream) bool { return !u.ready })
		p.updateEvictionsLocked(all, len(ready))
		// A ready upstream whose connect failed since its last probe
		// is used only while no other ready one is left: it still beats
		// an unready one.
		if settled := slices.DeleteFunc(slices.Clone(ready), func(u *upstream) bool { return u.reprobe }); len(settled) > 0 {
			candidates = settled
		} else if len(ready) > 0 {
			candidates = ready
		}
	}
	s.groups = p.sel.order(all, candidates)
	s.hedgeDelay = hedgeDelay(s.groups)
	p.snap.Store(s)
	p.m.upstreamsActive.Set(float64(s.healthy))
	p.m.upstreamsTotal.Set(float64(len(p.upstreams)))
}

// updateEvictionsLocked starts, calls off or keeps the eviction of each
// upstream's connections: an upstream that failed its probes while another
// healthy upstream is ready loses its connections after drainTimeout, so
// long-lived clients (kubelet watches) move to a ready one. ready counts the
// healthy, non-draining, ready upstreams.
func (p *pool) updateEvictionsLocked(all []*upstream, ready int) {
	for _, u := range all {
		want := !u.draining && !u.ready && !u.readyPending && ready > 0
		switch {
		case !want:
			p.cancelEvictionLocked(u)
			u.evicted = false
		case u.evictDone != nil || u.evicted:
			// pending or done
		case p.cfg.drainTimeout == 0:
			p.evictLocked(u)
		default:
			u.evictDone = make(chan struct{})
			u.log.Info("upstream not ready while another is: closing its connections after the drain timeout",
				"connections", len(u.conns), "timeout", p.cfg.drainTimeout)
			done := u.evictDone
			p.wg.Go(func() { p.evictWait(u, done) })
		}
	}
}

func (p *pool) cancelEvictionLocked(u *upstream) {
	if u.evictDone != nil {
		close(u.evictDone)
		u.evictDone = nil
		u.log.Info("closing of connections called off")
	}
}

// evictWait closes u's connections when the drain timeout expires, unless
// the eviction was called off first.
func (p *pool) evictWait(u *upstream, done chan struct{}) {
	if !p.waitFor(p.cfg.drainTimeout, done) {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if u.evictDone == done {
		u.evictDone = nil
		p.evictLocked(u)
	}
}

func (p *pool) evictLocked(u *upstream) {
	u.evicted = true
	u.log.Info("closing connections of unready upstream", "connections", len(u.conns))
	for pc := range u.conns {
		pc.close()
	}
}

// pick returns a pickable upstream that is not in tried, or nil: a random
// one of the most preferred group that has an untried member.
func (p *pool) pick(tried []*upstream) *upstream {
	return pickFrom(p.snap.Load().groups, tried)
}

// lastResort returns the most recently healthy non-draining upstream that is
// not in tried, for use when nothing is pickable.
func (p *pool) lastResort(tried []*upstream) *upstream {
	for _, u := range p.snap.Load().fallback {
		if !slices.Contains(tried, u) {
			return u
		}
	}
	return nil
}

// ready reports whether at least one upstream is healthy and not draining.
func (p *pool) ready() bool {
	return p.snap.Load().healthy > 0
}

// responsive reports whether the pool's lock can be taken; the liveness
// heartbeat calls it so a deadlocked pool stops the heartbeat.
func (p *pool) responsive() {
	p.mu.Lock()
	p.mu.Unlock() //nolint:staticcheck // an empty critical section is the point
}

// upstreamStatus is what /upstreams shows of one upstream.
type upstreamStatus struct {
	Address       string     `json:"address"`
	Sources       []string   `json:"sources"`
	Healthy       bool       `json:"healthy"`
	FailStreak    int        `json:"fail_streak"`
	Ready         *bool      `json:"ready,omitempty"` // readyz mode, after the first probe
	ReadyPending  bool       `json:"ready_pending,omitempty"`
	AwaitingProbe bool       `json:"awaiting_probe,omitempty"` // ready, but avoided after a failed connect (upstream.reprobe)
	RTTSeconds    *float64   `json:"rtt_seconds,omitempty"`
	Tier          *int       `json:"tier,omitempty"` // latency mode
	Connections   int        `json:"connections"`
	Draining      bool       `json:"draining"`
	DrainDeadline *time.Time `json:"drain_deadline,omitempty"`
	LastCheck     *time.Time `json:"last_check,omitempty"`
	LastError     string     `json:"last_error,omitempty"`
	LastErrorAt   *time.Time `json:"last_error_at,omitempty"`
}

// describe returns the state of every upstream, ordered by address; sources
// maps addresses to the discovery providers that list them.
func (p *pool) describe(sources map[string][]string) []upstreamStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]upstreamStatus, 0, len(p.upstreams))
	for _, u := range p.upstreams {
		out = append(out, p.statusLocked(u, sources[u.addr]))
	}
	slices.SortFunc(out, func(a, b upstreamStatus) int { return cmp.Compare(a.Address, b.Address) })
	return out
}

func (p *pool) statusLocked(u *upstream, sources []string) upstreamStatus {
	st := upstreamStatus{
		Address: u.addr, Sources: sources, Healthy: u.healthy, FailStreak: u.failStreak,
		Connections: len(u.conns), Draining: u.draining,
	}
	if st.Sources == nil {
		st.Sources = []string{} // draining: no provider lists it any more
	}
	if p.cfg.readyz && u.readyKnown {
		ready := u.ready
		st.Ready, st.ReadyPending, st.AwaitingProbe = &ready, u.readyPending, u.ready && u.reprobe
	}
	if u.hasRTT {
		rtt := u.rtt.Seconds()
		st.RTTSeconds = &rtt
	}
	if u.hasTier {
		tier := u.tier
		st.Tier = &tier
	}
	st.DrainDeadline = timePtr(u.draining && u.drainDone != nil, u.drainDeadline)
	st.LastCheck = timePtr(!u.lastCheck.IsZero(), u.lastCheck)
	if u.lastErr != nil {
		st.LastError = displayText(u.lastErr.Error())
		st.LastErrorAt = timePtr(true, u.lastErrAt)
	}
	return st
}

func timePtr(set bool, t time.Time) *time.Time {
	if !set {
		return nil
	}
	t = t.UTC()
	return &t
}

// maxErrorText bounds the error text /upstreams shows for an upstream.
const maxErrorText = 512

// displayText returns s fit for /upstreams and the status table, which
// prints it on a terminal: cut to maxErrorText bytes, and every character
// that is not printable, such as a newline or a terminal's escape, replaced
// by U+FFFD. An error's text can carry what a peer chose, such as the names
// in its certificate.
func displayText(s string) string {
	cut := cutText(s, maxErrorText)
	out := strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return utf8.RuneError
	}, cut)
	if len(cut) < len(s) {
		out += "..."
	}
	return out
}
