package main

// Attacks on the hand-over of the listening sockets (handover.go) and on
// socket activation (listeners.go): rollbacks, a broken successor,
// a neighbour of the same user, and sockets that do not listen.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// logBook keeps every log line a child writes after its start-up line.
type logBook struct {
	mu    sync.Mutex
	lines []string
}

// watchLogs reads mc's log into a logBook until the child exits.
func watchLogs(mc *mainChild) *logBook {
	lb := &logBook{}
	go lb.read(mc.logs)
	return lb
}

func (lb *logBook) read(r *bufio.Reader) {
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		lb.mu.Lock()
		lb.lines = append(lb.lines, line)
		lb.mu.Unlock()
	}
}

func (lb *logBook) count(text string) int {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	n := 0
	for _, l := range lb.lines {
		if strings.Contains(l, text) {
			n++
		}
	}
	return n
}

// await polls until some line of texts has been logged n times, for up to
// within, and reports which one; "" if none was.
func (lb *logBook) await(n int, within time.Duration, texts ...string) string {
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for _, text := range texts {
			if lb.count(text) >= n {
				return text
			}
		}
	}
	return ""
}

const handedLine = "handed the listening sockets to a new instance"

// TestHostileRollbackStrandsNode: O serves, S takes over and is stopped (a
// rollback), and then three instances start one after the other, each
// stopped once it serves. Each must take over from O and serve; none may
// exit with the ports in use, which in Kubernetes crash-loops every later
// rollout on the node.
func TestHostileRollbackStrandsNode(t *testing.T) {
	if runMainIfChild() {
		return
	}
	t.Parallel() // its daemons are processes of their own
	up := startUpstream(t, echo)
	args, addr := handoverArgs(t, up.addr)
	o := startMain(t, args...)
	oLog := watchLogs(o)
	s := startMain(t, args...)
	if !tookOver(s) || oLog.await(1, 10*time.Second, handedLine) == "" {
		t.Fatalf("the successor did not take over: %q", s.early)
	}
	s.stopCleanly(t, "the rollback")
	served, inUse := 0, 0
	for i := range 3 {
		// O takes the path back as its successor goes; a start a moment
		// too early would not find it.
		oLog.await(i+1, 5*time.Second, "the hand-over socket is this instance's again")
		mc, err := tryStartMain(t, nil, args...)
		if err != nil {
			if strings.Contains(err.Error(), "address already in use") {
				inUse++
			}
			t.Logf("start %d after the rollback: %v", i+1, err)
			continue
		}
		if tookOver(mc) && roundTrip(dialProxy(t, addr), []byte("ping")) == nil {
			served++
		} else {
			t.Errorf("start %d after the rollback: took over %v; early log %q", i+1, tookOver(mc), mc.early)
		}
		mc.stopCleanly(t, "start "+strconv.Itoa(i+1))
	}
	t.Logf("figures: of 3 starts after a rollback, %d took over from the old instance and served, %d exited with the ports in use; the old instance took the path back %d times",
		served, inUse, oLog.count("the hand-over socket is this instance's again"))
	if served != 3 {
		t.Errorf("%d of 3 starts served; want all 3", served)
	}
	if err := roundTrip(dialProxy(t, addr), []byte("after")); err != nil {
		t.Errorf("the old instance, alone again: %v", err)
	}
	o.stopCleanly(t, "the starts")
}

// TestHostileBrokenSuccessor: O serves with a live upstream; S takes over
// with only a dead one. While both run, every /readyz answer must be S's
// (503: it has no usable upstream), not O's 200 passed off as S's, and no
// proxied connection may fail: S must leave them to O.
func TestHostileBrokenSuccessor(t *testing.T) {
	if runMainIfChild() {
		return
	}
	t.Parallel() // its daemons are processes of their own
	up := startUpstream(t, echo)
	args, addr := handoverArgs(t, up.addr)
	health := net.JoinHostPort("127.0.0.1", args[slices.Index(args, "--health-port")+1])
	o := startMain(t, args...)
	oLog := watchLogs(o)
	s := startMain(t, append(slices.Clone(args), "--endpoints", deadAddr(t))...)
	if !tookOver(s) || oLog.await(1, 10*time.Second, handedLine) == "" {
		t.Fatalf("the broken successor did not take over: %q", s.early)
	}
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	const probes, conns = 40, 60
	codes := map[int]int{}
	failed := 0
	var firstErr error
	for i := range conns {
		if i < probes {
			codes[readyzCode(client, health)]++
		}
		if err := proxiedOnce(addr); err != nil {
			failed++
			firstErr = firstOf(firstErr, err)
		}
		time.Sleep(25 * time.Millisecond) // spreads the tries over S's first checks
	}
	s.stopCleanly(t, "the probes")
	o.stopCleanly(t, "the probes")
	t.Logf("figures: /readyz while the broken successor ran: %d answers 200, %d answers 503, %d failed, of %d; proxied connections failed: %d of %d (first: %v)",
		codes[200], codes[503], codes[0], probes, failed, conns, firstErr)
	if codes[503] != probes {
		t.Errorf("/readyz: %v (status: count); want %d answers 503, all the broken successor's", codes, probes)
	}
	if failed > 0 {
		t.Errorf("%d of %d proxied connections failed; want none", failed, conns)
	}
}

