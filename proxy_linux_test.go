//go:build linux

package main

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"
)

func TestProxySurvivesDescriptorExhaustion(t *testing.T) {
	up := startUpstream(t, echo)
	px := startProxy(t, poolConfig{}, up.addr)
	// The first health check runs at once; let it finish so that nothing
	// but the test opens or closes descriptors while they are exhausted.
	waitFor(t, "the first health check to end", func() bool {
		return up.acceptedCount() == 1 && up.openCount() == 0
	})
	// Nor may anything left by earlier tests: a socket of theirs still
	// closing, or a leaked file its finalizer closes, would free a
	// descriptor after they are all taken, and Accept would not fail.
	quietCounts(t)

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
	held := exhFill(t, nil)
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

// blackHole returns a loopback address whose SYNs are dropped: a listener
// with a backlog of 0 whose accept queue the test fills and never drains.
// Dials to it hang until their timeout, as to a powered-off node.
func blackHole(t *testing.T) string {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*unix.SockaddrInet4).Port))
	for range 8 {
		c, err := net.DialTimeout("tcp", addr, 300*time.Millisecond)
		if err != nil {
			return addr // the queue is full: this SYN was dropped
		}
		t.Cleanup(func() { _ = c.Close() })
	}
	t.Fatal("accept queue never filled")
	return ""
}

func TestHedgedDialRidesThroughBlackHole(t *testing.T) {
	hole := blackHole(t)
	alive := startUpstream(t, echo)
	px := startProxy(t, poolConfig{}, hole, alive.addr)
	for i := range 12 {
		start := time.Now()
		c := dialProxy(t, px.addr)
		if err := roundTrip(c, []byte("hedged")); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		// Without hedging, a pick of the hole costs the 2 s dial timeout.
		if d := time.Since(start); d > time.Second {
			t.Errorf("connection %d took %v; want under 1 s with hedging", i, d)
		}
		_ = c.Close()
	}
	started := testutil.ToFloat64(px.m.hedgedDials)
	won := testutil.ToFloat64(px.m.hedgedWins)
	if started < 1 || won < 1 {
		t.Errorf("hedged dials started %v, won %v; want both at least 1", started, won)
	}
	// Dials to the hole lost the race; they are not its failures.
	if got := testutil.ToFloat64(px.m.connectionErrors.WithLabelValues(hole)); got != 0 {
		t.Errorf("connection_errors_total{hole}: got %v; want 0 for dials that lost a race", got)
	}
}

func TestHedgingOffWaitsForDialTimeout(t *testing.T) {
	hole := blackHole(t)
	alive := startUpstream(t, echo)
	px := startProxyDial(t, poolConfig{}, nil, hole, alive.addr)
	px.hedge = false
	px.pool.mu.Lock()
	u := px.pool.upstreams[alive.addr]
	px.pool.mu.Unlock()
	// Its first check, had it ended later, would include it again.
	waitFor(t, "the first check of the live upstream", func() bool {
		px.pool.mu.Lock()
		defer px.pool.mu.Unlock()
		return !u.lastCheck.IsZero()
	})
	// Only the hole is pickable, so the first dial goes there.
	px.pool.reportCheck(u, checkResult{err: errCheck})
	px.pool.reportCheck(u, checkResult{err: errCheck})
	start := time.Now()
	c := dialProxy(t, px.addr)
	if err := roundTrip(c, []byte("slow")); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 2*time.Second {
		t.Errorf("without hedging the connection took %v; want the 2 s dial timeout first", d)
	}
}

// sockOpt reads an int TCP option of c.
func sockOpt(t *testing.T, c net.Conn, opt int) int {
	t.Helper()
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var serr error
	if err := rc.Control(func(fd uintptr) { v, serr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, opt) }); err != nil {
		t.Fatal(err)
	}
	if serr != nil {
		t.Fatal(serr)
	}
	return v
}

// swept is a proxy with the sweep on in front of an echo upstream, and one
// connection through it.
type swept struct {
	up     *testUpstream
	px     *testProxy
	u      *upstream // up's pool entry
	client net.Conn
	upConn net.Conn // the proxy's socket to up
}

