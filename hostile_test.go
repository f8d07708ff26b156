package main

// Hostile input: clients of the health server that send slowly, too much or
// nonsense, and upstreams that answer the readyz probe badly on purpose.
// Every case must end within a bound and leave no goroutine, descriptor or
// memory behind.

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// hostileHealthServer starts the real health server (newHealthHandler,
// newHealthServer, serveHealth) with the daemon's metrics on 127.0.0.1:0.
// adjust may shorten its timeouts.
func hostileHealthServer(t *testing.T, adjust func(*http.Server)) *testHealthServer {
	t.Helper()
	reg := prometheus.NewRegistry()
	m := newMetrics(reg)
	m.healthStatus.WithLabelValues("10.0.0.1:6443").Set(1)
	m.connectionsTotal.Add(7)
	handler := newHealthHandler(newHeartbeat(time.Hour).alive, func() bool { return true }, reg)
	return startHealthServer(t, handler, adjust)
}

// hostileExchange sends raw on a new connection to addr and reads one
// response, all within timeout.
func hostileExchange(addr, raw string, timeout time.Duration) (*http.Response, string, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(c, raw); err != nil {
		return nil, "", fmt.Errorf("write: %w", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return nil, "", fmt.Errorf("read response: %w", err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return resp, string(body), fmt.Errorf("read body: %w", err)
	}
	return resp, string(body), nil
}

// procOpenFDs counts this process's open descriptors.
func procOpenFDs(t testing.TB) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("cannot count descriptors: %v", err)
	}
	return len(entries)
}

// settleCounts polls until goroutines and descriptors are back to at most
// the given baseline plus slack, or 10 s pass; it returns the last counts.
// Each poll collects garbage first: net keeps splice pipes in a pool whose
// descriptors are closed only when the pool is collected.
func settleCounts(t testing.TB, goroutines, fds, slack int) (int, int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		runtime.GC()
		g, f := runtime.NumGoroutine(), procOpenFDs(t)
		if (g <= goroutines+slack && f <= fds+slack) || time.Now().After(deadline) {
			return g, f
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// quietCounts returns goroutines and descriptors once pooled descriptors
// have been collected and the counts hold still for a moment, or after 2 s.
func quietCounts(t testing.TB) (int, int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	lastG, lastF, same := -1, -1, 0
	for {
		runtime.GC()
		g, f := runtime.NumGoroutine(), procOpenFDs(t)
		if g == lastG && f == lastF {
			same++
		} else {
			same = 0
		}
		if same >= 3 || time.Now().After(deadline) {
			return g, f
		}
		lastG, lastF = g, f
		time.Sleep(20 * time.Millisecond)
	}
}

// liveHeapBytes returns the live heap after a collection.
func liveHeapBytes() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func TestHostileSlowHeaders(t *testing.T) {
	const readHeaderTimeout = 300 * time.Millisecond
	srv := hostileHealthServer(t, func(s *http.Server) { s.ReadHeaderTimeout = readHeaderTimeout })

	// Each slow client sends a byte every 20 ms and never ends its
	// headers; the server must cut every one of them at ReadHeaderTimeout,
	// however steadily they trickle.
	const slowClients = 50
	var wg sync.WaitGroup
	lifetimes := make(chan time.Duration, slowClients)
	for range slowClients {
		wg.Go(func() { lifetimes <- hostileTrickle(t, srv.addr, 5*time.Second) })
	}
	// Meanwhile an honest probe is answered at once.
	client := newTestClient(t)
	for range 10 {
		start := time.Now()
		if code, _, _ := do(t, client, http.MethodGet, srv.url+"/healthz"); code != http.StatusOK {
			t.Errorf("/healthz during slowloris: got %d; want %d", code, http.StatusOK)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("/healthz during slowloris took %v; want under 1s", d)
		}
		time.Sleep(30 * time.Millisecond)
	}
	wg.Wait()
	close(lifetimes)
	for d := range lifetimes {
		if d < readHeaderTimeout/2 || d > readHeaderTimeout+2*time.Second {
			t.Errorf("slow client cut off after %v; want about ReadHeaderTimeout %v", d, readHeaderTimeout)
		}
	}
}

// hostileTrickle opens a connection, starts a request and then sends one
// header byte every 20 ms until the server closes the connection or limit
// passes. It returns how long the connection lived.
func hostileTrickle(t *testing.T, addr string, limit time.Duration) time.Duration {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Error(err)
		return 0
	}
	defer c.Close()
	start := time.Now()
	_ = c.SetDeadline(start.Add(limit))
	closed := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, c) // ends when the server closes
		close(closed)
	}()
	_, _ = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: test\r\nX-Slow: ")
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-closed:
			return time.Since(start)
		case <-tick.C:
			_, _ = c.Write([]byte{'a'})
		}
	}
}