// readyzCode returns the status of GET /readyz at addr, 0 if it failed.
func readyzCode(client *http.Client, addr string) int {
	resp, err := client.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

// proxiedOnce makes one connection through the proxy at addr and one round
// trip on it.
func proxiedOnce(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 3*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	return roundTrip(c, []byte("ping"))
}

func firstOf(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// peerSocketEnv names the hand-over socket a copy of the test binary
// connects to as a hostile peer (runPeerIfChild).
const peerSocketEnv = "EP_TEST_PEER_SOCKET"

// runPeerIfChild, in the copy that the test starts as a peer, asks for the
// sockets at $EP_TEST_PEER_SOCKET as a successor would, acknowledges what
// it got as one would, and prints how many sockets it received.
func runPeerIfChild() bool {
	path := os.Getenv(peerSocketEnv)
	if path == "" {
		return false
	}
	conn, err := net.DialTimeout("unix", path, 2*time.Second)
	if err != nil {
		fmt.Printf("peer: %v\n", err)
		return true
	}
	defer conn.Close()
	c := conn.(*net.UnixConn)
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	buf, oob := make([]byte, 64), make([]byte, unix.CmsgSpace(4*4))
	_, oobn, _, _, err := c.ReadMsgUnix(buf, oob) //nolint:dogsled // only the descriptors count
	msgs, _ := unix.ParseSocketControlMessage(oob[:max(oobn, 0)])
	var ports []string
	for _, m := range msgs {
		fds, _ := unix.ParseUnixRights(&m)
		for _, fd := range fds {
			if sa, err := unix.Getsockname(fd); err == nil {
				if in4, ok := sa.(*unix.SockaddrInet4); ok {
					ports = append(ports, strconv.Itoa(in4.Port))
				}
			}
			_ = unix.Close(fd)
		}
	}
	if len(ports) > 0 {
		_, _ = io.WriteString(c, "ok\nports "+strings.Join(ports, " ")+"\n")
	}
	fmt.Printf("peer: received %d sockets (err %v)\n", len(ports), err)
	return true
}

// TestHostileSameUidOtherGroupTakesSockets: the daemon runs as
// 65534:65534; a process of the same user but another group (65534:65533,
// a neighbour such as a node exporter) asks for the sockets. It must get
// none, and the daemon must not log a hand-over.
func TestHostileSameUidOtherGroupTakesSockets(t *testing.T) {
	if runMainIfChild() || runPeerIfChild() {
		return
	}
	t.Parallel() // its daemons are processes of their own
	if os.Geteuid() != 0 {
		t.Skip("runs the daemon and the peer as other users")
	}
	dir := t.TempDir()
	bin, run := filepath.Join(dir, "extractedprism.test"), filepath.Join(dir, "run")
	if err := firstError(os.Chmod(filepath.Dir(dir), 0o755), os.Chmod(dir, 0o755), copyFile(os.Args[0], bin),
		os.Mkdir(run, 0o700), os.Chown(run, 65534, 65534)); err != nil {
		t.Fatal(err)
	}
	as := func(gid uint32) func(*exec.Cmd) {
		return func(cmd *exec.Cmd) {
			cmd.Path, cmd.Dir = bin, dir
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: gid}}
		}
	}
	up := startUpstream(t, echo)
	sock := filepath.Join(run, "handover.sock")
	d, err := tryStartMain(t, as(65534), "--endpoints", up.addr, "--handover-socket", sock, "--log-level", "info")
	if err != nil {
		t.Fatal(err)
	}
	dLog := watchLogs(d)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	peer := exec.CommandContext(ctx, bin, "-test.run=^"+regexp.QuoteMeta(t.Name())+"$")
	as(65533)(peer)
	peer.Env = append(os.Environ(), peerSocketEnv+"="+sock)
	out, err := peer.Output()
	if err != nil {
		t.Fatalf("peer: %v\n%s", err, out)
	}
	got := dLog.await(1, 5*time.Second, handedLine, "hand-over of the listening sockets failed")
	received := regexp.MustCompile(`peer: received (\d+) sockets.*`).FindStringSubmatch(string(out))
	d.stopCleanly(t, "the peer")
	if len(received) < 2 {
		t.Fatalf("peer output: %s", out)
	}
	t.Logf("figures: a 65534:65533 peer of a 65534:65534 daemon: %s; the daemon logged %q", received[0], got)
	if received[1] != "0" {
		t.Errorf("the peer of another group: %s; want no socket", received[0])
	}
	if got == handedLine || dLog.count(handedLine) > 0 {
		t.Errorf("the daemon logged a hand-over to a peer of another group")
	}
}

