//go:build linux

package main

// Descriptor exhaustion, with the whole daemon running: the accept loop
// backs off and recovers, /healthz tells the truth, a dial or check that
// fails for lack of descriptors is not blamed on the upstream, and a flood
// of clients leaves the health server its reserve.
//
// RLIMIT_NOFILE belongs to the whole test binary, so these tests run one
// after another (no t.Parallel) and restore the limit before they end.

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// exhSetLimit sets the soft RLIMIT_NOFILE and restores the original when the
// test ends.
func exhSetLimit(t *testing.T, soft uint64) {
	t.Helper()
	var orig unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &orig); err != nil {
		t.Fatal(err)
	}
	if soft > orig.Max {
		t.Skipf("need %d descriptors; the hard limit is %d", soft, orig.Max)
	}
	t.Cleanup(func() {
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &orig); err != nil {
			t.Errorf("restore RLIMIT_NOFILE: %v", err)
		}
	})
	low := orig
	low.Cur = soft
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
}

// exhKeepAlive is one HTTP/1.1 connection to the health server, opened
// while descriptors are plentiful and reused while they are not: asking
// over it needs no new descriptor on either side.
type exhKeepAlive struct {
	c  net.Conn
	br *bufio.Reader
}

func newExhKeepAlive(t *testing.T, healthBase string) *exhKeepAlive {
	t.Helper()
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(healthBase, "http://"), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &exhKeepAlive{c: c, br: bufio.NewReader(c)}
}

func (k *exhKeepAlive) get(t *testing.T, path string) (int, string) {
	t.Helper()
	_ = k.c.SetDeadline(time.Now().Add(5 * time.Second))
	_, err := fmt.Fprintf(k.c, "GET %s HTTP/1.1\r\nHost: health\r\n\r\n", path)
	var resp *http.Response
	if err == nil {
		resp, err = http.ReadResponse(k.br, nil)
	}
	var body []byte
	if err == nil {
		body, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	if err != nil {
		t.Fatalf("GET %s on the kept connection: %v", path, err)
	}
	return resp.StatusCode, string(body)
}

// exhMetric returns the value of series (name and labels, as printed) in a
// /metrics page, or -1 if it is absent.
func exhMetric(page, series string) float64 {
	for line := range strings.SplitSeq(page, "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err == nil {
				return v
			}
		}
	}
	return -1
}

// exhFill opens /dev/null until the process is out of descriptors and
// returns what it opened, appended to held.
func exhFill(t *testing.T, held []*os.File) []*os.File {
	t.Helper()
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

// exhEcho echoes through a buffer. io.Copy between sockets would splice,
// and net keeps splice pipes in a pool that the garbage collector empties
// whenever it runs, freeing descriptors at moments no test controls.
func exhEcho(c net.Conn) {
	_, _ = io.CopyBuffer(struct{ io.Writer }{c}, struct{ io.Reader }{c}, make([]byte, 4096))
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}

// exhDaemon is a daemon in front of two pausable upstreams, with a kept
// connection to its health server.
type exhDaemon struct {
	*runningDaemon
	a, b *testUpstream
	kept *exhKeepAlive
	held []*os.File // descriptors the test holds to exhaust the process
}

func exhSeries(name, addr string) string { return name + `{upstream="` + addr + `"}` }

// startExhDaemon starts the daemon with a two-second liveness threshold and
// waits until both upstreams have been checked and have closed the checks'
// connections: the next checks are two seconds away, and until then nothing
// in the process opens or closes a descriptor unless the test does.
func startExhDaemon(t *testing.T) *exhDaemon {
	t.Helper()
	a, b := startUpstream(t, exhEcho), startUpstream(t, exhEcho)
	d := &exhDaemon{a: a, b: b}
	d.runningDaemon = startDaemon(t, nil, "--endpoints", a.addr+","+b.addr,
		"--liveness-interval", "1s", "--liveness-threshold", "2s",
		"--health-interval", "2s", "--health-timeout", "1s")
	d.kept = newExhKeepAlive(t, d.healthBase)
	waitFor(t, "both upstreams checked", func() bool {
		if a.acceptedCount() == 0 || a.openCount() != 0 || b.acceptedCount() == 0 || b.openCount() != 0 {
			return false
		}
		_, page := d.kept.get(t, "/metrics")
		return exhMetric(page, exhSeries("extractedprism_health_check_status", a.addr)) == 1 &&
			exhMetric(page, exhSeries("extractedprism_health_check_status", b.addr)) == 1
	})
	if code, _ := d.kept.get(t, "/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz before exhaustion: got %d; want 200", code)
	}
	return d
}

