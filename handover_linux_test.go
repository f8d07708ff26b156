package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// handoverArgs are the flags of every instance in a hand-over test: the
// same ports and the same hand-over socket.
func handoverArgs(t *testing.T, upstream string) (args []string, proxyAddr string) {
	t.Helper()
	bind, health := strconv.Itoa(freePort(t)), strconv.Itoa(freePort(t))
	sock := filepath.Join(t.TempDir(), "run", "handover.sock")
	return []string{"--endpoints", upstream, "--bind-port", bind, "--health-port", health,
		"--handover-socket", sock, "--log-level", "info"}, net.JoinHostPort("127.0.0.1", bind)
}

func tookOver(mc *mainChild) bool {
	return slices.ContainsFunc(mc.early, func(l string) bool {
		return strings.Contains(l, "took over the listening sockets from the running instance")
	})
}

// TestReadAck reads a successor's answer: an instance of this version
// names the ports it adopted, one of an older version answers "ok" alone
// and closes the connection, having taken both; anything else is no
// acknowledgement.
func TestReadAck(t *testing.T) {
	tests := []struct {
		answer string
		want   []string
		ok     bool
	}{
		{"ok\nports 6443 8081\n", []string{"6443", "8081"}, true},
		{"ok\nports 8081\n", []string{"8081"}, true},
		{"ok\n", nil, true}, // an older version's
		{"", nil, false},
		{"no\n", nil, false},
		{"ok\nports\n", nil, false},
		{"ok\nports 6443", nil, false}, // cut short
		{"ok\nsockets 6443\n", nil, false},
	}
	for _, tt := range tests {
		fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
		if err != nil {
			t.Fatal(err)
		}
		peer := os.NewFile(uintptr(fds[1]), "peer")
		f := os.NewFile(uintptr(fds[0]), "ack")
		fc, err := net.FileConn(f)
		_ = f.Close()
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.WriteString(peer, tt.answer)
		_ = peer.Close()
		got, err := readAck(fc.(*net.UnixConn))
		_ = fc.Close()
		if (err == nil) != tt.ok || !slices.Equal(got, tt.want) || (tt.ok && (got == nil) != (tt.want == nil)) {
			t.Errorf("readAck(%q) = %q, %v; want %q, ok %v", tt.answer, got, err, tt.want, tt.ok)
		}
	}
}

// TestHandoverShares starts a second daemon while the first runs: it
// takes the first one's sockets instead of failing to bind, and both
// serve them. Connections waiting in the accept queue when the first
// closes its listener stay there for the second, none reset: both are
// stopped (SIGSTOP) while the clients connect and send, the first gets
// SIGTERM and runs on to its exit, then the second runs on.
func TestHandoverShares(t *testing.T) {
	if runMainIfChild() {
		return
	}
	t.Parallel() // its daemons are processes of their own
	up := startUpstream(t, echo)
	args, addr := handoverArgs(t, up.addr)
	first := startMain(t, args...)
	if tookOver(first) {
		t.Fatalf("the first daemon took sockets over from nobody: %q", first.early)
	}
	handed := first.logSeen("handed the listening sockets to a new instance")
	second := startMain(t, args...)
	if !tookOver(second) {
		t.Fatalf("the second daemon did not take the sockets over: %q", second.early)
	}
	waitLog(t, handed, "the second daemon's start")
	first.signal(t, syscall.SIGSTOP)
	second.signal(t, syscall.SIGSTOP)
	var queued []net.Conn
	for range 50 {
		c := dialProxy(t, addr)
		if _, err := c.Write([]byte("queued")); err != nil {
			t.Fatal(err)
		}
		queued = append(queued, c)
	}
	first.signal(t, syscall.SIGTERM)
	first.signal(t, syscall.SIGCONT)
	if err := first.cmd.Wait(); err != nil {
		t.Fatalf("the first daemon, after SIGTERM: %v", err)
	}
	second.signal(t, syscall.SIGCONT)
	buf := make([]byte, len("queued"))
	for i, c := range queued {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Errorf("connection %d, made while the first daemon still held the socket: %v", i, err)
		}
		_ = c.Close()
	}
	if err := roundTrip(dialProxy(t, addr), []byte("after")); err != nil {
		t.Errorf("after the first daemon stopped: %v", err)
	}
	second.stopCleanly(t, "serving alone")
}