// firstError returns the first of errs that is not nil.
func firstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// copyFile copies the file at from to a new file at to, mode 0755.
func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o755)
}

// connectedFile returns the accepted end of a loopback connection, as
// systemd's Accept=yes passes it: its local port is a listening port.
func connectedFile(t *testing.T) (*os.File, int) {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	accepted, err := ln.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	defer accepted.Close()
	f, err := accepted.File()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return f, ln.Addr().(*net.TCPAddr).Port
}

// TestHostileNonListeningSocketsRefused: a service manager passes a
// connected socket (Accept=yes) on the proxy's port: the start must be
// refused with a message naming it, not serve accept errors for ever. A
// running instance that passes connected sockets must get no
// acknowledgement, and the new instance must serve on its own sockets.
func TestHostileNonListeningSocketsRefused(t *testing.T) {
	if runMainIfChild() {
		return
	}
	up := startUpstream(t, echo)
	f, port := connectedFile(t)
	mc, err := tryStartMain(t, func(cmd *exec.Cmd) {
		cmd.ExtraFiles = []*os.File{f}
		cmd.Env = append(cmd.Env, passFDsEnv+"=1")
	}, "--endpoints", up.addr, "--bind-port", strconv.Itoa(port))
	activation := "refused"
	if err == nil {
		activation = "started on it"
		mc.stopCleanly(t, "a connected socket passed")
		t.Errorf("a connected socket passed on the proxy's port: the daemon started; want the start refused")
	} else if !strings.Contains(err.Error(), "does not listen") {
		t.Errorf("a connected socket passed: %v; want a message that it does not listen", err)
	}

	args, addr := handoverArgs(t, up.addr)
	ack, served := fakeInstanceWithConnectedSockets(t, args)
	t.Logf("figures: activation with a connected socket: %s; a hand-over of connected sockets: answered %q, the new instance served its own: %v",
		activation, ack, served)
	if ack != "" || !served {
		t.Errorf("a hand-over of connected sockets: answered %q, served %v; want no answer, and the new instance serving on its own (%s)", ack, served, addr)
	}
}

// fakeInstanceWithConnectedSockets serves the hand-over socket of args as a
// running instance would, but passes connected sockets on the flags'
// ports, starts an instance with args, and returns what it answered and
// whether it served its proxy port.
func fakeInstanceWithConnectedSockets(t *testing.T, args []string) (ack string, served bool) {
	t.Helper()
	sock := args[slices.Index(args, "--handover-socket")+1]
	if err := os.Mkdir(filepath.Dir(sock), 0o700); err != nil {
		t.Fatal(err)
	}
	uln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer uln.Close()
	lbFile, lbPort := connectedFile(t)
	healthFile, healthPort := connectedFile(t)
	args = append(args, "--bind-port", strconv.Itoa(lbPort), "--health-port", strconv.Itoa(healthPort))
	files := []*os.File{lbFile, healthFile}
	answered := make(chan string, 1)
	go giveConnected(uln, files, answered)
	mc, err := tryStartMain(t, nil, args...)
	if err != nil {
		t.Fatal(err)
	}
	ack = <-answered
	served = proxiedOnce(net.JoinHostPort("127.0.0.1", strconv.Itoa(lbPort))) == nil
	mc.stopCleanly(t, "the hand-over of connected sockets")
	return ack, served
}

// giveConnected accepts one connection on ln, passes files over it with
// the hand-over message, and sends what comes back within 3 s to answered.
func giveConnected(ln *net.UnixListener, files []*os.File, answered chan<- string) {
	c, err := ln.AcceptUnix()
	if err != nil {
		answered <- "accept: " + err.Error()
		return
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	if _, _, err := c.WriteMsgUnix([]byte(handoverHello), unix.UnixRights(fds...), nil); err != nil {
		answered <- "write: " + err.Error()
		return
	}
	b, _ := io.ReadAll(c)
	answered <- string(b)
}
