package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// boundChildEnv asks a re-executed test binary to play a client of the
// proxy as another uid: "flood ADDR N" or "client ADDR N".
const boundChildEnv = "EP_TEST_BOUND_CHILD"

// TestHostileTricklingUidHoldsTheBound: with the bound of `ulimit -n 1024`
// (128), uid 65534 opens 140 connections through the proxy, each sending a
// byte at once and one every 20 s: never silent long enough to give way
// (idle.go), they held every slot. Then a client of root (this test) and
// one of uid 65533 each open 5 connections at once: each must be served, a
// round trip through the proxy, within 1 s.
func TestHostileTricklingUidHoldsTheBound(t *testing.T) {
	if runBoundChildIfAsked() {
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to run clients as other uids")
	}
	slots, _ := maxConnections(1024, 0)
	px := startLimitedProxy(t, slots, defaultIdlePolicy())
	bin := copyTestBinary(t)
	const flood, clients = 140, 5
	flooder := startBoundChild(t, bin, 65534, "flood", px.addr, flood)
	if line, err := flooder.out.ReadString('\n'); line != "ready\n" {
		t.Fatalf("flooder: got %q, %v; want ready", line, err)
	}
	waitFor(t, "every slot taken by the flood", func() bool { return px.attached() == slots })

	rootServed, rootConns := boundClient(px.addr, clients)
	t.Cleanup(func() {
		for _, c := range rootConns {
			_ = c.Close()
		}
	})
	other := startBoundChild(t, bin, 65533, "client", px.addr, clients)
	line, err := other.out.ReadString('\n')
	if err != nil {
		t.Errorf("uid 65533's client: %v", err)
	}
	otherServed := strings.Fields(line)
	t.Logf("figures: bound %d, uid 65534 trickling on %d connections; root's %d connections served after %v; uid 65533's after %v ms; idle_connections_closed_total limit %v share %v",
		slots, flood, clients, rootServed, otherServed, px.idleClosed(reasonLimit), px.idleClosed(reasonShare))
	for i, c := range rootConns { // root gives up no slot
		if len(rootServed) != clients {
			break // not all served: reported below
		}
		if err := roundTrip(c, []byte("still here")); err != nil {
			t.Errorf("root's connection %d after uid 65533's: %v", i, err)
		}
	}
	for who, served := range map[string][]string{"root": durationsMillis(rootServed), "uid 65533": otherServed} {
		if len(served) != clients {
			t.Errorf("%s's connections served: got %d; want %d", who, len(served), clients)
		}
		for _, ms := range served {
			if n, err := strconv.Atoi(ms); err != nil || n > 1000 {
				t.Errorf("%s's connection served after %s ms; want within 1000", who, ms)
			}
		}
	}
}

// boundClient opens n connections to addr at once and returns how long
// each took to be served, leaving out the ones that were not within 3 s,
// and the connections, left open to hold their slots as a real client's.
func boundClient(addr string, n int) ([]time.Duration, []net.Conn) {
	var mu sync.Mutex
	var served []time.Duration
	var conns []net.Conn
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			c, d, err := servedAfter(addr, []byte("client "+strconv.Itoa(i)))
			mu.Lock()
			defer mu.Unlock()
			if c != nil {
				conns = append(conns, c)
			}
			if err == nil {
				served = append(served, d)
			}
		})
	}
	wg.Wait()
	return served, conns
}

// servedAfter dials addr and returns the connection and how long a round
// trip of msg took from the dial.
func servedAfter(addr string, msg []byte) (net.Conn, time.Duration, error) {
	start := time.Now()
	c, err := net.DialTimeout("tcp", addr, 3*time.Second)
	if err != nil {
		return nil, 0, err
	}
	_ = c.SetDeadline(start.Add(3 * time.Second))
	if _, err := c.Write(msg); err != nil {
		return c, 0, err
	}
	_, err = io.ReadFull(c, make([]byte, len(msg)))
	return c, time.Since(start), err
}

func durationsMillis(ds []time.Duration) []string {
	out := make([]string, 0, len(ds))
	for _, d := range ds {
		out = append(out, strconv.FormatInt(d.Milliseconds(), 10))
	}
	return out
}

