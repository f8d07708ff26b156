package main

import (
	"io"
	"net"
	"testing"
	"time"
)

// tcpPair returns the two ends of a loopback TCP connection: the dialled
// one and the accepted one.
func tcpPair(t *testing.T) (dialled, accepted net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dialled, err = net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if accepted, err = ln.Accept(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dialled.Close(); _ = accepted.Close() })
	return dialled, accepted
}

// TestQuietMoment: a connection whose client waits for an answer is never
// quiet, however long the wait; once answered, it is quiet after
// rebalanceQuiet, read from the kernel's TCP_INFO of real sockets.
func TestQuietMoment(t *testing.T) {
	client, accepted := tcpPair(t)
	dialled, _ := tcpPair(t)
	pc := &proxyConn{client: accepted, upstream: dialled}
	// A request within replyLagMillis of the handshake would read as a
	// reaction to it (the kernel's last send time starts there).
	time.Sleep(50 * time.Millisecond)
	if _, err := client.Write([]byte("GET")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(accepted, make([]byte, 3)); err != nil {
		t.Fatal(err)
	}
	// A request in flight: nothing is queued, but the client is waiting.
	deadline := time.Now().Add(rebalanceQuiet + 500*time.Millisecond)
	for time.Now().Before(deadline) {
		if quietNow(pc) {
			t.Fatal("quiet while the client waits for its answer")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := accepted.Write([]byte("200")); err != nil {
		t.Fatal(err)
	}
	answered := time.Now()
	if _, err := io.ReadFull(client, make([]byte, 3)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a quiet moment after the answer", func() bool { return quietNow(pc) })
	// TCP_INFO's times come from the kernel's ticks, 10 ms at the coarsest.
	if d := time.Since(answered); d < rebalanceQuiet-10*time.Millisecond {
		t.Errorf("quiet %v after the answer; want at least %v", d, rebalanceQuiet)
	}
}

// quietNow is the rebalancer's rule (quietDue) applied to pc now.
func quietNow(pc *proxyConn) bool {
	due, _ := quietDue(pc, time.Now(), func() connLook { return lookAt(pc) })
	return due
}
