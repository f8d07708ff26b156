//go:build linux

package main

import (
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func errEMFILE() error { return syscall.EMFILE }

// fillDescriptors opens /dev/null until the process is out of descriptors
// and returns the files it opened.
func fillDescriptors(t *testing.T) []*os.File {
	t.Helper()
	var held []*os.File
	for range 100000 {
		f, err := os.Open(os.DevNull)
		if err != nil {
			return held
		}
		held = append(held, f)
	}
	t.Fatal("never ran out of descriptors")
	return nil
}

func TestProxySurvivesDescriptorExhaustion(t *testing.T) {
	up := startUpstream(t, echo)
	px := startProxy(t, poolConfig{}, up.addr)
	// The first health check runs at once; let it finish so that nothing
	// but the test opens or closes descriptors while they are exhausted.
	waitFor(t, "the first health check to end", func() bool {
		return up.acceptedCount() == 1 && up.openCount() == 0
	})

	var orig unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &orig); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	low := orig
	low.Cur = uint64(len(entries) + 64)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	held := fillDescriptors(t)
	release := func() {
		for _, f := range held {
			_ = f.Close()
		}
		held = nil
		_ = unix.Setrlimit(unix.RLIMIT_NOFILE, &orig)
	}
	defer release()

	// Free one descriptor for the client socket: the connection reaches the
	// listen backlog, and the proxy's Accept fails with EMFILE.
	_ = held[len(held)-1].Close()
	held = held[:len(held)-1]
	c, err := net.DialTimeout("tcp", px.addr, 5*time.Second)
	if err != nil {
		t.Fatalf("client dial with one descriptor free: %v", err)
	}
	defer c.Close()
	waitFor(t, "Accept to report failure", func() bool { return px.acceptStalledFor() > 0 })
	time.Sleep(50 * time.Millisecond) // several backoff rounds while exhausted
	if up.acceptedCount() != 1 {
		t.Fatal("the client reached the upstream while the proxy was out of descriptors")
	}

	release()
	if err := roundTrip(c, []byte("accepted after EMFILE")); err != nil {
		t.Fatalf("connection after descriptors freed: %v", err)
	}
	if got := px.acceptStalledFor(); got != 0 {
		t.Errorf("accept stall after serving a client: got %v; want 0", got)
	}
}
