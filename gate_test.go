package main

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

// TestGate: a shut gate holds Accept, and a client waits in the backlog
// until it opens; the accept loop's own deadline still ends an Accept
// while it is open; shutting holds an Accept already waiting; closing ends
// an Accept held by a shut gate.
func TestGate(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := newGate(ln, false)
	defer g.Close()
	type accepted struct {
		c   net.Conn
		err error
	}
	results := make(chan accepted, 1)
	acceptOnce := func() {
		c, err := g.Accept()
		results <- accepted{c, err}
	}
	go acceptOnce()
	c := dialProxy(t, ln.Addr().String())
	select {
	case r := <-results:
		t.Fatalf("a shut gate accepted: %v, %v", r.c, r.err)
	case <-time.After(200 * time.Millisecond):
	}
	g.set(true)
	if r := <-results; r.err != nil || r.c.RemoteAddr().String() != c.LocalAddr().String() {
		t.Fatalf("once open: got %v, %v; want the waiting client", r.c, r.err)
	}
	_ = g.SetDeadline(time.Now().Add(-time.Second))
	if _, err := g.Accept(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("open, past the accept loop's deadline: got %v; want a deadline error", err)
	}
	_ = g.SetDeadline(time.Time{})
	// Shutting the gate on an Accept that waits, or is about to, holds it
	// without an error; it then takes the next client once open.
	go acceptOnce()
	g.set(false)
	select {
	case r := <-results:
		t.Fatalf("shut while accepting: got %v, %v; want it held", r.c, r.err)
	case <-time.After(200 * time.Millisecond):
	}
	g.set(true)
	c = dialProxy(t, ln.Addr().String())
	if r := <-results; r.err != nil || r.c.RemoteAddr().String() != c.LocalAddr().String() {
		t.Fatalf("open again: got %v, %v; want the next client", r.c, r.err)
	}
	g.set(false)
	go acceptOnce()
	_ = g.Close()
	select {
	case r := <-results:
		if !errors.Is(r.err, net.ErrClosed) {
			t.Errorf("closed while shut: got %v; want net.ErrClosed", r.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("closing did not end an Accept held by a shut gate")
	}
}
