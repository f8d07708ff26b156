//go:build linux

package main

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"
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