func newSwept(t *testing.T) swept {
	t.Helper()
	up := startUpstream(t, echo)
	px := startProxy(t, poolConfig{sweep: true}, up.addr)
	c := dialProxy(t, px.addr)
	if err := roundTrip(c, []byte("x")); err != nil {
		t.Fatal(err)
	}
	px.pool.mu.Lock()
	u := px.pool.upstreams[up.addr]
	px.pool.mu.Unlock()
	// The upstream's first check, started when it was listed, must not
	// end a suspicion the test starts, nor start one of its own later.
	for deadline := time.Now().Add(5 * time.Second); !checked(px.pool, u); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the upstream's first health check did not end within 5 s")
		}
	}
	px.pool.mu.Lock()
	defer px.pool.mu.Unlock()
	for pc := range u.conns {
		return swept{up: up, px: px, u: u, client: c, upConn: pc.upstream}
	}
	t.Fatal("no connection attached to the upstream")
	return swept{}
}

func TestSuspectUpstreamSocketsSwitchToSweepSettings(t *testing.T) {
	sw := newSwept(t)
	check := func(when string, idle, userTimeout int) {
		t.Helper()
		if got := sockOpt(t, sw.upConn, unix.TCP_KEEPIDLE); got != idle {
			t.Errorf("%s: TCP_KEEPIDLE got %d; want %d", when, got, idle)
		}
		if got := sockOpt(t, sw.upConn, unix.TCP_USER_TIMEOUT); got != userTimeout {
			t.Errorf("%s: TCP_USER_TIMEOUT got %d; want %d", when, got, userTimeout)
		}
	}
	check("normal", 30, 30000)
	// The dial leaves TCP_KEEPCNT alone: TCP_USER_TIMEOUT overrides it.
	if got := sockOpt(t, sw.upConn, unix.TCP_KEEPINTVL); got != 15 {
		t.Errorf("TCP_KEEPINTVL of a new upstream socket: got %d; want 15", got)
	}
	sw.px.pool.reportCheck(sw.u, checkResult{err: errCheck})
	check("after one failed check", 1, 3000)
	if got := sockOpt(t, sw.upConn, unix.TCP_KEEPCNT); got != 3 {
		t.Errorf("TCP_KEEPCNT while suspect: got %d; want 3", got)
	}
	sw.px.pool.reportCheck(sw.u, checkResult{rtt: time.Millisecond})
	check("after recovery", 30, 30000)
	sw.px.pool.mu.Lock()
	pending := sw.u.sweep.pending()
	sw.px.pool.mu.Unlock()
	if pending {
		t.Error("the sweep's look at stalled connections is still pending after recovery")
	}
}

// TestSweepSparesLiveConnections checks that the sweep's look at stalled
// connections, stalledAfter into a suspicion, leaves the connections of a
// live upstream alone: a busy one, with data in flight, and an idle one,
// whose keepalive probes the upstream answers. (TestStalledInfo covers the
// criterion rule by rule.)
func TestSweepSparesLiveConnections(t *testing.T) {
	sw := newSwept(t)
	idle := dialProxy(t, sw.px.addr)
	if err := roundTrip(idle, []byte("x")); err != nil {
		t.Fatal(err)
	}
	pl := sw.px.pool
	pl.reportCheck(sw.u, checkResult{err: errCheck})
	msg := make([]byte, 64<<10)
	for end := time.Now().Add(stalledAfter + time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if err := roundTrip(sw.client, msg); err != nil {
			t.Fatalf("busy connection while its upstream is suspect: %v", err)
		}
	}
	if err := roundTrip(idle, []byte("y")); err != nil {
		t.Fatalf("idle connection after the sweep's look: %v", err)
	}
	pl.mu.Lock()
	looked := sw.u.suspect && !sw.u.sweep.pending()
	pl.mu.Unlock()
	if !looked {
		t.Error("the upstream's suspicion ended before the sweep looked at its connections")
	}
	if got := testutil.ToFloat64(sw.px.m.deadConnsClosed); got != 0 {
		t.Errorf("dead connections counted: %v; want 0", got)
	}
}

