package netns

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"
)

func TestTwoNodesTalkAndBlackHole(t *testing.T) {
	if err := Available(); err != nil {
		t.Skip(err)
	}
	n, err := New(DefaultPrefix, netip.MustParsePrefix("192.0.2.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Error(err)
		}
	})
	a, err := n.AddNode("a", netip.MustParseAddr("192.0.2.101"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := n.AddNode("b", netip.MustParseAddr("192.0.2.102"))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := b.Listen("tcp", "192.0.2.102:9000")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("hi"))
			_ = c.Close()
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := a.DialContext(ctx, "tcp", "192.0.2.102:9000")
	if err != nil {
		t.Fatalf("dial b from a: %v", err)
	}
	got, _ := io.ReadAll(c)
	c.Close()
	if string(got) != "hi" {
		t.Errorf("read %q; want %q", got, "hi")
	}

	if err := n.SetLink("b", false); err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel2()
	start := time.Now()
	_, err = a.DialContext(ctx2, "tcp", "192.0.2.102:9000")
	// The dial ends with the context's error or with the socket deadline
	// net derives from it ("i/o timeout"), whichever fires first.
	var ne net.Error
	timedOut := errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
	if took := time.Since(start); !timedOut || took < time.Second {
		t.Errorf("dial to a black-holed node: got %v after %s; want a timeout, not a fast error", err, took)
	}
	if err := n.SetLink("b", true); err != nil {
		t.Fatal(err)
	}
}

func TestSweepRemovesOnlyStaleRuns(t *testing.T) {
	if err := Available(); err != nil {
		t.Skip(err)
	}
	// pid 1 is alive; a pid above the kernel's maximum never is.
	live := DefaultPrefix + "-1-sweeptest-hub"
	stale := DefaultPrefix + "-4194304-sweeptest-hub"
	for _, name := range []string{live, stale} {
		if err := ip("netns", "add", name); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ip("netns", "del", name) })
	}
	if errs := Sweep(DefaultPrefix); len(errs) > 0 {
		t.Fatal(errs)
	}
	if _, err := os.Stat("/run/netns/" + live); err != nil {
		t.Errorf("Sweep removed %s, whose pid is alive: %v", live, err)
	}
	if _, err := os.Stat("/run/netns/" + stale); err == nil {
		t.Errorf("Sweep kept %s, whose pid cannot exist", stale)
	}
}