// TestHandoverToAnotherPort: a successor whose --bind-port differs takes
// only the health socket, whose port is the same, and opens its own proxy
// socket; the first keeps serving the old port until it stops.
func TestHandoverToAnotherPort(t *testing.T) {
	if runMainIfChild() {
		return
	}
	t.Parallel() // its daemons are processes of their own
	up := startUpstream(t, echo)
	args, oldAddr := handoverArgs(t, up.addr)
	first := startMain(t, args...)
	newPort := freePort(t)
	second := startMain(t, append(args, "--bind-port", strconv.Itoa(newPort))...)
	if !tookOver(second) || !slices.ContainsFunc(second.early, func(l string) bool {
		return strings.Contains(l, "not taking the running instance's socket") && strings.Contains(l, oldAddr)
	}) {
		t.Errorf("want the health socket taken over and the proxy's left: %q", second.early)
	}
	for _, addr := range []string{oldAddr, net.JoinHostPort("127.0.0.1", strconv.Itoa(newPort))} {
		if err := roundTrip(dialProxy(t, addr), []byte("ping")); err != nil {
			t.Errorf("%s: %v", addr, err)
		}
	}
	first.stopCleanly(t, "the partial hand-over")
	second.stopCleanly(t, "serving the new port")
}

// TestHandoverLosesNoConnection hands the sockets on 20 times, each
// instance to the next, stopping the old one once the next serves, while
// clients make at least 2,000 connections of 1 to 3 requests each: no
// dial is refused, no connection reset and no request unanswered. With
// the old instance force-closing its connections instead, about a dozen
// fail in each hand-over.
func TestHandoverLosesNoConnection(t *testing.T) {
	if runMainIfChild() {
		return
	}
	if testing.Short() {
		t.Skip("starts 21 daemons")
	}
	t.Parallel() // its daemons are processes of their own
	up := startUpstream(t, slowPong)
	args, addr := handoverArgs(t, up.addr)
	mc := startMain(t, args...)
	stop := make(chan struct{})
	results := make(chan requestCounts, 16)
	var conns atomic.Int64
	for i := range cap(results) {
		go func() { results <- connLoop(addr, stop, int64(i), &conns) }()
	}
	const handovers, minConns = 20, 2000
	for i := range handovers {
		handed := mc.logSeen("handed the listening sockets to a new instance")
		next := startMain(t, args...)
		if !tookOver(next) {
			close(stop)
			t.Fatalf("hand-over %d: the new daemon opened its own sockets: %q", i, next.early)
		}
		waitLog(t, handed, "hand-over "+strconv.Itoa(i))
		mc.stopCleanly(t, "hand-over "+strconv.Itoa(i))
		mc = next
	}
	for deadline := time.Now().Add(time.Minute); conns.Load() < minConns && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
	}
	close(stop)
	total := sumCounts(results, cap(results))
	mc.stopCleanly(t, "the last connections")
	t.Logf("%d hand-overs: %d connections, %d requests, %d failed", handovers, total.conns, total.requests, total.failed)
	if total.failed > 0 || total.conns < minConns {
		t.Errorf("%d of %d connections failed (first: %v); want none of at least %d", total.failed, total.conns, total.firstErr, minConns)
	}
}

// connLoop makes connections until stop is closed, each carrying 1 to 3
// requests with pauses under 5 ms, and counts them in n. A refused dial, a
// reset or an unanswered request is a failure.
func connLoop(addr string, stop <-chan struct{}, seed int64, n *atomic.Int64) requestCounts {
	var rc requestCounts
	rng := rand.New(rand.NewPCG(uint64(seed), 2))
	for {
		select {
		case <-stop:
			return rc
		default:
		}
		rc.conns++
		n.Add(1)
		if err := connRequests(addr, 1+rng.IntN(3), rng, &rc.requests); err != nil {
			rc.failed++
			if rc.firstErr == nil {
				rc.firstErr = err
			}
		}
	}
}

