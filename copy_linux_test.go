//go:build linux

package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"slices"
	"syscall"
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

// TestStreamCopyWriteWaitsForRoom checks the raw write of a small burst:
// while the destination's buffers are full it waits under the poller, and
// it writes everything, in order, once the peer reads.
func TestStreamCopyWriteWaitsForRoom(t *testing.T) {
	src, _ := tcpPair(t)
	dst, peer := tcpPair(t)
	if err := dst.SetWriteBuffer(64 << 10); err != nil {
		t.Fatal(err)
	}
	if err := peer.SetReadBuffer(64 << 10); err != nil {
		t.Fatal(err)
	}
	c, err := newStreamCopy(dst, src)
	if err != nil {
		t.Fatal(err)
	}
	payload := make([]byte, 1<<20) // far more than both buffers hold
	_, _ = rand.Read(payload)
	done := make(chan error, 1)
	go func() { done <- c.write(payload) }()
	select {
	case err := <-done:
		t.Fatalf("write returned %v before the peer read anything", err)
	case <-time.After(100 * time.Millisecond):
	}
	got := make([]byte, len(payload))
	if _, err := io.ReadFull(peer, got); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("write: %v", err)
	}
	if !bytes.Equal(got, payload) {
		t.Fatal("the peer read other bytes than were written")
	}
}

// TestStreamCopyWriteToResetPeer checks that writing to a peer that reset
// the connection is an error (MSG_NOSIGNAL: no SIGPIPE), not a hang.
func TestStreamCopyWriteToResetPeer(t *testing.T) {
	src, _ := tcpPair(t)
	dst, peer := tcpPair(t)
	c, err := newStreamCopy(dst, src)
	if err != nil {
		t.Fatal(err)
	}
	if err := peer.SetLinger(0); err != nil { // Close sends a reset
		t.Fatal(err)
	}
	peer.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := c.write([]byte("after the reset"))
		if err != nil {
			if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
				t.Fatalf("write: %v; want ECONNRESET or EPIPE", err)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("writes to a reset peer still succeed after 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
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

// TestQueuedNowAtUrgentMark checks that queuedNow counts up to TCP urgent
// data and then says so, at once: SIOCINQ stops at the urgent byte while a
// peek skips it, and taking that for a race looped forever.
func TestQueuedNowAtUrgentMark(t *testing.T) {
	a, b := tcpPair(t)
	if _, err := a.Write([]byte("ab")); err != nil {
		t.Fatal(err)
	}
	sendUrgent(t, a, 'X')
	if _, err := a.Write([]byte("cd")); err != nil {
		t.Fatal(err)
	}
	rc, err := b.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	queued := func(countFirst bool) (n int, err error) {
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = rc.Control(func(fd uintptr) { n, err = queuedNow(int(fd), make([]byte, 1), countFirst) })
		}()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("queuedNow still running after 5 s")
		}
		return n, err
	}
	deadline := time.Now().Add(5 * time.Second)
	for n, err := queued(true); n != 2 || err != nil; n, err = queued(true) {
		if time.Now().After(deadline) {
			t.Fatalf("queuedNow before the mark: %d, %v; want 2, nil", n, err)
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := io.ReadFull(b, make([]byte, 2)); err != nil {
		t.Fatal(err)
	}
	for _, countFirst := range []bool{true, false} {
		if n, err := queued(countFirst); !errors.Is(err, errUrgentMark) {
			t.Errorf("queuedNow at the mark (countFirst %v): %d, %v; want errUrgentMark", countFirst, n, err)
		}
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