// TestHostileEndlessHeader: a client streaming headers without end is
// answered 431 and cut off after the limit: the server never buffers what
// follows.
func TestHostileEndlessHeader(t *testing.T) {
	srv := hostileHealthServer(t, nil)
	c, err := net.DialTimeout("tcp", srv.addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	var sent atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		_, _ = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: t\r\nX-Endless: ")
		chunk := []byte(strings.Repeat("z", 32<<10))
		for sent.Load() < 256<<20 {
			n, err := c.Write(chunk)
			sent.Add(int64(n))
			if err != nil {
				return
			}
		}
	})
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("status: got %d; want %d", resp.StatusCode, http.StatusRequestHeaderFieldsTooLarge)
	}
	wg.Wait() // the server's reset ends the writer
	// Socket buffers take some megabytes; a server that read on
	// would take all 256 MiB.
	if n := sent.Load(); n >= 256<<20 {
		t.Errorf("client wrote %d bytes of header; want the server to reset the connection long before", n)
	}
}

// TestHostileManyConcurrentRequests sends 500 honest requests at once, each
// on a new connection, to a server capped at healthMaxConns connections.
// The cap never makes a connection wait for a slot (a waiting accept loop
// starved the kubelet's probes), so the excess is closed: every request
// ends promptly, with a correct answer or a closed connection; at least a
// capful is answered; every closing is counted; and the server answers as
// usual right after.
func TestHostileManyConcurrentRequests(t *testing.T) {
	srv := hostileHealthServer(t, nil)
	const requests = 500
	const prompt = 5 * time.Second // a request, answered or not; the client gives up after 10 s
	paths := []string{"/healthz", "/readyz", "/metrics"}
	type result struct {
		path    string
		code    int
		body    string
		err     error
		elapsed time.Duration
	}
	results := make(chan result, requests)
	// A new connection per request, as the kubelet makes: Transport
	// retries a request only on a connection it reused, so each closing
	// reaches the client as an error.
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 2 * prompt}
	start := time.Now()
	var wg sync.WaitGroup
	for i := range requests {
		wg.Go(func() {
			r := result{path: paths[i%len(paths)]}
			began := time.Now()
			resp, err := client.Get(srv.url + r.path)
			if err == nil {
				var body []byte
				body, err = io.ReadAll(resp.Body)
				resp.Body.Close()
				r.code, r.body = resp.StatusCode, string(body)
			}
			r.err, r.elapsed = err, time.Since(began)
			results <- r
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(results)
	answered, closed, metricsOK, metricsBusy := 0, 0, 0, 0
	for r := range results {
		if r.elapsed > prompt {
			t.Errorf("GET %s ended after %v (%v); want within %v", r.path, r.elapsed, r.err, prompt)
		}
		switch {
		case r.err != nil && connClosed(r.err):
			closed++
		case r.err != nil:
			t.Errorf("GET %s: got %v; want an answer or a closed connection", r.path, r.err)
		case r.path == "/metrics" && r.code == http.StatusServiceUnavailable:
			answered++
			metricsBusy++ // MaxRequestsInFlight turned it away, as designed
		case r.path == "/metrics" && r.code == http.StatusOK && strings.Contains(r.body, "extractedprism_connections_total 7\n"):
			answered++
			metricsOK++
		case r.path != "/metrics" && r.code == http.StatusOK && r.body == "ok\n":
			answered++
		default:
			t.Errorf("GET %s: got %d %.40q; want a correct answer", r.path, r.code, r.body)
		}
	}
	if answered < healthMaxConns {
		t.Errorf("answered: got %d of %d; want at least healthMaxConns (%d)", answered, requests, healthMaxConns)
	}
	if metricsOK == 0 {
		t.Errorf("/metrics answered 200 to none of %d concurrent scrapes; want some", requests/len(paths))
	}
	counted := 0
	for _, reason := range []string{"stalled", "waiting", "busy", "new"} {
		counted += int(testutil.ToFloat64(srv.m.healthConnsClosed.WithLabelValues(reason)))
	}
	if counted != closed {
		t.Errorf("health_connections_closed_total: got %d; want the %d connections the clients saw closed", counted, closed)
	}
	t.Logf("%d concurrent requests in %v: %d answered (/metrics turned away %d with 503), %d closed at the cap (%d counted)",
		requests, elapsed, answered, metricsBusy, closed, counted)

	// Right after, a probe is answered as usual.
	if code, _, body := do(t, client, http.MethodGet, srv.url+"/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz right after: got %d %q; want 200 \"ok\\n\"", code, body)
	}

	// Pipelined requests on one connection are all answered, in order.
	const pipelined = 200
	k := dialKeepAlive(t, srv.addr)
	_ = k.c.SetDeadline(time.Now().Add(10 * time.Second))
	go func() {
		_, _ = io.WriteString(k.c, strings.Repeat("GET /readyz HTTP/1.1\r\nHost: t\r\n\r\n", pipelined))
	}()
	for i := range pipelined {
		resp, err := http.ReadResponse(k.br, nil)
		if err != nil {
			t.Fatalf("pipelined response %d: %v", i, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(body) != "ok\n" {
			t.Fatalf("pipelined response %d: got %d %q; want 200 \"ok\\n\"", i, resp.StatusCode, body)
		}
	}
}

// connClosed reports whether err is what a client sees of a connection
// closed before its answer: end of file, a reset or a broken pipe, not a
// timeout. http.Transport says "server closed idle connection" when the
// close came before it had sent the request, even on a new connection.
func connClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		strings.Contains(err.Error(), "server closed idle connection")
}

// TestHostileOddRequests sends odd methods, malformed requests and headers
// past the limit: each is answered with the status a careful server gives,
// and none echoes the request. net/http allows MaxHeaderBytes plus 4096
// bytes of slack; 16 KiB is past both, yet small next to the 1 MiB default
// the limit replaces.
func TestHostileOddRequests(t *testing.T) {
	srv := hostileHealthServer(t, nil)
	const secret = "Bearer s3cr3t-t0k3n"
	tests := []struct {
		name    string
		request string
		want    []int
	}{
		{"TRACE", "TRACE /healthz HTTP/1.1\r\nHost: t\r\nAuthorization: " + secret + "\r\n\r\n", []int{405}},
		{"TRACE metrics", "TRACE /metrics HTTP/1.1\r\nHost: t\r\nAuthorization: " + secret + "\r\n\r\n", []int{405}},
		{"CONNECT to a path", "CONNECT /healthz HTTP/1.1\r\nHost: t\r\n\r\n", []int{405}},
		{"CONNECT to an authority", "CONNECT 10.0.0.1:6443 HTTP/1.1\r\nHost: 10.0.0.1:6443\r\n\r\n", []int{400, 404, 405}},
		{"lower-case get", "get /healthz HTTP/1.1\r\nHost: t\r\n\r\n", []int{405}},
		{"unknown token", "BREW /healthz HTTP/1.1\r\nHost: t\r\n\r\n", []int{405}},
		{"long token", strings.Repeat("X", 4000) + " /healthz HTTP/1.1\r\nHost: t\r\n\r\n", []int{405}},
		{"separator in method", "G@T /healthz HTTP/1.1\r\nHost: t\r\n\r\n", []int{400}},
		{"control byte in method", "GET\x7f /healthz HTTP/1.1\r\nHost: t\r\n\r\n", []int{400}},
		{"non-ASCII method", "GÉT /healthz HTTP/1.1\r\nHost: t\r\n\r\n", []int{400}},
		{"empty method", " /healthz HTTP/1.1\r\nHost: t\r\n\r\n", []int{400}},
		{"HTTP/0.9 request line", "GET /healthz\r\n\r\n", []int{400}},
		{"unknown version", "GET /healthz HTTP/9.9\r\nHost: t\r\n\r\n", []int{400, 505}},
		{"HTTP/2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", []int{400, 505}},
		{"HTTP/1.1 without Host", "GET /healthz HTTP/1.1\r\n\r\n", []int{400}},
		{"NUL in header value", "GET /healthz HTTP/1.1\r\nHost: t\r\nX-A: a\x00b\r\n\r\n", []int{400}},
		// RFC 9112 section 6.3 lets a server either reject this or let
		// Transfer-Encoding win; net/http does the latter.
		{"Content-Length with Transfer-Encoding", "POST /healthz HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", []int{400, 405}},
		{"conflicting Content-Length", "POST /healthz HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", []int{400}},
		{"POST with a body", "POST /healthz HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello", []int{405}},
		{"ordinary headers of 4 KiB", "GET /healthz HTTP/1.1\r\nHost: t\r\nX-A: " + strings.Repeat("a", 4<<10) + "\r\n\r\n", []int{200}},
		{"one 16 KiB header", "GET /healthz HTTP/1.1\r\nHost: t\r\nX-A: " + strings.Repeat("a", 16<<10) + "\r\n\r\n", []int{431}},
		{"2000 small headers", "GET /healthz HTTP/1.1\r\nHost: t\r\n" + strings.Repeat("X-B: b\r\n", 2000) + "\r\n", []int{431}},
		{"16 KiB request line", "GET /healthz?" + strings.Repeat("q", 16<<10) + " HTTP/1.1\r\nHost: t\r\n\r\n", []int{431}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			resp, body, err := hostileExchange(srv.addr, tt.request, 3*time.Second) //nolint:bodyclose // hostileExchange read and closed it
			if err != nil {
				t.Fatalf("got %v after %v; want an answer", err, time.Since(start))
			}
			if !slices.Contains(tt.want, resp.StatusCode) {
				t.Errorf("status: got %d; want one of %v", resp.StatusCode, tt.want)
			}
			// TRACE that echoed the request would hand a credential to a
			// script that can send TRACE but not read headers.
			if strings.Contains(body, "s3cr3t") {
				t.Errorf("body echoes the request's credential: %q", body)
			}
		})
	}
}

func TestHostileHealthServerBoundedResources(t *testing.T) {
	srv := hostileHealthServer(t, func(s *http.Server) { s.ReadHeaderTimeout = 200 * time.Millisecond })
	// Warm up once, so lazily built state (the metrics page, TLS-free
	// server internals) is in the baseline.
	//nolint:bodyclose // hostileExchange read and closed it
	if resp, _, err := hostileExchange(srv.addr, "GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n", 5*time.Second); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("warm-up: got %v, %v; want 200", resp, err)
	}
	goroutines, fds := quietCounts(t)
	heap := liveHeapBytes()

	start := time.Now()
	hostile := []string{
		"GET /healthz HTTP/1.1\r\nHost: t\r\nX-A: " + strings.Repeat("a", 64<<10) + "\r\n\r\n",
		"GET /healthz HTTP/1.1\r\nHost: t\r\n" + strings.Repeat("X-B: b\r\n", 4000) + "\r\n",
		"TRACE /metrics HTTP/1.1\r\nHost: t\r\n\r\n",
		"G@T / HTTP/1.1\r\n\r\n",
		"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Never-Ends: ", // cut by ReadHeaderTimeout
		"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n",
	}
	const rounds, perRound = 10, 60
	var failures atomic.Int64
	for range rounds {
		var wg sync.WaitGroup
		for i := range perRound {
			wg.Go(func() {
				// Every request gets an answer or a closed connection
				// within the bound; the timeout case is a client error.
				if _, _, err := hostileExchange(srv.addr, hostile[i%len(hostile)], 3*time.Second); err != nil { //nolint:bodyclose // hostileExchange read and closed it
					if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
						failures.Add(1)
					}
				}
			})
		}
		wg.Wait()
	}
	elapsed := time.Since(start)
	if n := failures.Load(); n > 0 {
		t.Errorf("%d hostile requests were neither answered nor closed within 3s; want 0", n)
	}
	if elapsed > 30*time.Second {
		t.Errorf("%d hostile requests took %v; want under 30s", rounds*perRound, elapsed)
	}
	g, f := settleCounts(t, goroutines, fds, 0)
	if g > goroutines || f > fds {
		t.Errorf("after %d hostile requests: goroutines %d, descriptors %d; want at most the baseline %d, %d",
			rounds*perRound, g, f, goroutines, fds)
	}
	// Generous: the race detector and the GC's own pacing move the heap by
	// a few megabytes; a leak of each hostile request's headers would be
	// far more.
	if after := liveHeapBytes(); after > heap+8<<20 {
		t.Errorf("live heap after %d hostile requests: got %d bytes; want at most %d (baseline + 8 MiB)",
			rounds*perRound, after, heap+8<<20)
	}
	t.Logf("%d hostile requests in %v", rounds*perRound, elapsed)
}

