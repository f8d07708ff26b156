//go:build linux

package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"
)

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a.(*net.TCPConn), b.(*net.TCPConn)
}

// sendUrgent sends b as TCP urgent data (MSG_OOB) on c.
func sendUrgent(t *testing.T, c *net.TCPConn, b byte) {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.Sendto(int(fd), []byte{b}, unix.MSG_OOB, nil) }); err != nil {
		t.Fatal(err)
	}
	if serr != nil {
		t.Fatal(serr)
	}
}

// TestProxyPassesUrgentMarkInBulk sends a bulk burst, which the copy moves
// with splice(2), then an urgent byte and more data. splice cannot pass
// the urgent mark; the copy must read over it and forward the rest, and
// the session must end when the client does. The urgent byte itself is
// out-of-band data, which a TCP proxy does not carry.
func TestProxyPassesUrgentMarkInBulk(t *testing.T) {
	received := make(chan []byte, 1)
	up := startUpstream(t, func(c net.Conn) {
		b, _ := io.ReadAll(c)
		_ = c.Close()
		if len(b) > 0 { // not a health check
			received <- b
		}
	})
	// A slow dial: everything the client sends is queued on the client
	// socket before the copy starts, so its first read fills the buffer
	// and the copy splices from then on.
	slow := func(d dialFunc) dialFunc {
		return func(ctx context.Context, network, addr string) (net.Conn, error) {
			time.Sleep(200 * time.Millisecond)
			return d(ctx, network, addr)
		}
	}
	px := startProxyDial(t, poolConfig{}, slow, up.addr)
	waitFor(t, "the first health check to end", func() bool { return up.acceptedCount() >= 1 && up.openCount() == 0 })
	c := dialProxy(t, px.addr)
	payload := make([]byte, 40000)
	_, _ = rand.Read(payload)
	if _, err := c.Write(payload); err != nil {
		t.Fatal(err)
	}
	sendUrgent(t, c, 'X')
	if _, err := c.Write([]byte("after the mark")); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-received:
		if want := slices.Concat(payload, []byte("after the mark")); !bytes.Equal(got, want) {
			t.Fatalf("upstream got %d bytes; want the %d before and after the urgent byte", len(got), len(want))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream did not get the end of the stream within 5 s")
	}
	waitFor(t, "the session to end", func() bool { return testutil.ToFloat64(px.m.connectionsActive) == 0 })
}
