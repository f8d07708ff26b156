package main

// Micro-benchmarks of the per-connection hot paths:
//
//	go test -run '^$' -bench 'Pick|Connect|Metrics|Loopback' -benchmem
//
// (-bench . also runs BenchmarkBlackHole, which takes over a minute.)
// Picking an upstream and the metric updates must not allocate; the
// loopback benchmark shows what one proxied connection costs on top of a
// direct one (the client's and the upstream's allocations included, as
// testing counts every goroutine of the process). bench/ measures the
// daemon against HAProxy and nginx.

import (
	"context"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// benchAddrs are addresses only: the benchmark pools' checks never dial.
var benchAddrs = []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"}

// benchPool returns a pool of the three benchAddrs whose checks return
// check's result without any I/O, once at start-up and then hourly.
func benchPool(b *testing.B, check checkFunc, sel func(*metrics) selector) *pool {
	b.Helper()
	m := newMetrics(prometheus.NewRegistry())
	cfg := poolConfig{interval: time.Hour, timeout: time.Second, drainTimeout: time.Second}
	p := newPool(slog.New(slog.DiscardHandler), m, cfg, check, sel(m))
	p.update(benchAddrs)
	b.Cleanup(p.close)
	return p
}

func noCheck(context.Context, string) checkResult { return checkResult{} }

func randomSel(*metrics) selector { return randomSelector{} }

// latencyPool is a latency-mode pool with two tiers: 127.0.0.1:1 and :2
// near (1 ms, 1.5 ms), :3 far (10 ms).
func latencyPool(b *testing.B) *pool {
	b.Helper()
	rtts := map[string]time.Duration{
		benchAddrs[0]: time.Millisecond,
		benchAddrs[1]: 1500 * time.Microsecond,
		benchAddrs[2]: 10 * time.Millisecond,
	}
	check := func(_ context.Context, addr string) checkResult { return checkResult{rtt: rtts[addr]} }
	p := benchPool(b, check, func(m *metrics) selector { return newLatencySelector(m) })
	// The first checks run at once in the probe goroutines; wait for them.
	deadline := time.Now().Add(5 * time.Second)
	for {
		g := p.snap.Load().groups
		if len(g) == 2 && len(g[0]) == 2 && len(g[1]) == 1 {
			return p
		}
		if time.Now().After(deadline) {
			b.Fatalf("latency tiers not built: got %d groups; want 2", len(g))
		}
		time.Sleep(time.Millisecond)
	}
}

func BenchmarkPick(b *testing.B) {
	for _, bc := range []struct {
		name string
		pool func(*testing.B) *pool
	}{
		{"random", func(b *testing.B) *pool { b.Helper(); return benchPool(b, noCheck, randomSel) }},
		{"latency", latencyPool},
	} {
		b.Run(bc.name, func(b *testing.B) {
			p := bc.pool(b)
			b.ReportAllocs()
			for b.Loop() {
				if p.pick(nil) == nil {
					b.Fatal("nothing picked")
				}
			}
		})
		b.Run(bc.name+"/retry", func(b *testing.B) {
			p := bc.pool(b)
			tried := []*upstream{p.pick(nil)}
			b.ReportAllocs()
			for b.Loop() {
				if u := p.pick(tried); u == nil || u == tried[0] {
					b.Fatal("retry picked nothing or the tried upstream")
				}
			}
		})
	}
}

// newPipeConn returns a proxyConn over in-memory pipes, closed when b ends.
func newPipeConn(b *testing.B) *proxyConn {
	b.Helper()
	c1, c2 := net.Pipe()
	u1, u2 := net.Pipe()
	b.Cleanup(func() {
		for _, c := range []net.Conn{c1, c2, u1, u2} {
			_ = c.Close()
		}
	})
	return &proxyConn{client: c1, upstream: u1}
}

// BenchmarkConnectedDetach is the pool bookkeeping of one connection:
// attach after the dial, detach when it ends.
func BenchmarkConnectedDetach(b *testing.B) {
	b.Run("serial", func(b *testing.B) {
		p := benchPool(b, noCheck, randomSel)
		u := p.pick(nil)
		pc := newPipeConn(b)
		b.ReportAllocs()
		for b.Loop() {
			if !p.connected(u, pc) {
				b.Fatal("connected refused")
			}
			p.detach(u, pc)
		}
	})
	// Parallel: every connection goroutine contends for pool.mu.
	b.Run("parallel", func(b *testing.B) {
		p := benchPool(b, noCheck, randomSel)
		var mu sync.Mutex
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			mu.Lock()
			pc := newPipeConn(b)
			mu.Unlock()
			for pb.Next() {
				u := p.pick(nil)
				if !p.connected(u, pc) {
					b.Error("connected refused")
					return
				}
				p.detach(u, pc)
			}
		})
	})
	// Many open connections: the map holds 10,000 others.
	b.Run("10k-open", func(b *testing.B) {
		p := benchPool(b, noCheck, randomSel)
		u := p.pick(nil)
		for range 10000 {
			p.connected(u, &proxyConn{})
		}
		pc := newPipeConn(b)
		b.ReportAllocs()
		for b.Loop() {
			p.connected(u, pc)
			p.detach(u, pc)
		}
	})
}

// BenchmarkMetricsPerConnection is what handle and a failed dial update.
func BenchmarkMetricsPerConnection(b *testing.B) {
	m := newMetrics(prometheus.NewRegistry())
	errs := m.connectionErrors.WithLabelValues(benchAddrs[0])
	update := func() {
		m.connectionsTotal.Inc()
		m.connectionsActive.Inc()
		m.connectionsActive.Dec()
		errs.Inc()
	}
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			update()
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				update()
			}
		})
	})
}

// nopConn is a net.Conn whose Close does nothing; nothing else of it is
// called.
type nopConn struct{ net.Conn }

func (*nopConn) Close() error { return nil }

// BenchmarkConnect is the dial machinery of one client connection (pick,
// dial on a goroutine of its own, hedge timer, attach, detach) with an
// in-memory dial, so no socket cost hides it.
func BenchmarkConnect(b *testing.B) {
	p := benchPool(b, noCheck, randomSel)
	px := newProxy(slog.New(slog.DiscardHandler), p.m, p, time.Second, 16)
	// One reusable upstream conn, so the dial itself allocates nothing.
	up := &nopConn{}
	px.dial = func(context.Context, string, string) (net.Conn, error) { return up, nil }
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		pc := &proxyConn{client: up}
		u, err := px.connect(ctx, pc)
		if err != nil {
			b.Fatal(err)
		}
		p.detach(u, pc)
		_ = pc.upstream.Close()
	}
}

func echoConnOnce(addr string, msg, buf []byte) error {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(msg); err != nil {
		return err
	}
	_, err = io.ReadFull(c, buf)
	return err
}

// BenchmarkLoopbackConnection is one short client connection (dial, 64 B
// echo, close) through the proxy to an echo upstream on 127.0.0.1, and the
// same connection made directly for reference.
func BenchmarkLoopbackConnection(b *testing.B) {
	up := startUpstream(b, echo)
	for _, bc := range []struct {
		name string
		addr func(*testing.B) string
	}{
		{"direct", func(*testing.B) string { return up.addr }},
		{"proxied", func(b *testing.B) string { b.Helper(); return startProxy(b, poolConfig{}, up.addr).addr }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			addr := bc.addr(b)
			msg, buf := make([]byte, 64), make([]byte, 64)
			b.ReportAllocs()
			for b.Loop() {
				if err := echoConnOnce(addr, msg, buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