// hostileUpstream serves handle on 127.0.0.1:0 (startUpstream); with a
// certificate, handle gets the connection after the TLS handshake.
func hostileUpstream(t *testing.T, cert *tls.Certificate, handle func(net.Conn)) *testUpstream {
	if cert == nil {
		return startUpstream(t, handle)
	}
	return startUpstream(t, func(c net.Conn) {
		tc := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{*cert}})
		_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
		if tc.Handshake() == nil {
			_ = tc.SetDeadline(time.Time{})
			handle(tc)
		}
	})
}

// hostileReadRequest reads up to the end of a request's headers.
func hostileReadRequest(c net.Conn) {
	_, _ = http.ReadRequest(bufio.NewReader(c))
}

// hostileFlood answers a request with head, then chunk until the
// connection fails.
func hostileFlood(head string, chunk []byte) func(net.Conn) {
	return func(c net.Conn) {
		hostileReadRequest(c)
		_, _ = io.WriteString(c, head)
		for {
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	}
}

// TestHostileReadyzUpstreams runs the readyz probe against upstreams that
// answer badly on purpose, concurrently and in rounds: each check ends by
// its deadline with the right verdict, leaves nothing behind, follows no
// redirect and reads a bounded amount. The plain cases (a silent upstream,
// an expired certificate or wrong name, a 500) are in readyz_test.go.
func TestHostileReadyzUpstreams(t *testing.T) {
	pki := rzNewPKI(t)
	now := time.Now()
	good := pki.serving.pair
	notYet := pki.ca.serving(t, now.Add(24*time.Hour), now.Add(48*time.Hour)).pair

	// A 200 that the probe must never reach by following a redirect.
	answer := func(response string) func(net.Conn) {
		return func(c net.Conn) {
			hostileReadRequest(c)
			_, _ = io.WriteString(c, response)
		}
	}
	const ok = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
	target := hostileUpstream(t, &good, answer(ok))
	tests := []struct {
		name    string
		cert    *tls.Certificate
		handle  func(net.Conn)
		bounded bool // what the probe reads is counted and bounded
		ready   bool // the probe passes: only a 200 may
	}{
		{name: "closes at once", handle: func(net.Conn) {}},
		{name: "resets at once", handle: func(c net.Conn) { _ = c.(*net.TCPConn).SetLinger(0) }},
		{name: "plain HTTP 200 instead of TLS", handle: answer(ok)},
		{name: "certificate not yet valid", cert: &notYet, handle: answer(ok)},
		{name: "handshake, then silence", cert: &good, handle: func(c net.Conn) { _, _ = io.Copy(io.Discard, c) }},
		{name: "status line a byte at a time", cert: &good, handle: func(c net.Conn) {
			hostileReadRequest(c)
			for _, b := range []byte(ok) {
				if _, err := c.Write([]byte{b}); err != nil {
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		}},
		{name: "endless headers", cert: &good, bounded: true, handle: hostileFlood("HTTP/1.1 200 OK\r\n",
			[]byte(strings.Repeat("X-Junk: "+strings.Repeat("j", 1000)+"\r\n", 16)))},
		{name: "endless status line", cert: &good, bounded: true, handle: hostileFlood("HTTP/1.1 200 ",
			[]byte(strings.Repeat("O", 16<<10)))},
		{name: "500 with a gigantic body", cert: &good, bounded: true, handle: hostileFlood(
			"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 1073741824\r\n\r\n", make([]byte, 32<<10))},
		{name: "redirect to a ready server", cert: &good, handle: answer(
			"HTTP/1.1 302 Found\r\nLocation: https://" + target.addr + "/readyz\r\nContent-Length: 0\r\n\r\n")},
		{name: "permanent redirect", cert: &good, handle: answer(
			"HTTP/1.1 308 Permanent Redirect\r\nLocation: https://" + target.addr + "/readyz\r\nContent-Length: 0\r\n\r\n")},
		// Only the status is judged: a 200 with a gigantic body is ready,
		// and reading it is bounded like everything else.
		{name: "200 with a gigantic body", cert: &good, bounded: true, ready: true, handle: hostileFlood(
			"HTTP/1.1 200 OK\r\nContent-Length: 1073741824\r\n\r\n", make([]byte, 32<<10))},
		{name: "200 with an endless chunked body", cert: &good, bounded: true, ready: true, handle: hostileFlood(
			"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", []byte("4000\r\n"+strings.Repeat("c", 0x4000)+"\r\n"))},
	}
	servers := make([]*testUpstream, len(tests))
	for i, tt := range tests {
		servers[i] = hostileUpstream(t, tt.cert, tt.handle)
	}
	probe := pki.probe()
	// Long enough for a TLS handshake on a loaded CI machine (400 ms
	// flaked there), short enough to keep the silent cases quick.
	const deadline = 1500 * time.Millisecond

	runRound := func(t *testing.T) {
		var wg sync.WaitGroup
		for i, tt := range tests {
			wg.Go(func() {
				res, elapsed := rzCheck(probe, servers[i].addr, deadline)
				// An upstream that resets at once may fail the connect
				// itself rather than the probe; either way it fails.
				if got := res.err == nil && res.probed && res.notReady == nil; got != tt.ready {
					t.Errorf("%s: ready got %v (connect error %v, probed %v, probe error %v); want %v",
						tt.name, got, res.err, res.probed, res.notReady, tt.ready)
				}
				if elapsed > deadline+500*time.Millisecond {
					t.Errorf("%s: check took %v; want at most the %v deadline and a margin", tt.name, elapsed, deadline)
				}
			})
		}
		wg.Wait()
	}
	runRound(t) // warm-up: TLS and HTTP internals are in the baseline after it
	if t.Failed() {
		return
	}
	goroutines, fds := quietCounts(t)
	const rounds = 2 // a check that leaks shows in the first; the second shows it growing
	for range rounds {
		runRound(t)
	}
	// The servers' handlers end once the probe's reset reaches them.
	g, f := settleCounts(t, goroutines, fds, 0)
	if g > goroutines || f > fds {
		t.Errorf("after %d rounds of hostile probes: goroutines %d, descriptors %d; want at most the baseline %d, %d",
			rounds, g, f, goroutines, fds)
	}
	if n := target.acceptedCount(); n != 0 {
		t.Errorf("redirect target accepted %d connections; want 0 (redirects are not followed)", n)
	}

	// What the probe reads is bounded, whatever the upstream sends: probe,
	// not check, so the test can count it; runRound judged the verdicts.
	for i, tt := range tests {
		if !tt.bounded {
			continue
		}
		raw, err := net.DialTimeout("tcp", servers[i].addr, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		cc := &rzCountingConn{Conn: raw}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = rzProbe(ctx, probe, servers[i].addr, cc)
		cancel()
		closeAbortive(raw)
		if n := cc.read.Load(); n > 2*maxReadyzResponse {
			t.Errorf("%s: probe read %d bytes; want at most %d", tt.name, n, 2*maxReadyzResponse)
		}
	}
}
