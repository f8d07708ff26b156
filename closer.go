package main

// One closer runs what the daemon does to connections over time: the
// spread closing of a drain or an eviction (spread.go), the rebalancer's
// close at a quiet moment (rebalance.go), the idle timeout (idle.go), the
// graceful stop (listeners.go), and an upstream's timed actions (pool.arm:
// the end of a drain, the start of an eviction, the sweep's look at
// stalled connections). Each is a job: the connections it may close, a
// pure rule saying of each whether its close is due or when to look again,
// its reason, a deadline and how many it may close. One goroutine runs
// every job on one timer, and a look reads each connection's TCP_INFO at
// most once whatever the jobs. Closes that follow at once from an event
// stay with the event: shutdown, the end of a drain, the idle close at the
// bound.

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"
)

// closeJob is one job of the closer. The closer alone writes n and next.
type closeJob struct {
	reason connEnd
	// conns returns the connections the job may close, in the order to
	// close them; due says whether pc's close is due at now, or when to
	// look at it again (zero: not before something else wakes the job).
	// look reads a connection's sockets, once a look.
	conns func(look func(*proxyConn) connLook) []*proxyConn
	due   func(pc *proxyConn, now time.Time, look func() connLook) (bool, time.Time)
	// The job ends at deadline, after limit closes, once over reports
	// true (each if set), or, without every, when conns has nothing left
	// to close. every, if set, bounds the wait between two looks: for
	// connections conns gains, and for over, as nothing tells of either;
	// a job without it looks only when one of its connections is due, so
	// with none left it would wait for nothing. When the closer stops
	// (shutdown), what is left of a job's connections stays:
	// pool.closeConns closes every connection then.
	deadline time.Time
	limit    int
	over     func() bool
	every    time.Duration
	// closed, if set, is told of each close, for its log line. end, if
	// set, runs when the job ends, unless the closer stops first. A job
	// without conns closes nothing: it is a timed action (pool.arm).
	closed func(pc *proxyConn, look func() connLook)
	end    func()

	n    int           // closed so far
	next time.Time     // when it looks next
	done chan struct{} // closed when the job ends
}

// closer owns the jobs: add, look and stop share them under mu.
type closer struct {
	mu      sync.Mutex
	jobs    []*closeJob
	stopped bool
	wake    chan struct{} // a job was added
	// start starts run, once (a sync.OnceFunc), with the first job: a
	// pool that never closes a connection over time runs no goroutine for
	// it.
	start func()
}

// add starts j and returns it; j.done is closed when it ends, at once on a
// stopped closer.
func (c *closer) add(j *closeJob) *closeJob {
	j.done = make(chan struct{})
	c.start()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		close(j.done)
		return j
	}
	c.jobs = append(c.jobs, j)
	select {
	case c.wake <- struct{}{}:
	default: // a wake-up is pending already
	}
	return j
}

// run is the closer's goroutine, owned by the pool: its WaitGroup counts
// it, and ctx's end (the pool's close, or shutdown) stops it and every job.
// Jobs are run without mu held: their rules take the pool's lock, which
// add is called under.
func (c *closer) run(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			c.mu.Lock()
			for _, j := range c.jobs {
				close(j.done)
			}
			c.jobs, c.stopped = nil, true
			c.mu.Unlock()
			return
		case <-c.wake:
		case <-t.C:
		}
		t.Reset(time.Until(c.look(time.Now())))
	}
}

// look runs the jobs whose time has come and returns when to look next.
func (c *closer) look(now time.Time) time.Time {
	c.mu.Lock()
	jobs := slices.Clone(c.jobs)
	c.mu.Unlock()
	next := now.Add(time.Hour)
	looks := map[*proxyConn]connLook{}
	for _, j := range jobs {
		if !j.next.After(now) && j.run(now, looks) {
			c.mu.Lock()
			c.jobs = slices.DeleteFunc(c.jobs, func(o *closeJob) bool { return o == j })
			c.mu.Unlock()
			close(j.done)
			if j.end != nil {
				j.end()
			}
			continue
		}
		next = earliest(next, j.next)
	}
	return next
}

// run closes what is due of j's connections at now and reports whether j
// has ended; otherwise it sets when j looks next. A connection whose end
// is claimed already (see connlog.go) is left alone.
func (j *closeJob) run(now time.Time, looks map[*proxyConn]connLook) bool {
	if !j.deadline.IsZero() && !now.Before(j.deadline) || j.over != nil && j.over() {
		return true
	}
	j.next = earliest(j.deadline, now.Add(cmp.Or(j.every, time.Hour)))
	lookOf := func(pc *proxyConn) connLook {
		if _, ok := looks[pc]; !ok {
			looks[pc] = lookAt(pc)
		}
		return looks[pc]
	}
	if j.conns == nil {
		return false
	}
	left := 0
	for _, pc := range j.conns(lookOf) {
		if connEnd(pc.ended.Load()) != connEndNone {
			continue
		}
		look := func() connLook { return lookOf(pc) }
		if due, at := j.due(pc, now, look); !due {
			left, j.next = left+1, earliest(j.next, at)
			continue
		}
		pc.closeFor(j.reason)
		if j.n++; j.closed != nil {
			j.closed(pc, look)
		}
		if j.n == j.limit {
			return true
		}
	}
	return j.every == 0 && left == 0
}

// earliest returns the earlier of a and b, ignoring a zero one.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || !b.IsZero() && b.Before(a) {
		return b
	}
	return a
}

// connLook is what one look at a connection found (see lookAt): of its
// client socket, how long it has carried no data (quiet), how long since it
// was answered (see infoAnswered) and whether its client ever spoke; of
// both sockets, whether bytes are unacknowledged. ok: TCP_INFO was read.
type connLook struct {
	quiet, answered   time.Duration
	spoke, queued, ok bool
}

// answeredDue is the rule of a close that waits until pc's client has been
// answered for quiet. Nothing tells when an answer goes out, so a
// connection with a request in flight is looked at again a quarter of
// quiet later.
func answeredDue(quiet time.Duration, now time.Time, look func() connLook) (bool, time.Time) {
	switch l := look(); {
	case l.answered >= quiet:
		return true, time.Time{}
	case l.answered > 0:
		return false, now.Add(quiet - l.answered)
	}
	return false, now.Add(quiet / 4)
}
