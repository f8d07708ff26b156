package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// endCount returns connections_closed_total{upstream=addr, reason=reason}.
func endCount(t *testing.T, px *testProxy, addr, reason string) float64 {
	t.Helper()
	v, _ := seriesValue(t, px.reg, "extractedprism_connections_closed_total", map[string]string{"upstream": addr, "reason": reason})
	return v
}

func byteCount(t *testing.T, px *testProxy, addr, direction string) float64 {
	t.Helper()
	v, _ := seriesValue(t, px.reg, "extractedprism_upstream_bytes_total", map[string]string{"upstream": addr, "direction": direction})
	return v
}

// TestConnectionEndsByReason: a client's close, an upstream's close and an
// upstream's reset are each counted under their reason, with the bytes of
// each direction; every reason's series exists from the upstream's start.
func TestConnectionEndsByReason(t *testing.T) {
	cases := []struct {
		reason     string
		handler    func(net.Conn)
		client     func(c *net.TCPConn)
		sent, down int
	}{
		{"client_closed", echo, func(c *net.TCPConn) { _ = c.CloseWrite(); _, _ = io.Copy(io.Discard, c) }, 1000, 1000},
		{"upstream_closed", func(c net.Conn) { _, _ = c.Write(make([]byte, 300)) }, func(c *net.TCPConn) { _, _ = io.Copy(io.Discard, c); _ = c.Close() }, 0, 300},
		// The upstream resets only after the client's byte: a reset that
		// reached the client before its connect returned failed the dial
		// (CI, under -race).
		{"reset", func(c net.Conn) {
			_, _ = io.ReadFull(c, make([]byte, 1))
			_, _ = c.Write(make([]byte, 300))
			_ = c.(*net.TCPConn).SetLinger(0)
		}, func(c *net.TCPConn) { _, _ = io.Copy(io.Discard, c) }, 1, 300},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			up := startUpstream(t, tc.handler)
			px := startProxy(t, poolConfig{}, up.addr)
			if _, ok := seriesValue(t, px.reg, "extractedprism_connections_closed_total", map[string]string{"upstream": up.addr, "reason": "shutdown"}); !ok {
				t.Fatal("no shutdown series before the first connection")
			}
			c := dialProxy(t, px.addr)
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			if tc.sent > 0 {
				if _, err := c.Write(make([]byte, tc.sent)); err != nil {
					t.Fatal(err)
				}
			}
			tc.client(c)
			waitFor(t, "the end counted as "+tc.reason, func() bool { return endCount(t, px, up.addr, tc.reason) == 1 })
			if got := byteCount(t, px, up.addr, dirToUpstream); got != float64(tc.sent) {
				t.Errorf("to_upstream bytes: got %v; want %d", got, tc.sent)
			}
			if got := byteCount(t, px, up.addr, dirToClient); got != float64(tc.down) {
				t.Errorf("to_client bytes: got %v; want %d", got, tc.down)
			}
		})
	}
}

// TestBytesCountedWhileOpen: a connection that stays open shows its bytes
// a chunk at a time, not only at its end.
func TestBytesCountedWhileOpen(t *testing.T) {
	up := startUpstream(t, echo)
	px := startProxy(t, poolConfig{}, up.addr)
	c := dialProxy(t, px.addr)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	// Written while read back: 4 MiB may not fit the sockets' buffers.
	writeErr := make(chan error, 1)
	go func() { _, err := c.Write(bytes.Repeat([]byte("x"), 4*copyChunk)); writeErr <- err }()
	if _, err := io.CopyN(io.Discard, c, 4*copyChunk); err != nil {
		t.Fatal(err)
	}
	if err := <-writeErr; err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the bytes of an open connection", func() bool {
		return byteCount(t, px, up.addr, dirToUpstream) >= 3*copyChunk && byteCount(t, px, up.addr, dirToClient) >= 3*copyChunk
	})
	if got := endCount(t, px, up.addr, "client_closed"); got != 0 {
		t.Errorf("client_closed while open: got %v; want 0", got)
	}
}