// exhaust pauses the upstreams, lowers the limit, takes every descriptor
// and puts one client into the proxy's backlog, which the proxy cannot
// accept. It returns the client.
func (d *exhDaemon) exhaust(t *testing.T) net.Conn {
	t.Helper()
	d.a.pause(true)
	d.b.pause(true)
	// Pooled splice pipes of earlier tests close when the collector gets
	// to them; let it, so none is freed while the test holds the rest.
	_, fds := quietCounts(t)
	exhSetLimit(t, uint64(fds+64))
	d.held = exhFill(t, nil)
	// A health check may take the descriptor meant for the client first,
	// so free one at a time until the client has one, then fill again.
	var client net.Conn
	for client == nil && len(d.held) > 0 {
		d.freeOne()
		client, _ = net.DialTimeout("tcp", d.proxyAddr, 2*time.Second)
	}
	if client == nil {
		t.Fatal("could not dial the proxy with descriptors freed")
	}
	t.Cleanup(func() { _ = client.Close() })
	d.held = exhFill(t, d.held)
	waitFor(t, "the accept loop to report failure", func() bool {
		return strings.Contains(d.logs.String(), "accept failing")
	})
	return client
}

func (d *exhDaemon) freeOne() {
	_ = d.held[len(d.held)-1].Close()
	d.held = d.held[:len(d.held)-1]
}

// release gives every descriptor back and resumes the upstreams.
func (d *exhDaemon) release() {
	for _, f := range d.held {
		_ = f.Close()
	}
	d.held = nil
	d.a.pause(false)
	d.b.pause(false)
}

func TestExhaustionDaemonTellsTheTruth(t *testing.T) {
	d := startExhDaemon(t)
	client := d.exhaust(t)
	defer d.release()

	// /healthz fails once accepting has failed past the threshold, and
	// says why.
	waitFor(t, "/healthz to fail while Accept fails", func() bool {
		code, _ := d.kept.get(t, "/healthz")
		return code == http.StatusServiceUnavailable
	})
	if _, body := d.kept.get(t, "/healthz"); !strings.Contains(body, "no heartbeat") {
		t.Errorf("/healthz body while Accept fails: got %q; want the heartbeat's age", body)
	}
	waitFor(t, "a health check to be skipped for lack of descriptors", func() bool {
		return strings.Contains(d.logs.String(), "health check skipped: local resources exhausted")
	})

	// One descriptor for the proxy: it accepts the client, and its dial
	// to the upstream finds none (the paused upstreams free nothing
	// meanwhile), which ends the client's dialling: it is refused.
	d.freeOne()
	waitFor(t, "a client dial to fail for lack of descriptors", func() bool {
		logs := d.logs.String()
		return strings.Contains(logs, "client connection closed without upstream") && strings.Contains(logs, "too many open files")
	})
	_ = client.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := client.Read(make([]byte, 1)); err == nil {
		t.Errorf("client read %d bytes though no upstream could be dialed; want EOF or reset", n)
	}
	_ = client.Close()

	_, page := d.kept.get(t, "/metrics")
	for _, addr := range []string{d.a.addr, d.b.addr} {
		if got := exhMetric(page, exhSeries("extractedprism_health_check_status", addr)); got != 1 {
			t.Errorf("health_check_status{%s} after local exhaustion: got %v; want 1", addr, got)
		}
		if got := exhMetric(page, exhSeries("extractedprism_connection_errors_total", addr)); got > 0 {
			t.Errorf("connection_errors_total{%s} after local exhaustion: got %v; want 0", addr, got)
		}
	}
	if got := exhMetric(page, "extractedprism_upstreams_active"); got != 2 {
		t.Errorf("upstreams_active after local exhaustion: got %v; want 2", got)
	}
	if strings.Contains(d.logs.String(), "upstream unhealthy") {
		t.Error("an upstream was marked unhealthy because this process was out of descriptors")
	}

	// Descriptors come back: a client is proxied again and /healthz
	// follows within a beat.
	d.release()
	if err := roundTrip(dialProxy(t, d.proxyAddr), []byte("after exhaustion")); err != nil {
		t.Fatalf("proxied connection after descriptors came back: %v", err)
	}
	waitFor(t, "/healthz to recover", func() bool {
		code, _ := d.kept.get(t, "/healthz")
		return code == http.StatusOK
	})
	if code, _ := d.kept.get(t, "/readyz"); code != http.StatusOK {
		t.Errorf("/readyz after exhaustion: got %d; want 200", code)
	}
}

