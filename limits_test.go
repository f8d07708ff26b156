package main

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestMaxConnections pins the bound's arithmetic with literal figures: 6
// descriptors per connection (TestIdleConnectionsHoldFdsPerConnAndThreeGoroutines
// measures them), 256 reserved, 1472 KiB per connection above a 24 MiB
// reserve (64 KiB idle and, for each direction stalled, 512 KiB of receive
// queue and 192 KiB of send queue), never below 64 with a memory limit,
// never above 2^20.
func TestMaxConnections(t *testing.T) {
	tests := []struct {
		nofile, memory uint64
		want           int
		by             string
	}{
		{0, 0, 1, limitByFiles},
		{256, 0, 1, limitByFiles},          // the reserve alone
		{262, 0, 1, limitByFiles},          // the reserve and one connection's 6
		{268, 0, 2, limitByFiles},          // and another 6
		{1024, 0, 128, limitByFiles},       // (1024-256)/6
		{1 << 20, 0, 174720, limitByFiles}, // no memory limit
		{1 << 40, 0, 1 << 20, limitByFiles},
		{1 << 20, 128 << 20, 72, limitByMemory}, // the chart's 128Mi: (128-24) MiB / 1472 KiB
		{1024, 128 << 20, 72, limitByMemory},
		{1024, 256 << 20, 128, limitByFiles},               // (256-24) MiB / 1472 KiB = 161
		{1 << 20, 24<<20 + 64*1472<<10, 64, limitByMemory}, // the reserve and 64 connections: the floor
		{1 << 20, 24<<20 + 65*1472<<10, 65, limitByMemory},
		{1 << 20, 32 << 20, 64, limitByMemory}, // a 32Mi limit
		{1 << 20, 24 << 20, 64, limitByMemory},
		{1 << 20, 1 << 20, 64, limitByMemory},
		{1 << 20, 1 << 40, 174720, limitByFiles},
	}
	for _, tt := range tests {
		if got, by := maxConnections(tt.nofile, tt.memory); got != tt.want || by != tt.by {
			t.Errorf("maxConnections(%d, %d): got %d by %s; want %d by %s", tt.nofile, tt.memory, got, by, tt.want, tt.by)
		}
	}
}

// TestClientsBeyondTheBoundWaitInTheBacklog: at the connection bound the
// proxy takes no slot for another Accept, so the next client waits in the
// listen backlog, neither refused nor reset, and is served as soon as a
// connection ends.
func TestClientsBeyondTheBoundWaitInTheBacklog(t *testing.T) {
	up := startUpstream(t, echo)
	log := slog.New(slog.DiscardHandler)
	m := newMetrics(prometheus.NewRegistry())
	pl := newPool(log, m, poolConfig{interval: time.Hour, timeout: time.Second}, tcpCheck, randomSelector{})
	const bound = 2
	px := newProxy(log, m, pl, 2*time.Second, bound)
	pl.update([]string{up.addr})
	addr := serveTestProxy(t, px, pl)
	var held []*net.TCPConn
	for i := range bound {
		c := dialProxy(t, addr)
		if err := roundTrip(c, []byte("held")); err != nil {
			t.Fatalf("connection %d within the bound: %v", i, err)
		}
		held = append(held, c)
	}
	waiting := dialProxy(t, addr) // the handshake completes in the backlog
	if _, err := waiting.Write([]byte("queued")); err != nil {
		t.Fatal(err)
	}
	// The wait is the property under test: nothing answers meanwhile.
	_ = waiting.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, err := waiting.Read(make([]byte, 16)); !errors.Is(err, errTimeout(err)) {
		t.Fatalf("client beyond the bound: read %d bytes, %v; want to wait in the backlog", n, err)
	}
	if got := testutil.ToFloat64(m.connectionsActive); got != bound {
		t.Errorf("connections_active at the bound: got %v; want %d", got, bound)
	}
	_ = held[0].Close()
	_ = waiting.SetReadDeadline(time.Now().Add(5 * time.Second))
	got := make([]byte, len("queued"))
	if _, err := io.ReadFull(waiting, got); err != nil || string(got) != "queued" {
		t.Errorf("client beyond the bound once a connection ended: got %q, %v; want %q", got, err, "queued")
	}
}
