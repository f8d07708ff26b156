package main

import (
	"context"
	"fmt"
	"net"
	"time"
)

// checkFunc runs one health check of addr within ctx's deadline and returns
// the connect time of a successful check.
type checkFunc func(ctx context.Context, addr string) (time.Duration, error)

// tcpCheck connects to addr and closes the connection at once. The connect
// time includes name resolution for hostname endpoints.
func tcpCheck(ctx context.Context, addr string) (time.Duration, error) {
	var d net.Dialer
	start := time.Now()
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, fmt.Errorf("health check %s: %w", addr, err)
	}
	rtt := time.Since(start)
	closeAbortive(c)
	return rtt, nil
}

// closeAbortive closes c with a reset instead of a FIN. A probe that closes
// normally leaves a TIME_WAIT socket behind for every check; one check every
// few seconds from every node adds up on the API servers.
func closeAbortive(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0) // best effort: a plain close is still correct
	}
	_ = c.Close()
}

// probeLoop checks u at once and then every interval until ctx is done. Each
// upstream has its own loop, so a black-holed upstream never delays the
// checks of the others. After a failed check the next one comes after
// quickRecheck, and a failed client dial asks for one at once.
func (p *pool) probeLoop(ctx context.Context, u *upstream) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-u.recheck:
		}
		rtt, err := p.checkOnce(ctx, u)
		if ctx.Err() != nil {
			return // stopped mid-check: the result says nothing about u
		}
		next := p.cfg.interval
		if err != nil && isLocalExhaustion(err) {
			// Out of descriptors here: blaming u would mark every
			// upstream dead at once. Try again next interval.
			u.log.Warn("health check skipped: local resources exhausted", "err", err)
		} else if p.reportCheck(u, rtt, err) && p.cfg.quickRecheck > 0 {
			next = min(p.cfg.quickRecheck, next)
		}
		t.Reset(next)
	}
}

// checkOnce runs one check under its own deadline.
func (p *pool) checkOnce(ctx context.Context, u *upstream) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.timeout)
	defer cancel()
	return p.check(ctx, u.addr)
}
