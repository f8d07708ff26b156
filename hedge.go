package main

// Beyond the spec: how a client connection finds an upstream. The spec
// retries a dial once when its upstream starts draining; extractedprism
// also retries a failed dial on another upstream, falls back to upstreams
// that are not pickable before it gives up on a client, and hedges: a dial
// slower than the hedge delay gets a second one to another upstream, and
// the first to connect wins, so one black-holed upstream costs a client
// tens of milliseconds rather than the dial timeout.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"syscall"
	"time"
)

// hedgeDelay derives the hedge delay from the connect times of the
// preferred group.
func hedgeDelay(groups [][]*upstream) time.Duration {
	var slowest time.Duration
	for _, g := range groups[:min(len(groups), 1)] { // the preferred group
		for _, u := range g {
			slowest = max(slowest, u.rtt) // 0 without a sample
		}
	}
	if slowest == 0 {
		return hedgeMax
	}
	return min(max(hedgeFactor*slowest, hedgeMin), hedgeMax)
}

// attempt is one dial of a client connection to one upstream.
type attempt struct {
	u          *upstream
	lastResort bool // u was not pickable when the dial started
	hedged     bool // started because an earlier dial was slow
	conn       net.Conn
	err        error
	took       time.Duration // until it connected, failed or was called off
}

// connDial is the dialling of one client connection; only the goroutine
// running connect touches it. Its dials run on goroutines of their own
// (dialAttempt), which report on results; connect waits for every one.
type connDial struct {
	p            *proxy
	ctx          context.Context //nolint:containedctx // shared by the dials of one connection: cancelled once one won, or on shutdown
	cancel       context.CancelFunc
	results      chan attempt
	tried        []*upstream
	inflight     int
	drainRetried bool
	stop         bool          // no further dials: out of descriptors, or the drain retry used
	hedgeDelay   time.Duration // of the hedge timer last armed
	lastErr      error
}

// connect dials upstreams for pc until one answers: the pickable ones in the
// selector's order, each at most once, then as a last resort the
// non-draining ones that are not pickable, most recently healthy first.
// When a dial has not completed after the hedge delay, a second one starts
// to the next pickable upstream. On success pc.upstream is set and pc is
// attached to the upstream returned.
func (p *proxy) connect(ctx context.Context, pc *proxyConn) (*upstream, error) {
	ctx, cancel := context.WithCancel(ctx)
	cd := &connDial{p: p, ctx: ctx, cancel: cancel, results: make(chan attempt), lastErr: errNoUpstream}
	defer cd.wait()
	if !cd.start(false) {
		return nil, cd.lastErr
	}
	cd.hedgeDelay = p.pool.snap.Load().hedgeDelay
	hedge := time.NewTimer(cd.hedgeDelay)
	for cd.inflight > 0 {
		select {
		case a := <-cd.results:
			cd.inflight--
			if cd.finish(a, pc) {
				return a.u, nil
			}
			// The dial still in flight, or the next one, gets a hedge of
			// its own: one hanging dial must not hold the client for the
			// dial timeout while other upstreams are there.
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

// start begins a dial to the next upstream and reports whether it did.
// Hedged dials go only to pickable upstreams.
func (cd *connDial) start(hedged bool) bool {
	if cd.stop || cd.ctx.Err() != nil {
		return false
	}
	a := attempt{u: cd.p.pool.pick(cd.tried), hedged: hedged}
	if a.u == nil && !hedged {
		a.u, a.lastResort = cd.p.pool.lastResort(cd.tried), true
	}
	if a.u == nil {
		return false
	}
	cd.tried = append(cd.tried, a.u)
	cd.inflight++
	go cd.p.dialAttempt(cd.ctx, a, cd.results)
	return true
}

// finish handles one finished dial and reports whether it won. A failed
// dial cancelled by shutdown says nothing about its upstream; nor does one
// that failed because this process is out of descriptors, which ends the
// dialling.
func (cd *connDial) finish(a attempt, pc *proxyConn) bool {
	switch {
	case cd.ctx.Err() != nil: // shutdown
		if a.err == nil {
			_ = a.conn.Close()
		}
		return false
	case isLocalExhaustion(a.err):
		cd.lastErr, cd.stop = a.err, true
		return false
	case a.err != nil:
		cd.lastErr = a.err
		cd.blame(a)
		return false
	}
	pc.upstream = a.conn
	if cd.p.pool.connected(a.u, pc) {
		if a.hedged {
			cd.p.m.hedgedWins.Inc()
		}
		cd.cancel() // the other dial, if any, lost
		return true
	}
	// a.u started draining while it was dialled: one retry elsewhere.
	_ = a.conn.Close()
	pc.upstream = nil
	cd.lastErr, cd.stop, cd.drainRetried = errDraining, cd.drainRetried, true
	return false
}

// blame counts the failed dial a against its upstream. A last-resort dial
// counts in connection_errors_total only while some upstream is available,
// as the spec has it: with readyz, an unready but healthy upstream dialled
// after every ready one failed.
func (cd *connDial) blame(a attempt) {
	cd.p.pool.reportDial(a.u, a.err)
	if !a.lastResort || cd.p.pool.ready() {
		a.u.errs.Inc()
	}
	a.u.log.Debug("dial failed", "err", a.err, "last_resort", a.lastResort, "hedged", a.hedged)
}

// wait cancels the dials still in flight, which happens only once one won,
// and waits for them, closing any that connected too.
func (cd *connDial) wait() {
	cd.cancel()
	for ; cd.inflight > 0; cd.inflight-- {
		a := <-cd.results
		switch {
		case a.err == nil:
			_ = a.conn.Close()
		case isLocalExhaustion(a.err): // never reached its upstream
		case !errors.Is(a.err, context.Canceled):
			cd.blame(a) // it failed on its own just after another won
		case a.took >= cd.hedgeDelay:
			// Called off after the hedge delay: not a failure, but the
			// upstream may have vanished, and a check now starts the sweep
			// of its connections if so, while it is included. Whether this
			// dial was the hedge or the one hedged does not tell which was
			// slow: a first dial may win just after its hedge started.
			cd.p.pool.confirmSlow(a.u)
		}
	}
}

// dialAttempt runs one dial within the dial timeout and reports it on
// results, which connect reads until every dial it started has reported.
func (p *proxy) dialAttempt(ctx context.Context, a attempt, results chan<- attempt) {
	start := time.Now()
	dctx, cancel := context.WithTimeout(ctx, p.dialTimeout)
	defer cancel()
	a.conn, a.err = p.dial(dctx, "tcp", a.u.addr)
	a.took = time.Since(start)
	if a.err != nil {
		a.err = fmt.Errorf("dial upstream %s: %w", a.u.addr, a.err)
	} else {
		a.u.dialSeconds.Observe(a.took.Seconds())
	}
	results <- a
}

// isLocalExhaustion reports errors caused by this process or host running
// out of descriptors, buffers or memory; they say nothing about the
// upstream. EADDRNOTAVAIL is not one of them: a node with no source address
// or route for the upstream (an IPv6 upstream with IPv6 off) fails every
// dial to it for good, and a node out of ephemeral ports to one upstream
// cannot use that upstream either, so both count against it and new
// connections go elsewhere; checks leave no TIME_WAIT to use ports up.
func isLocalExhaustion(err error) bool {
	return slices.ContainsFunc([]error{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM},
		func(e error) bool { return errors.Is(err, e) })
}

// confirmSlow asks for a check of u now, after a dial to it was called off
// slow, while u is included.
func (p *pool) confirmSlow(u *upstream) {
	p.mu.Lock()
	defer p.unlock()
	p.confirmLocked(u)
}