// checked reports whether u has had a health check.
func checked(pl *pool, u *upstream) bool {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return !u.lastCheck.IsZero()
}

func TestStalledInfo(t *testing.T) {
	stalled := unix.TCPInfo{State: unix.BPF_TCP_ESTABLISHED, Unacked: 2, Backoff: 3, Last_ack_recv: 4000}
	for _, tc := range []struct {
		name string
		edit func(*unix.TCPInfo)
		want time.Duration
	}{
		{"retransmitting without an ACK", func(*unix.TCPInfo) {}, 4 * time.Second},
		{"after its FIN", func(ti *unix.TCPInfo) { ti.State = unix.BPF_TCP_FIN_WAIT1 }, 4 * time.Second},
		{"nothing unacknowledged", func(ti *unix.TCPInfo) { ti.Unacked = 0 }, 0},
		{"not yet retransmitted", func(ti *unix.TCPInfo) { ti.Backoff = 0 }, 0},
		{"closed by the kernel", func(ti *unix.TCPInfo) { ti.State = unix.BPF_TCP_CLOSE }, 0},
		{"recent ACK", func(ti *unix.TCPInfo) { ti.Last_ack_recv = 200 }, 200 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ti := stalled
			tc.edit(&ti)
			if got := stalledInfo(&ti); got != tc.want {
				t.Errorf("got %v; want %v", got, tc.want)
			}
		})
	}
}

func TestClientSocketsGetKeepaliveAndUserTimeout(t *testing.T) {
	ln, err := listenTCP(t.Context(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// The connect completes in the listen backlog, before Accept.
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	prepareClient(c)
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var keepalive int
	_ = rc.Control(func(fd uintptr) { keepalive, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_KEEPALIVE) })
	for _, o := range []struct {
		name      string
		opt, want int
	}{
		{"TCP_KEEPIDLE", unix.TCP_KEEPIDLE, 30},
		{"TCP_KEEPINTVL", unix.TCP_KEEPINTVL, 15},
		{"TCP_KEEPCNT", unix.TCP_KEEPCNT, 9},
		{"TCP_USER_TIMEOUT", unix.TCP_USER_TIMEOUT, 30000},
		{"TCP_NODELAY", unix.TCP_NODELAY, 1},
	} {
		if got := sockOpt(t, c, o.opt); got != o.want {
			t.Errorf("accepted socket %s = %d; want %d", o.name, got, o.want)
		}
	}
	if keepalive != 1 {
		t.Errorf("accepted socket SO_KEEPALIVE = %d; want 1", keepalive)
	}
}

// pipeFDs counts the pipe descriptors this process holds.
func pipeFDs(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("cannot list descriptors: %v", err)
	}
	n := 0
	for _, e := range entries {
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(target, "pipe:") {
			n++
		}
	}
	return n
}

