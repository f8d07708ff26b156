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
// checks of the others.
func (p *pool) probeLoop(ctx context.Context, u *upstream) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := p.checkOnce(ctx, u)
		if ctx.Err() != nil {
			return // stopped mid-check: the result says nothing about u
		}
		if err != nil && isLocalExhaustion(err) {
			// Out of descriptors here: blaming u would mark every
			// upstream dead at once. Try again next interval.
			u.log.Warn("health check skipped: local resources exhausted", "err", err)
		} else {
			p.report(u, err)
		}
		t.Reset(p.cfg.interval)
	}
}

// checkOnce runs one check under its own deadline.
func (p *pool) checkOnce(ctx context.Context, u *upstream) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.timeout)
	defer cancel()
	_, err := p.check(ctx, u.addr)
	return err
}
