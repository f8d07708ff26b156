package main

import (
	"errors"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// TestGate: a shut gate holds Accept, and a client waits in the backlog
// until it opens; shutting holds an Accept already waiting; closing ends
// an Accept held by a shut gate. (TestGateKeepsTheTrysDeadline: the
// accept loop's own deadline still ends an Accept while it is open.)
func TestGate(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := newSteadyListener(ln, slog.New(slog.DiscardHandler), "", new(atomic.Int64))
	g.set(false)
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

// TestGateKeepsTheTrysDeadline: a gate shut and opened again while Accept
// fails keeps the deadline of the accept loop's next try, so the stall
// still ends with nobody dialling (TestServeRecoversWithoutClient).
func TestGateKeepsTheTrysDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ln := &lockedDeadlineListener{pipeListener: newPipeListener(), failures: 1}
		stalled := new(atomic.Int64)
		g := newSteadyListener(ln, slog.New(slog.DiscardHandler), "", stalled)
		done := make(chan error, 1)
		go func() { _, err := g.Accept(); done <- err }()
		synctest.Wait()
		if stalled.Load() == 0 {
			t.Fatal("accept stall: got none while Accept fails; want one")
		}
		g.set(false)
		time.Sleep(time.Second)
		g.set(true)
		time.Sleep(time.Second)
		synctest.Wait()
		if stalled.Load() != 0 {
			t.Error("accept still stalled after the gate opened again with Accept working; want the stall ended")
		}
		_ = g.Close()
		if err := <-done; !errors.Is(err, net.ErrClosed) {
			t.Errorf("Accept after Close: got %v; want net.ErrClosed", err)
		}
	})
}

// lockedDeadlineListener fails its first failures Accepts with EMFILE,
// unless its deadline has passed, and then waits for its deadline or for
// ever, nobody dialling.
type lockedDeadlineListener struct {
	*pipeListener
	mu       sync.Mutex
	failures int
	deadline time.Time
}

func (l *lockedDeadlineListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	deadline, fail := l.deadline, l.failures > 0
	passed := !deadline.IsZero() && !time.Now().Before(deadline)
	if fail && !passed {
		l.failures--
	}
	l.mu.Unlock()
	switch {
	case passed:
	case fail:
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", errEMFILE())}
	case deadline.IsZero():
		<-l.closed
		return nil, net.ErrClosed
	default:
		time.Sleep(time.Until(deadline))
	}
	return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.ErrDeadlineExceeded}
}

func (l *lockedDeadlineListener) SetDeadline(t time.Time) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.deadline = t
	return nil
}
