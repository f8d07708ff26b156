package main

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// failThreshold is the number of consecutive failed checks or dials that
// exclude an upstream; one success re-includes it.
const failThreshold = 2

// upstream is one API server endpoint known to the pool. addr, log and errs
// never change; every other field is guarded by pool.mu.
type upstream struct {
	addr string
	log  *slog.Logger
	// errs is connection_errors_total{upstream=addr}. Once the upstream is
	// removed its series is deleted from the vector, so late increments land
	// on a detached counter and are not exported, as the spec requires.
	errs prometheus.Counter

	healthy     bool
	failStreak  int
	lastHealthy time.Time // last successful check or dial; orders last-resort dials
	lastErr     error     // last failed check or dial

	draining   bool
	drainDone  chan struct{} // closed when the current drain ends early (aborted or emptied)
	removed    bool
	conns      map[*proxyConn]struct{}
	stopProbes context.CancelFunc
}

// snapshot is an immutable view of the pool that the accept path reads
// without locking. The pool publishes a new one on every state change.
type snapshot struct {
	pickable []*upstream // healthy and not draining, ordered by address
	fallback []*upstream // not draining, most recently healthy first (last resort)
}

// poolConfig holds the timing the pool applies to every upstream.
type poolConfig struct {
	interval     time.Duration // between health checks
	timeout      time.Duration // per health check
	drainTimeout time.Duration // grace period for connections of a removed upstream
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

	ctx    context.Context // parent of the probe and drain goroutines
	cancel context.CancelFunc
	wg     sync.WaitGroup // probe and drain goroutines

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

// close stops every probe and drain goroutine and waits for them. It does not
// close proxied connections; the proxy does that on shutdown.
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
		addr:    addr,
		log:     p.log.With("upstream", addr),
		errs:    p.m.connectionErrors.WithLabelValues(addr),
		healthy: true, // a new upstream takes picks before its first check
		conns:   make(map[*proxyConn]struct{}),
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
	u.log.Info("upstream draining", "connections", len(u.conns), "timeout", p.cfg.drainTimeout)
	done := u.drainDone
	p.wg.Go(func() { p.drainWait(u, done) })
}

// drainWait force-closes what is left of u's connections when the drain
// timeout expires, unless the drain ended first.
func (p *pool) drainWait(u *upstream, done chan struct{}) {
	t := time.NewTimer(p.cfg.drainTimeout)
	defer t.Stop()
	select {
	case <-done:
		return
	case <-p.ctx.Done():
		return
	case <-t.C:
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
	}
}

// removeLocked takes u out of the pool, closes its remaining connections and
// deletes its metric series.
func (p *pool) removeLocked(u *upstream) {
	p.endDrainLocked(u)
	u.removed = true
	delete(p.upstreams, u.addr)
	for pc := range u.conns {
		pc.close()
	}
	clear(u.conns)
	p.m.forgetUpstream(u.addr)
}

// report applies one health-check or client-dial result to u's state machine.
func (p *pool) report(u *upstream, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reportLocked(u, err)
}

func (p *pool) reportLocked(u *upstream, err error) {
	if u.removed || u.draining {
		return // checks stop while draining; the state holds until removal
	}
	changed := false
	if err == nil {
		u.failStreak = 0
		u.lastHealthy = time.Now()
		u.lastErr = nil
		if !u.healthy {
			u.healthy = true
			changed = true
			u.log.Info("upstream healthy")
		}
	} else {
		u.failStreak++
		u.lastErr = err
		if u.healthy && u.failStreak >= failThreshold {
			u.healthy = false
			changed = true
			u.log.Warn("upstream unhealthy", "err", err, "consecutive_failures", u.failStreak)
		}
	}
	if changed {
		p.m.healthStatus.WithLabelValues(u.addr).Set(boolGauge(u.healthy))
		p.publishLocked()
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
	p.reportLocked(u, nil)
	u.conns[pc] = struct{}{}
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
	delete(u.conns, pc)
	if u.draining && !u.removed && len(u.conns) == 0 {
		u.log.Info("upstream drained")
		p.removeLocked(u)
		p.publishLocked()
	}
}

// publishLocked rebuilds the snapshot and the pool gauges.
func (p *pool) publishLocked() {
	s := &snapshot{}
	for _, u := range p.upstreams {
		if u.draining {
			continue
		}
		s.fallback = append(s.fallback, u)
		if u.healthy {
			s.pickable = append(s.pickable, u)
		}
	}
	slices.SortFunc(s.pickable, func(a, b *upstream) int { return cmp.Compare(a.addr, b.addr) })
	slices.SortFunc(s.fallback, func(a, b *upstream) int {
		if c := b.lastHealthy.Compare(a.lastHealthy); c != 0 {
			return c
		}
		return cmp.Compare(a.addr, b.addr)
	})
	p.snap.Store(s)
	p.m.upstreamsActive.Set(float64(len(s.pickable)))
	p.m.upstreamsTotal.Set(float64(len(p.upstreams)))
}

// pick returns a pickable upstream that is not in tried, or nil.
func (p *pool) pick(tried []*upstream) *upstream {
	return p.sel.pick(p.snap.Load(), tried)
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
	return len(p.snap.Load().pickable) > 0
}

// responsive reports whether the pool's lock can be taken; the liveness
// heartbeat calls it so a deadlocked pool stops the heartbeat.
func (p *pool) responsive() {
	p.mu.Lock()
	p.mu.Unlock() //nolint:staticcheck // an empty critical section is the point
}
