//go:build linux

package main

import (
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// startLimitedProxy runs a proxy with maxConns slots and the idle policy
// pol in front of an echo upstream.
func startLimitedProxy(t *testing.T, maxConns int, pol idlePolicy) *testProxy {
	t.Helper()
	up := startUpstream(t, echo)
	log, reg := slog.New(slog.DiscardHandler), prometheus.NewRegistry()
	m := newMetrics(reg)
	pl := newPool(log, m, poolConfig{interval: time.Hour, timeout: time.Second}, tcpCheck, randomSelector{})
	px := newProxy(log, m, pl, 2*time.Second, maxConns)
	px.idle = pol
	pl.update([]string{up.addr})
	return &testProxy{proxy: px, addr: serveTestProxy(t, px, pl), reg: reg, m: m}
}

func (px *testProxy) attached() int { return len(px.pool.conns()) }

func (px *testProxy) idleClosed(reason string) float64 {
	return testutil.ToFloat64(px.m.idleConnsClosed.WithLabelValues(reason))
}

// TestSilentConnectionsGiveWayAtTheLimit: with the slots of `ulimit -n 1024`
// taken by 400 connections that never send a byte (the rest in the listen
// backlog), a new client is served within a second, and a client that has
// spoken keeps its connection. Before, the new client waited for ever.
func TestSilentConnectionsGiveWayAtTheLimit(t *testing.T) {
	slots, _ := maxConnections(1024, 0)
	px := startLimitedProxy(t, slots, defaultIdlePolicy())
	kubelet := dialProxy(t, px.addr)
	if err := roundTrip(kubelet, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	const hoarders = 400
	for range hoarders {
		dialProxy(t, px.addr)
	}
	waitFor(t, "every slot taken", func() bool { return px.attached() == slots })
	time.Sleep(newQuietFor + 200*time.Millisecond)

	start := time.Now()
	c := dialProxy(t, px.addr)
	if err := roundTrip(c, []byte("new client")); err != nil {
		t.Fatalf("new client at the limit: %v", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("new client at the limit served after %v; want within 1s", took)
	}
	if err := roundTrip(kubelet, []byte("still here")); err != nil {
		t.Errorf("client that had spoken: %v", err)
	}
	// Each hoarder past the slots and the new client closed one hoarder.
	want := float64(hoarders - (slots - 1) + 1)
	if got := px.idleClosed(reasonLimit); got < want || got > want+5 {
		t.Errorf("idle_connections_closed_total{reason=limit}: got %v; want %v (a few more if a slot came late)", got, want)
	}
	// The clients still in the backlog take the slots the closes freed:
	// every slot is in use again, none lost.
	waitFor(t, "every slot in use again", func() bool { return px.attached() == slots })
}

// TestSpokenConnectionsKeepTheirSlots: at the limit, connections that have
// carried data give way only after spokenQuiet of silence; until then a new
// client waits, and then it is served.
func TestSpokenConnectionsKeepTheirSlots(t *testing.T) {
	pol := idlePolicy{newQuiet: newQuietFor, spokenQuiet: 2 * time.Second, timeout: time.Hour}
	px := startLimitedProxy(t, 2, pol)
	a, b := dialProxy(t, px.addr), dialProxy(t, px.addr)
	for _, c := range []net.Conn{a, b} {
		if err := roundTrip(c, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(100 * time.Millisecond)
	if err := roundTrip(b, []byte("b again")); err != nil { // b is now the less silent
		t.Fatal(err)
	}
	start := time.Now()
	c := dialProxy(t, px.addr)
	if err := roundTrip(c, []byte("new")); err != nil {
		t.Fatalf("new client: %v", err)
	}
	if took := time.Since(start); took < pol.spokenQuiet-200*time.Millisecond || took > pol.spokenQuiet+time.Second {
		t.Errorf("new client served after %v; want about %v, when a had been silent that long", took, pol.spokenQuiet)
	}
	wantPeerClosed(t, a, time.Second, "the connection silent longest")
	if err := roundTrip(b, []byte("b kept")); err != nil {
		t.Errorf("the less silent connection: %v", err)
	}
	if got := px.idleClosed(reasonLimit); got != 1 {
		t.Errorf("idle_connections_closed_total{reason=limit}: got %v; want 1", got)
	}
}

// TestIdleTimeoutClosesSilentConnections: below the limit, a connection
// silent both ways for the idle timeout is closed within 1.1 times it, and
// one that carries data in either direction is kept.
func TestIdleTimeoutClosesSilentConnections(t *testing.T) {
	pol := idlePolicy{newQuiet: time.Hour, spokenQuiet: time.Hour, timeout: 2 * time.Second}
	px := startLimitedProxy(t, 16, pol)
	silent, busy := dialProxy(t, px.addr), dialProxy(t, px.addr)
	if err := roundTrip(silent, []byte("once")); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for time.Since(start) < pol.timeout*11/10 {
		if err := roundTrip(busy, []byte("ping")); err != nil {
			t.Fatalf("busy connection: %v", err)
		}
		time.Sleep(300 * time.Millisecond)
	}
	wantPeerClosed(t, silent, 500*time.Millisecond, "the silent connection")
	if took := time.Since(start); took < pol.timeout {
		t.Errorf("silent connection closed after %v; want at least %v", took, pol.timeout)
	}
	if err := roundTrip(busy, []byte("kept")); err != nil {
		t.Errorf("busy connection: %v", err)
	}
	if got := px.idleClosed(reasonTimeout); got != 1 {
		t.Errorf("idle_connections_closed_total{reason=timeout}: got %v; want 1", got)
	}
}