// copyTestBinary copies the test binary where another uid may run it.
func copyTestBinary(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "extractedprism.test")
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

type boundChild struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
}

// startBoundChild runs the test binary as uid in the given mode; the test's
// end closes its stdin, which ends it, and waits for it.
func startBoundChild(t *testing.T, bin string, uid uint32, mode, addr string, n int) *boundChild {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 25*time.Second)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, bin, "-test.run=^"+t.Name()+"$")
	cmd.Dir = filepath.Dir(bin)
	cmd.Env = append(os.Environ(), boundChildEnv+"="+fmt.Sprint(mode, " ", addr, " ", n))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	bc := &boundChild{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)}
	t.Cleanup(func() { _ = bc.wait() })
	return bc
}

// wait ends the child and waits for it.
func (bc *boundChild) wait() error {
	_ = bc.stdin.Close()
	_, _ = io.Copy(io.Discard, bc.out)
	return bc.cmd.Wait()
}

// runBoundChildIfAsked plays the client boundChildEnv names, if it does,
// and reports whether it did. A flooder opens its connections, each
// sending a byte, says "ready", and trickles a byte on each every 20 s
// until its stdin closes; a client prints how many milliseconds each of
// its connections took to be served.
func runBoundChildIfAsked() bool {
	mode, addr, n, ok := parseBoundChild(os.Getenv(boundChildEnv))
	if !ok {
		return false
	}
	if mode == "client" {
		served, _ := boundClient(addr, n) // closed as the process ends
		fmt.Println(strings.Join(durationsMillis(served), " "))
		return true
	}
	var conns []net.Conn
	for range n {
		c, err := net.DialTimeout("tcp", addr, 3*time.Second)
		if err != nil {
			fmt.Fprintln(os.Stderr, "flooder:", err)
			os.Exit(1)
		}
		_, _ = c.Write([]byte("x"))
		conns = append(conns, c)
	}
	fmt.Println("ready")
	stdinClosed := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { trickle(conns, stdinClosed) })
	_, _ = io.Copy(io.Discard, os.Stdin)
	close(stdinClosed)
	wg.Wait()
	return true
}

func parseBoundChild(v string) (mode, addr string, n int, ok bool) {
	f := strings.Fields(v)
	if len(f) != 3 {
		return "", "", 0, false
	}
	n, err := strconv.Atoi(f[2])
	return f[0], f[1], n, err == nil
}

// trickle writes a byte on each of conns every 20 s until done closes.
func trickle(conns []net.Conn, done <-chan struct{}) {
	t := time.NewTicker(20 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		for _, c := range conns {
			_, _ = c.Write([]byte("x"))
		}
	}
}

// TestSocketUIDs: the owner of a loopback client's socket is its uid; a
// socket this node does not have, and one its process closed, have none.
func TestSocketUIDs(t *testing.T) {
	dialled, accepted := tcpPair(t)
	live := clientSocket(accepted)
	missing := live
	missing.local = netip.AddrPortFrom(live.local.Addr(), live.local.Port()+1)
	elsewhere := sockPair{netip.MustParseAddrPort("192.0.2.1:40000"), live.remote}
	got := socketUIDs([]sockPair{live, missing, elsewhere})
	if want := []int{os.Getuid(), -1, -1}; !slices.Equal(got, want) {
		t.Errorf("uids of a live, a missing and a remote socket: got %v; want %v", got, want)
	}
	_ = dialled.Close() // FIN_WAIT2 then TIME_WAIT: no process holds it
	if got := socketUIDs([]sockPair{live}); !slices.Equal(got, []int{-1}) {
		t.Errorf("uid of a closed socket: got %v; want [-1]", got)
	}
}

// TestSocketUIDsIPv6: the same over ::1, where the host has IPv6.
func TestSocketUIDsIPv6(t *testing.T) {
	ln, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	defer ln.Close()
	c, err := net.DialTimeout("tcp6", ln.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	accepted, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer accepted.Close()
	sp := clientSocket(accepted)
	if got := socketUIDs([]sockPair{sp}); !slices.Equal(got, []int{os.Getuid()}) {
		t.Errorf("uid of %v: got %v; want [%d]", sp, got, os.Getuid())
	}
}