// settledPipeFDs collects garbage until the pipe count stops falling below
// limit or 5 s pass: pooled splice pipes close only when collected.
func settledPipeFDs(t *testing.T, limit int) int {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		runtime.GC()
		n := pipeFDs(t)
		if n <= limit || time.Now().After(deadline) {
			return n
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestIdleConnectionsHoldNoSplicePipes(t *testing.T) {
	up := startUpstream(t, exhEcho) // buffered: the upstream holds no pipes itself
	px := startProxy(t, poolConfig{}, up.addr)
	const conns = 40
	before := settledPipeFDs(t, 0)
	for i := range conns {
		c := dialProxy(t, px.addr)
		if err := roundTrip(c, bytes.Repeat([]byte{byte(i)}, 64<<10)); err != nil {
			t.Fatal(err)
		}
	}
	// A splicing io.Copy would pin a pipe (two descriptors) per direction
	// to every idle connection: 160 here.
	if held := settledPipeFDs(t, before+4) - before; held > 4 {
		t.Errorf("%d idle connections hold %d pipe descriptors; want none beyond the pool's few", conns, held)
	}
	if got := px.m.connectionsActive; testutil.ToFloat64(got) != conns {
		t.Errorf("active connections %v; want %d", testutil.ToFloat64(got), conns)
	}
}

// TestIdleConnectionsKeepOnlyCopyGoroutines checks that an idle proxied
// connection keeps only its two copy goroutines: the goroutine that dialed,
// whose stack grew on the way, has returned.
func TestIdleConnectionsKeepOnlyCopyGoroutines(t *testing.T) {
	up := startUpstream(t, exhEcho)
	px := startProxy(t, poolConfig{}, up.addr)
	const conns = 20
	for range conns {
		if err := roundTrip(dialProxy(t, px.addr), []byte("idle")); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "only the copy goroutines", func() bool {
		buf := make([]byte, 4<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		return strings.Count(stacks, "(*proxy).handle(") == 0 &&
			strings.Count(stacks, "(*session).copy(") == 2*conns
	})
}

// TestIdleCopyStacksStaySmall checks that the copy goroutines of a
// connection that has carried a small message each way still run on the
// runtime's smallest (2 KiB) stacks. Everything a copy goroutine calls in
// that state must fit in the stack's room above its guard, about 1.1 KiB: a
// stack that once grows to 4 KiB stays 4 KiB while the connection is idle,
// which adds 4 KiB to every idle connection. The race detector's
// instrumentation grows every stack, so this runs without it (.ci/run runs
// it that way).
func TestIdleCopyStacksStaySmall(t *testing.T) {
	if testRaceEnabled() {
		t.Skip("the race detector's instrumentation makes every stack larger")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// The upstream sends one byte on each connection and keeps it, with no
	// goroutine per connection, so that the proxy's are the only new stacks.
	var held []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
			_, _ = c.Write([]byte{1})
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		for _, c := range held {
			c.Close()
		}
	})
	px := startProxy(t, poolConfig{}, ln.Addr().String())
	const conns = 1024
	stacks0, goroutines0 := settledStacks()
	for i := range conns {
		if i%16 == 0 {
			// A collection empties caches such as a sync.Pool; a copy
			// goroutine that then allocates deep in its stack grows it.
			runtime.GC()
		}
		c := dialProxy(t, px.addr)
		if _, err := c.Write([]byte{2}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Read(make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "every connection's copy goroutines", func() bool {
		return testutil.ToFloat64(px.m.connectionsActive) == conns
	})
	stacks1, goroutines1 := settledStacks()
	perGoroutine := float64(stacks1-stacks0) / float64(goroutines1-goroutines0)
	t.Logf("%d connections: %d more goroutines, %.0f bytes of stack each", conns, goroutines1-goroutines0, perGoroutine)
	if perGoroutine > 2<<10+128 {
		t.Errorf("idle copy goroutines use %.0f bytes of stack each; want 2 KiB", perGoroutine)
	}
}

// settledStacks collects garbage and returns the bytes of stack in use and
// the number of goroutines.
func settledStacks() (uint64, int) {
	time.Sleep(100 * time.Millisecond) // let finished goroutines exit
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.StackInuse, runtime.NumGoroutine()
}

// answerThenReset is an upstream that reads a request of reqSize bytes,
// answers with size bytes, waits until its kernel has had every byte of
// the answer acknowledged (by the proxy), and then resets the connection.
func answerThenReset(reqSize, size int, acked chan<- bool) func(net.Conn) {
	return func(c net.Conn) {
		if _, err := io.ReadFull(c, make([]byte, reqSize)); err != nil {
			return // a health check
		}
		if _, err := c.Write(make([]byte, size)); err != nil {
			acked <- false
			return
		}
		ok := false
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if ti, _ := tcpInfo(c); ti != nil && ti.Unacked == 0 && ti.Notsent_bytes == 0 {
				ok = true
				break
			}
		}
		acked <- ok
		_ = c.(*net.TCPConn).SetLinger(0)
		_ = c.Close()
	}
}

// TestUpstreamResetDeliversAcceptedAnswer: an upstream answers, and after
// the proxy has acknowledged the whole answer, resets the connection (an
// API server that dies, or an HTTP server closing with the request body
// unread). The client, slow to read, must still get the whole answer, as
// it would connected directly, and then the reset, not a clean end that
// would pass a cut answer for a whole one. Closing both sockets on the
// upstream's error lost what the client socket still had queued, and the
// client's bytes still unread there turned that close into a reset too.
func TestUpstreamResetDeliversAcceptedAnswer(t *testing.T) {
	const size = 1 << 20
	for _, tt := range []struct {
		name string
		// keepSending: the client goes on sending while the upstream
		// answers, so the proxy's write to the upstream fails first.
		keepSending bool
	}{
		{"client idle", false},
		{"client still sending", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			acked := make(chan bool, 1)
			up := startUpstream(t, answerThenReset(10, size, acked))
			px := startProxy(t, poolConfig{}, up.addr)
			c, err := net.DialTimeout("tcp", px.addr, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := c.Write(make([]byte, 10)); err != nil {
				t.Fatal(err)
			}
			if tt.keepSending {
				go func() {
					for range 500 {
						if _, err := c.Write(make([]byte, 1000)); err != nil {
							return
						}
						time.Sleep(time.Millisecond)
					}
				}()
			}
			if !<-acked {
				t.Fatal("the upstream's answer was not acknowledged within 5 s")
			}
			time.Sleep(300 * time.Millisecond) // the reset reaches the proxy first
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			n, err := io.Copy(io.Discard, c)
			if n != size {
				t.Errorf("client read %d of the %d bytes the upstream had delivered before its reset", n, size)
			}
			// With the client sending, the proxy's write to the upstream
			// may take the reset, and the copy reading the upstream then
			// sees a plain end: if it sees it before the failed write has
			// yielded, it passes on a FIN. Every byte still arrives, and
			// the reset follows; telling the two ends apart would cost a
			// system call on every connection's normal end.
			if !errors.Is(err, syscall.ECONNRESET) && (!tt.keepSending || err != nil) {
				t.Errorf("client read ended with %v; want the upstream's reset passed on (ECONNRESET)", err)
			}
			waitFor(t, "the connection to be closed", func() bool { return testutil.ToFloat64(px.m.connectionsActive) == 0 })
		})
	}
}

// TestClientResetDeliversAcceptedUpload is the other way round: a client
// uploads, and once the proxy has acknowledged every byte, resets the
// connection. The upstream, slow to read, must still get the whole upload,
// and then the reset.
func TestClientResetDeliversAcceptedUpload(t *testing.T) {
	const size = 1 << 20
	type result struct {
		n   int64
		err error
	}
	got := make(chan result, 1)
	up := startUpstream(t, func(c net.Conn) {
		time.Sleep(300 * time.Millisecond) // the reset reaches the proxy first
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, err := io.Copy(io.Discard, c)
		if n > 0 { // not a health check
			got <- result{n, err}
		}
	})
	px := startProxy(t, poolConfig{}, up.addr)
	c, err := net.DialTimeout("tcp", px.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(make([]byte, size)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the proxy to acknowledge the upload", func() bool {
		ti, ok := tcpInfo(c)
		return ok && ti.Unacked == 0 && ti.Notsent_bytes == 0
	})
	_ = c.(*net.TCPConn).SetLinger(0)
	_ = c.Close()
	select {
	case r := <-got:
		if r.n != size {
			t.Errorf("upstream read %d of the %d bytes the client had delivered before its reset", r.n, size)
		}
		if !errors.Is(r.err, syscall.ECONNRESET) {
			t.Errorf("upstream read ended with %v; want the client's reset passed on (ECONNRESET)", r.err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the upstream read nothing within 15 s")
	}
}

// refusingRawConn is a syscall.RawConn whose Control fails, as setsockopt
// does on a kernel or sandbox that refuses TCP_USER_TIMEOUT; that cannot
// be had on demand here.
type refusingRawConn struct{}

func (refusingRawConn) Control(func(uintptr)) error { return syscall.ENOPROTOOPT }
func (refusingRawConn) Read(func(uintptr) bool) error {
	return syscall.ENOPROTOOPT
}

func (refusingRawConn) Write(func(uintptr) bool) error {
	return syscall.ENOPROTOOPT
}

// TestUserTimeoutRefusedDoesNotFailDials: the upstream dialer's Control
// lets the dial go on when TCP_USER_TIMEOUT cannot be set, and says so
// once in the log, not once per connection.
func TestUserTimeoutRefusedDoesNotFailDials(t *testing.T) {
	var logs syncBuffer
	control := userTimeoutControl(slog.New(slog.NewJSONHandler(&logs, nil)))
	for range 3 {
		if err := control("tcp4", "192.0.2.1:6443", refusingRawConn{}); err != nil {
			t.Fatalf("Control: %v; want nil, so the dial goes on", err)
		}
	}
	if n := strings.Count(logs.String(), "no TCP_USER_TIMEOUT"); n != 1 {
		t.Errorf("%d warnings; want 1 in\n%s", n, logs.String())
	}

	// On this kernel the option is set, and nothing is logged.
	logs = syncBuffer{}
	control = userTimeoutControl(slog.New(slog.NewJSONHandler(&logs, nil)))
	up := startUpstream(t, echo)
	c, err := (&net.Dialer{Control: control}).Dial("tcp", up.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var ms int
	_ = rc.Control(func(fd uintptr) { ms, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT) })
	if want := int(tcpUserTimeout.Milliseconds()); ms != want {
		t.Errorf("TCP_USER_TIMEOUT %d ms; want %d", ms, want)
	}
	if logs.String() != "" {
		t.Errorf("log: %s; want nothing", logs.String())
	}
}

// TestYieldedConnectionEndsWithinFlushTimeout: a bidirectional stream
// (exec, port-forward) through an upstream that writes its output before
// it reads more input. The client reads nothing for a moment and then
// resets. The copy upstream->client takes the reset on its write and
// yields, so nothing reads the upstream any more, while the copy
// client->upstream is blocked writing to the upstream, which is blocked
// writing to the proxy. Without a bound only the upstream socket's 30 s
// TCP_USER_TIMEOUT ended that (never, where the kernel refuses it), and it
// counted as a dead upstream connection; the yield now gives up after
// flushTimeout.
func TestYieldedConnectionEndsWithinFlushTimeout(t *testing.T) {
	up := startUpstream(t, func(c net.Conn) {
		buf := make([]byte, 64<<10)
		for {
			if _, err := c.Read(buf); err != nil {
				return // also the health check
			}
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	})
	px := startProxy(t, poolConfig{}, up.addr)
	c, err := net.DialTimeout("tcp", px.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		buf := make([]byte, 64<<10)
		for {
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	}()
	waitFor(t, "the stream to back up to the client", func() bool {
		ti, ok := tcpInfo(c)
		return ok && ti.Notsent_bytes > 0
	})
	time.Sleep(500 * time.Millisecond)
	_ = c.(*net.TCPConn).SetLinger(0)
	_ = c.Close() // the client resets
	start := time.Now()
	const bound = flushTimeout + 2*time.Second
	for testutil.ToFloat64(px.m.connectionsActive) != 0 && time.Since(start) < 45*time.Second {
		time.Sleep(50 * time.Millisecond)
	}
	took := time.Since(start)
	t.Logf("connection ended %v after the client's reset; dead_connections_closed_total=%v",
		took.Round(100*time.Millisecond), testutil.ToFloat64(px.m.deadConnsClosed))
	if took > bound {
		t.Errorf("a connection whose client had reset stayed open for %v; want at most %v", took.Round(100*time.Millisecond), bound)
	}
	if n := testutil.ToFloat64(px.m.deadConnsClosed); n != 0 {
		t.Errorf("dead_connections_closed_total %v; want 0: the upstream is alive", n)
	}
}