func connRequests(addr string, requests int, rng *rand.Rand, counted *int) error {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	buf := make([]byte, 5)
	for i := range requests {
		*counted++
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c, "ping\n"); err != nil {
			return fmt.Errorf("request %d: %w", i, err)
		}
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "pong\n" {
			return fmt.Errorf("request %d: %q, %w", i, buf, err)
		}
		time.Sleep(time.Duration(rng.IntN(5)) * time.Millisecond)
	}
	return nil
}

// TestOwnDir: the hand-over directory is made 0700, a directory of the
// daemon's user is tightened, and one of another user's, a symlink, a
// file or one in a parent others can write is refused with what is wrong.
func TestOwnDir(t *testing.T) {
	base := t.TempDir()
	fresh := filepath.Join(base, "fresh")
	if err := ownDir(fresh); err != nil {
		t.Fatal(err)
	}
	wide := filepath.Join(base, "wide")
	if err := os.Mkdir(wide, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := ownDir(wide); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{fresh, wide} {
		if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: %v, %v; want mode 0700", dir, fi.Mode(), err)
		}
	}
	file := filepath.Join(base, "file")
	link := filepath.Join(base, "link")
	if err := errors.Join(os.WriteFile(file, nil, 0o600), os.Symlink(fresh, link)); err != nil {
		t.Fatal(err)
	}
	wide = filepath.Join(base, "open")
	if err := errors.Join(os.Mkdir(wide, 0o777), os.Chmod(wide, 0o777)); err != nil {
		t.Fatal(err)
	}
	wants := map[string]string{file: "file is not a directory", link: "link is not a directory",
		filepath.Join(wide, "run"): "open/ is owned by uid " + strconv.Itoa(os.Geteuid()) + ", mode 0777; want one that no user but root"}
	if os.Geteuid() == 0 {
		other := filepath.Join(base, "other")
		if err := errors.Join(os.Mkdir(other, 0o700), os.Chown(other, 65534, 65534)); err != nil {
			t.Fatal(err)
		}
		wants[other] = "is owned by uid 65534 (mode 0700); want uid 0"
	}
	for dir, want := range wants {
		if err := ownDir(dir); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ownDir(%s) = %v; want an error containing %q", dir, err, want)
		}
	}
}

// TestHandoverDir runs the subcommand as the chart's init container does:
// the directory is made, then given to the daemon's user, mode 0700.
func TestHandoverDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown needs root")
	}
	dir := filepath.Join(t.TempDir(), "run")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(t.Context(), []string{"handover-dir", "--uid", "65534", "--gid", "65533", dir}, os.Getenv, os.Environ, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if st.Uid != 65534 || st.Gid != 65533 || fi.Mode().Perm() != 0o700 {
		t.Errorf("%s: %d:%d %v; want 65534:65533 mode 0700", dir, st.Uid, st.Gid, fi.Mode())
	}
	if !strings.Contains(out.String(), "is owned by 65534:65533, mode 0700") {
		t.Errorf("output %q", out.String())
	}
	for _, args := range [][]string{{dir}, {"--uid", "1", dir}, {"--uid", "1", "--gid", "1"}, {"--uid", "1", "--gid", "1", filepath.Join(dir, "x", "y")}} {
		if err := run(t.Context(), append([]string{"handover-dir"}, args...), os.Getenv, os.Environ, io.Discard, io.Discard); err == nil {
			t.Errorf("handover-dir %q: no error", args)
		}
	}
}

// TestHandoverRefusedPathExplained: the hand-over path names a socket
// nobody serves, and something else holds the proxy's port. The start
// fails, and says that the path refused and what that means, not a bare
// "address already in use".
func TestHandoverRefusedPathExplained(t *testing.T) {
	if runMainIfChild() {
		return
	}
	args, addr := handoverArgs(t, deadAddr(t))
	sock := args[slices.Index(args, "--handover-socket")+1]
	if err := os.Mkdir(filepath.Dir(sock), 0o700); err != nil {
		t.Fatal(err)
	}
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	_ = stale.Close()
	held, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	_, err = tryStartMain(t, nil, args...)
	if err == nil || !strings.Contains(err.Error(), "refused connections, so what holds the port cannot be asked for it") {
		t.Errorf("start with a refusing hand-over path and the port held: %v; want the refusal explained", err)
	}
}