func TestExhaustionFloodKeepsHealthServerAnswering(t *testing.T) {
	if testing.Short() {
		t.Skip("opens thousands of connections; skipped with -short")
	}
	// The daemon sizes its connection bound from the limit it starts
	// with (the limit less fdReserve, over fdsPerConn).
	const startLimit = 2048
	bound, _ := maxConnections(startLimit, 0)
	somaxconn := 4096
	if b, err := os.ReadFile("/proc/sys/net/core/somaxconn"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			somaxconn = n
		}
	}
	// Past the bound, clients wait in the backlog; beyond it, the kernel
	// drops their SYNs and dials only time out.
	flood := min(5000, bound+somaxconn-100)

	// The upstream copies through a buffer (exhEcho): io.Copy between
	// sockets would splice, and its pipes would cost two descriptors more
	// per connection than an upstream in another process costs this one.
	up := startUpstream(t, exhEcho)
	exhSetLimit(t, startLimit)
	d := startDaemon(t, nil, "--endpoints", up.addr)
	// Then room for what would live in other processes in production: the
	// clients and the upstream's side of each proxied connection. What is
	// left is the daemon's own: its bound and its reserve.
	_, open := quietCounts(t)
	limit := startLimit + open + flood + bound + 64
	exhSetLimit(t, uint64(limit))

	// The health server is asked every 100 ms, each time on a new
	// connection, for as long as the flood lasts. Starvation would mean no
	// answer at all; newProber's 3 s tolerates a CI machine shared with
	// other work, where 1 s flaked.
	paths := []string{"/healthz", "/metrics"}
	monitorDone := make(chan struct{})
	calls := make([][]floodCall, len(paths))
	var monitor sync.WaitGroup
	for i, path := range paths {
		monitor.Go(func() {
			calls[i] = callEvery(monitorDone, time.Now(), 100*time.Millisecond, newProber(), d.healthBase+path)
		})
	}
	stopMonitor := sync.OnceFunc(func() { close(monitorDone); monitor.Wait() })
	defer stopMonitor()

	conns := make([]net.Conn, flood)
	hello := []byte("x")
	var dialErrs atomic.Int64
	var dialers sync.WaitGroup
	var next atomic.Int64
	start := time.Now()
	for range 64 {
		dialers.Go(func() {
			for i := int(next.Add(1) - 1); i < flood; i = int(next.Add(1) - 1) {
				c, err := net.DialTimeout("tcp", d.proxyAddr, 5*time.Second)
				if err == nil {
					// A client that has spoken keeps its slot (idle.go).
					_, err = c.Write(hello)
				}
				if err != nil {
					dialErrs.Add(1)
					continue
				}
				conns[i] = c
			}
		})
	}
	defer func() {
		for _, c := range conns {
			if c != nil {
				_ = c.Close()
			}
		}
	}()
	dialers.Wait()
	dialed := time.Since(start)
	if n := dialErrs.Load(); n > 0 {
		t.Errorf("%d of %d client dials failed; want every client at least in the backlog", n, flood)
	}
	var page string
	waitFor(t, "the proxy to fill its connection bound", func() bool {
		_, page = httpGet(d.healthBase + "/metrics")
		return exhMetric(page, "extractedprism_connections_active") == float64(bound)
	})
	time.Sleep(time.Second) // the flood holds; the monitor keeps asking
	_, page = httpGet(d.healthBase + "/metrics")
	if got := exhMetric(page, "extractedprism_connections_active"); got != float64(bound) {
		t.Errorf("connections_active while flooded: got %v; want the bound %d", got, bound)
	}
	fds := procOpenFDs(t)
	stopMonitor()
	asked, failed, worst := 0, 0, time.Duration(0)
	for i, path := range paths {
		for _, c := range calls[i] {
			asked, worst = asked+1, max(worst, c.took)
			if c.err != nil || c.code != http.StatusOK || c.took > probeTimeout {
				failed++
				t.Errorf("GET %s %v into the flood: status %d, %v after %v; want 200 within %v", path, c.at, c.code, c.err, c.took, probeTimeout)
			}
		}
	}

	if strings.Contains(d.logs.String(), "accept failing") {
		t.Error("the accept loop ran out of descriptors during the flood; want the bound to keep the reserve free")
	}
	// When clients leave, waiting ones are accepted and proxied: the last
	// twenty dialed have waited in the backlog all along.
	waiting := conns[max(len(conns)-20, 0):]
	for i, c := range conns[:len(conns)-len(waiting)] {
		if c != nil {
			_ = c.Close()
			conns[i] = nil
		}
	}
	// The proxy works through thousands of closed connections ahead of
	// them first, so they get more than roundTrip's five seconds.
	for i, c := range waiting {
		if c == nil {
			continue
		}
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		msg := []byte("flooded")
		got := make([]byte, len(hello)+len(msg))
		want := string(hello) + string(msg) // the echo of hello, then msg's
		if _, err := c.Write(msg); err != nil {
			t.Errorf("client waiting in the backlog (%d of the last 20): write: %v", i, err)
		} else if _, err := io.ReadFull(c, got); err != nil || string(got) != want {
			t.Errorf("client waiting in the backlog (%d of the last 20): got %q, %v; want %q", i, got, err, want)
		}
		_ = c.Close()
	}
	waitFor(t, "connections_active to return to 0", func() bool {
		_, page := httpGet(d.healthBase + "/metrics")
		return exhMetric(page, "extractedprism_connections_active") == 0
	})
	if err := roundTrip(dialProxy(t, d.proxyAddr), []byte("after the flood")); err != nil {
		t.Errorf("proxied connection after the flood: %v", err)
	}
	t.Logf("flood of %d clients (bound %d, backlog %d) dialed in %v; %d descriptors open of %d; health server asked %d times, %d failed, slowest %v",
		flood, bound, somaxconn, dialed.Round(time.Millisecond), fds, limit, asked, failed, worst.Round(time.Millisecond))
}