// TestShutdownEndsCounted: connections the daemon closes count under its
// reason, not as the reset or close the copies then meet.
func TestShutdownEndsCounted(t *testing.T) {
	up := startUpstream(t, echo)
	px := startProxy(t, poolConfig{}, up.addr)
	c := dialProxy(t, px.addr)
	if err := roundTrip(c, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	px.pool.closeConns()
	waitFor(t, "the shutdown counted", func() bool { return endCount(t, px, up.addr, "shutdown") == 1 })
	time.Sleep(50 * time.Millisecond) // a second count would come from the handler, now done
	for _, reason := range []string{"client_closed", "upstream_closed", "reset", "error"} {
		if got := endCount(t, px, up.addr, reason); got != 0 {
			t.Errorf("%s: got %v; want 0", reason, got)
		}
	}
}

// TestDrainEndLogged: at debug level each end is one line with the client,
// the upstream, the bytes each way and the reason, here the end of a drain.
func TestDrainEndLogged(t *testing.T) {
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	up := startUpstream(t, echo)
	px := startProxyLog(t, log, poolConfig{interval: time.Hour, timeout: time.Second, drainTimeout: 50 * time.Millisecond}, tcpCheck, nil, up.addr)
	c := dialProxy(t, px.addr)
	if err := roundTrip(c, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	px.pool.update(nil)
	waitFor(t, "the connection-closed line", func() bool { return strings.Contains(logs.String(), "connection closed") })
	line := lineWith(logs.String(), "connection closed")
	for _, want := range []string{"client=" + c.LocalAddr().String(), "upstream=" + up.addr, "to_upstream_bytes=5", "to_client_bytes=5", "end=drain"} {
		if !strings.Contains(line, want) {
			t.Errorf("no %q in %q", want, line)
		}
	}
}

func lineWith(text, substr string) string {
	for line := range strings.Lines(text) {
		if strings.Contains(line, substr) {
			return line
		}
	}
	return ""
}

// TestConnLogRateLimited: past connLogBurst lines in connLogEvery the rest
// are counted, and the first line after says how many were left out.
func TestConnLogRateLimited(t *testing.T) {
	l := &newProxy(slog.New(slog.DiscardHandler), newMetrics(prometheus.NewRegistry()), nil, time.Second, 1).endsLog
	start := time.Unix(1000, 0)
	for i := range connLogBurst {
		if _, ok := l.note(start.Add(time.Duration(i) * time.Millisecond)); !ok {
			t.Fatalf("line %d refused within the burst", i)
		}
	}
	for i := range 7 {
		if _, ok := l.note(start.Add(500*time.Millisecond + time.Duration(i))); ok {
			t.Fatalf("line %d past the burst allowed", connLogBurst+i)
		}
	}
	suppressed, ok := l.note(start.Add(connLogEvery))
	if !ok || suppressed != 7 {
		t.Errorf("first line of the next window: got %d suppressed, allowed %v; want 7, true", suppressed, ok)
	}
}

// TestNoUsableUpstreamLoggedOnce: losing the last usable upstream is one
// error line however many checks fail after, and its return one line.
func TestNoUsableUpstreamLoggedOnce(t *testing.T) {
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	var failing atomic.Bool
	check := func(context.Context, string) checkResult {
		if failing.Load() {
			return checkResult{err: errors.New("connection refused")}
		}
		return checkResult{rtt: time.Millisecond}
	}
	pl := newPool(log, newMetrics(prometheus.NewRegistry()), poolConfig{interval: 5 * time.Millisecond, timeout: time.Second}, check, randomSelector{})
	defer pl.close()
	failing.Store(true)
	pl.update([]string{"192.0.2.1:6443"})
	waitFor(t, "the upstream excluded", func() bool { return !pl.ready() })
	time.Sleep(50 * time.Millisecond) // ten more failed checks
	if n := strings.Count(logs.String(), "no upstream usable"); n != 1 {
		t.Errorf("no-upstream lines: got %d; want 1:\n%s", n, logs.String())
	}
	failing.Store(false)
	waitFor(t, "the upstream back", pl.ready)
	waitFor(t, "the line of its return", func() bool { return strings.Contains(logs.String(), "upstream usable again") })
	if line := lineWith(logs.String(), "no upstream usable"); !strings.Contains(line, "level=ERROR") {
		t.Errorf("not an error line: %q", line)
	}
}
