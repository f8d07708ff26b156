package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestHeartbeatAlive(t *testing.T) {
	const threshold = 15 * time.Second
	tests := []struct {
		name       string
		steps      func(h *heartbeat)
		wantAlive  bool
		wantReason string // substring; "" means the reason must be empty
	}{
		{name: "fresh", steps: func(*heartbeat) {}, wantAlive: true},
		{name: "silent for exactly the threshold", steps: func(*heartbeat) { time.Sleep(threshold) }, wantAlive: true},
		{name: "silent just past the threshold", steps: func(*heartbeat) { time.Sleep(threshold + time.Nanosecond) }, wantReason: "no heartbeat for 15.000000001s"},
		{
			name: "beat revives",
			steps: func(h *heartbeat) {
				time.Sleep(2 * threshold)
				h.beat()
			},
			wantAlive: true,
		},
		{
			name: "beats keep it alive",
			steps: func(h *heartbeat) {
				for range 10 {
					time.Sleep(threshold - time.Second)
					h.beat()
				}
				time.Sleep(threshold)
			},
			wantAlive: true,
		},
		{
			name: "silent past the threshold after a beat",
			steps: func(h *heartbeat) {
				time.Sleep(threshold - time.Second)
				h.beat()
				time.Sleep(threshold + time.Nanosecond)
			},
			wantReason: "no heartbeat",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHeartbeat(threshold)
				tt.steps(h)
				alive, reason := h.alive()
				if alive != tt.wantAlive {
					t.Errorf("alive: got %v; want %v", alive, tt.wantAlive)
				}
				if tt.wantReason == "" && reason != "" {
					t.Errorf("reason: got %q; want empty", reason)
				}
				if !strings.Contains(reason, tt.wantReason) {
					t.Errorf("reason: got %q; want it to contain %q", reason, tt.wantReason)
				}
			})
		})
	}
}

// TestHeartbeatConcurrent lets the race detector check that beat and alive
// need no lock.
func TestHeartbeatConcurrent(t *testing.T) {
	h := newHeartbeat(time.Hour)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 1000 {
				h.beat()
				h.alive()
			}
		})
	}
	wg.Wait()
	if alive, reason := h.alive(); !alive {
		t.Errorf("alive(): got %v, %q; want true", alive, reason)
	}
}

// TestHealthHandlerRoutes holds every path to the method rules of handleReadOnly
// and every other path to 404.
func TestHealthHandlerRoutes(t *testing.T) {
	reg := prometheus.NewRegistry()
	counter := prometheus.NewCounter(prometheus.CounterOpts{Name: "test_events_total", Help: "Test events."})
	reg.MustRegister(counter)
	counter.Add(3)
	handler := newHealthHandler(func() (bool, string) { return true, "" }, func() bool { return true }, reg)
	srv := startHealthServer(t, handler, nil)
	client := newTestClient(t)

	const allow = "GET, HEAD, OPTIONS"
	methods := []struct {
		method    string
		wantCode  int
		wantAllow string // "" means no Allow header
		wantBody  bool
	}{
		{http.MethodGet, http.StatusOK, "", true},
		{http.MethodHead, http.StatusOK, "", false},
		{http.MethodOptions, http.StatusNoContent, allow, false},
		{http.MethodPost, http.StatusMethodNotAllowed, allow, true},
		{http.MethodPut, http.StatusMethodNotAllowed, allow, true},
		{http.MethodDelete, http.StatusMethodNotAllowed, allow, true},
		{http.MethodPatch, http.StatusMethodNotAllowed, allow, true},
	}
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		for _, m := range methods {
			t.Run(m.method+" "+path, func(t *testing.T) {
				code, header, body := do(t, client, m.method, srv.url+path)
				if code != m.wantCode {
					t.Errorf("status: got %d; want %d", code, m.wantCode)
				}
				if got := header.Get("Allow"); got != m.wantAllow {
					t.Errorf("Allow: got %q; want %q", got, m.wantAllow)
				}
				if got := len(body) > 0; got != m.wantBody {
					t.Errorf("body present: got %v; want %v (body %q)", got, m.wantBody, body)
				}
				if m.method == http.MethodGet && path == "/metrics" && !strings.Contains(body, "\ntest_events_total 3\n") {
					t.Errorf("body: got %q; want the counter's value", body)
				}
			})
		}
	}
	for _, r := range []string{"GET /", "GET /healthz/", "GET /healthzz", "GET /readyz/extra", "GET /HEALTHZ", "POST /nope", "OPTIONS /nope"} {
		method, path, _ := strings.Cut(r, " ")
		if code, _, _ := do(t, client, method, srv.url+path); code != http.StatusNotFound {
			t.Errorf("%s: got %d; want %d", r, code, http.StatusNotFound)
		}
	}
}

// TestProbesFollowState: /healthz and /readyz each follow their own check
// alone, 200 "ok" or 503 with the reason, HEAD without a body.
func TestProbesFollowState(t *testing.T) {
	var failure atomic.Pointer[string]
	var ready atomic.Bool
	live := func() (bool, string) {
		if r := failure.Load(); r != nil {
			return false, *r
		}
		return true, ""
	}
	srv := startHealthServer(t, newHealthHandler(live, ready.Load, prometheus.NewRegistry()), nil)
	client := newTestClient(t)

	const failed, notReady = "no heartbeat for 20s\n", "no healthy upstream\n"
	steps := []struct {
		fail         string // the liveness failure; "" means live
		ready        bool
		method, path string
		wantCode     int
		wantBody     string
	}{
		{"", false, http.MethodGet, "/healthz", http.StatusOK, "ok\n"},
		{"", false, http.MethodHead, "/healthz", http.StatusOK, ""},
		{"", false, http.MethodGet, "/readyz", http.StatusServiceUnavailable, notReady},
		{"", true, http.MethodGet, "/readyz", http.StatusOK, "ok\n"},
		{"no heartbeat for 20s", true, http.MethodGet, "/healthz", http.StatusServiceUnavailable, failed},
		{"no heartbeat for 20s", true, http.MethodHead, "/healthz", http.StatusServiceUnavailable, ""},
		{"no heartbeat for 20s", true, http.MethodGet, "/readyz", http.StatusOK, "ok\n"},
		{"no heartbeat for 20s", false, http.MethodGet, "/readyz", http.StatusServiceUnavailable, notReady},
		{"no heartbeat for 20s", false, http.MethodHead, "/readyz", http.StatusServiceUnavailable, ""},
		{"", false, http.MethodGet, "/healthz", http.StatusOK, "ok\n"},
	}
	for i, s := range steps {
		failure.Store(nil)
		if s.fail != "" {
			failure.Store(&s.fail)
		}
		ready.Store(s.ready)
		code, _, body := do(t, client, s.method, srv.url+s.path)
		if code != s.wantCode || body != s.wantBody {
			t.Errorf("step %d, %s %s (failure %q, ready %v): got %d %q; want %d %q",
				i, s.method, s.path, s.fail, s.ready, code, body, s.wantCode, s.wantBody)
		}
	}
}

// brokenCollector yields a metric that fails to gather.
type brokenCollector struct{ desc *prometheus.Desc }

func (c brokenCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c brokenCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.NewInvalidMetric(c.desc, errors.New("collector broke"))
}

// A broken collector next to a good metric fails the scrape rather than
// serve a partial page.
func TestMetricsGatheringErrorFailsScrape(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		prometheus.NewCounter(prometheus.CounterOpts{Name: "test_good_total", Help: "Test."}),
		brokenCollector{prometheus.NewDesc("test_broken", "Broken.", nil, nil)},
	)
	srv := startHealthServer(t, newHealthHandler(func() (bool, string) { return true, "" }, func() bool { return true }, reg), nil)
	code, _, body := do(t, newTestClient(t), http.MethodGet, srv.url+"/metrics")
	if code != http.StatusInternalServerError || !strings.Contains(body, "collector broke") {
		t.Errorf("got %d %q; want %d with the gathering error", code, body, http.StatusInternalServerError)
	}
}

func TestNewHealthServerLimits(t *testing.T) {
	srv := newHealthServer("127.0.0.1:7446", http.NotFoundHandler(), slog.New(slog.DiscardHandler), newMetrics(prometheus.NewRegistry()))
	// The slow-client tests shorten these to run quickly, so this is where
	// the daemon's own values are checked.
	for name, d := range map[string][2]time.Duration{
		"ReadHeaderTimeout": {srv.ReadHeaderTimeout, 5 * time.Second},
		"ReadTimeout":       {srv.ReadTimeout, 10 * time.Second},
		"WriteTimeout":      {srv.WriteTimeout, 15 * time.Second},
		"IdleTimeout":       {srv.IdleTimeout, 90 * time.Second},
	} {
		if d[0] != d[1] || d[0] <= 0 {
			t.Errorf("%s: got %v; want %v, positive", name, d[0], d[1])
		}
	}
	if srv.ReadHeaderTimeout > srv.ReadTimeout {
		t.Errorf("ReadHeaderTimeout: got %v; want at most ReadTimeout %v", srv.ReadHeaderTimeout, srv.ReadTimeout)
	}
	if srv.MaxHeaderBytes <= 0 || srv.MaxHeaderBytes >= http.DefaultMaxHeaderBytes {
		t.Errorf("MaxHeaderBytes: got %d; want in (0, %d)", srv.MaxHeaderBytes, http.DefaultMaxHeaderBytes)
	}
	if srv.Addr != "127.0.0.1:7446" {
		t.Errorf("Addr: got %q; want %q", srv.Addr, "127.0.0.1:7446")
	}
}

// net/http's own errors reach slog.
func TestHealthServerErrorLog(t *testing.T) {
	var buf lockedBuffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	panicky := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("handler bug") })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := serveHealthOn(t, ln, panicky, nil, log)

	// The server recovers the panic, logs it and drops the connection
	// without an answer.
	if resp, _, err := hostileExchange(srv.addr, "GET / HTTP/1.1\r\nHost: t\r\n\r\n", 5*time.Second); err == nil { //nolint:bodyclose // hostileExchange read and closed it
		t.Errorf("panicking handler: got %s; want the connection dropped", resp.Status)
	}
	if err := srv.stop(t); err != nil {
		t.Fatalf("serveHealth: got %v; want nil", err)
	}
	got := buf.String()
	for _, want := range []string{"level=WARN", "panic serving", "handler bug"} {
		if !strings.Contains(got, want) {
			t.Errorf("log: got %q; want it to contain %q", got, want)
		}
	}
}

func TestServeHealthShutdownWithIdleConnection(t *testing.T) {
	srv := startHealthServer(t, healthyHandler(), nil)
	// A keep-alive connection that has finished its requests and stays
	// open, as Prometheus leaves it between scrapes; the second request
	// shows it kept alive.
	k := dialKeepAlive(t, srv.addr)
	for range 2 {
		if code, err := k.get("/healthz"); err != nil || code != http.StatusOK {
			t.Fatalf("request on a kept-alive connection: got %d, %v; want %d", code, err, http.StatusOK)
		}
	}

	start := time.Now()
	if err := srv.stop(t); err != nil {
		t.Errorf("serveHealth: got %v; want nil", err)
	}
	if elapsed := time.Since(start); elapsed >= healthShutdownTimeout {
		t.Errorf("shutdown took: got %v; want less than %v", elapsed, healthShutdownTimeout)
	}

	// Shutdown closes idle connections instead of waiting for the client.
	if err := k.c.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if n, err := k.br.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("read after shutdown: got %d, %v; want 0, EOF", n, err)
	}
	if c, err := net.Dial("tcp", srv.addr); err == nil {
		c.Close()
		t.Error("dial after shutdown: got a connection; want the listener closed")
	}
}

func TestServeHealthReturnsServeError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	log := slog.New(slog.DiscardHandler)
	srv := newHealthServer(ln.Addr().String(), http.NotFoundHandler(), log, newMetrics(prometheus.NewRegistry()))
	err = serveHealth(t.Context(), srv, newSteadyListener(ln, log, "health server ", new(atomic.Int64)), log)
	if !errors.Is(err, net.ErrClosed) {
		t.Errorf("serveHealth: got %v; want an error wrapping %v", err, net.ErrClosed)
	}
}

// TestServeHealthForcesCloseAfterDeadline runs the server on in-memory
// connections inside a synctest bubble, so the five-second shutdown deadline
// passes without the test waiting for it.
func TestServeHealthForcesCloseAfterDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		entered := make(chan struct{})
		stuck := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
			close(entered)
			<-release
		})
		ln := newPipeListener()
		stop := servePipe(t, ln, stuck, slog.New(slog.DiscardHandler))
		conn := ln.dial()
		defer conn.Close()
		if _, err := io.WriteString(conn, "GET /stuck HTTP/1.1\r\nHost: test\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		<-entered

		start := time.Now()
		err := stop()
		elapsed := time.Since(start)
		if err != nil {
			t.Errorf("serveHealth: got %v; want nil", err)
		}
		if elapsed < healthShutdownTimeout || elapsed > healthShutdownTimeout+time.Second {
			t.Errorf("serveHealth returned after: got %v; want about %v", elapsed, healthShutdownTimeout)
		}
		if n, err := conn.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Errorf("read from the stuck connection: got %d, %v; want 0, EOF", n, err)
		}
		close(release)
	})
}

// TestServeHealthSurvivesAcceptErrors makes Accept fail with ENOMEM, which
// net/http does not retry on its own, and checks that the server backs off,
// serves again, and logs the episode once at its start and once at its end.
func TestServeHealthSurvivesAcceptErrors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf lockedBuffer
		log := slog.New(slog.NewTextHandler(&buf, nil))
		ln := &failingListener{pipeListener: newPipeListener()}
		ln.failures.Store(5)
		start := time.Now()
		stop := servePipe(t, ln, healthyHandler(), log)
		conn := ln.dial()
		defer conn.Close()
		k := &keepAliveConn{c: conn, br: bufio.NewReader(conn)}
		if code, err := k.get("/healthz"); err != nil || code != http.StatusOK {
			t.Fatalf("after failed accepts: got %d, %v; want %d", code, err, http.StatusOK)
		}
		// Five failures back off 5, 10, 20, 40 and 80 ms before the
		// accept that works.
		if got, want := time.Since(start), 155*time.Millisecond; got != want {
			t.Errorf("answered after %v of backoff; want %v", got, want)
		}
		if n := ln.failures.Load(); n > 0 {
			t.Errorf("accept failures left: got %d; want 0", n)
		}
		if err := stop(); err != nil {
			t.Errorf("serveHealth: got %v; want nil", err)
		}
		got := buf.String()
		for _, want := range []string{"health server accept failing", "health server accepting again"} {
			if n := strings.Count(got, want); n != 1 {
				t.Errorf("log lines with %q: got %d; want 1 in %q", want, n, got)
			}
		}
	})
}

// TestConnCap feeds the cap's ConnState hook the state reports net/http
// makes, on in-memory connections and a cap of two, 10 ms apart unless a
// step waits. net/http reports StateNew on accept, StateActive once a
// request's headers are read, StateIdle once its reply is out, and
// StateClosed or StateHijacked at the end, also for a connection the cap
// closed.
func TestConnCap(t *testing.T) {
	type report struct {
		conn  string // "" for a wait past healthStallAfter
		state http.ConnState
	}
	var (
		aNew, bNew, cNew, dNew, eNew = report{"a", http.StateNew}, report{"b", http.StateNew}, report{"c", http.StateNew}, report{"d", http.StateNew}, report{"e", http.StateNew}
		aActive, bActive             = report{"a", http.StateActive}, report{"b", http.StateActive}
		aIdle, bIdle                 = report{"a", http.StateIdle}, report{"b", http.StateIdle}
		aClosed, bClosed, cClosed    = report{"a", http.StateClosed}, report{"b", http.StateClosed}, report{"c", http.StateClosed}
		bHijacked                    = report{"b", http.StateHijacked}
		stall                        = report{}
	)
	// Every case ends with the cap full: two connections counted.
	tests := []struct {
		name                                     string
		reports                                  []report
		wantClosed                               []string // by the cap, sorted; a name twice if closed twice
		wantStalled, wantIdle, wantBusy, wantNew float64  // health_connections_closed_total by reason
	}{
		{"below the cap nothing is closed", []report{aNew, bNew}, nil, 0, 0, 0, 0},
		{"unread ones stay, the new one is closed", []report{aNew, bNew, cNew}, []string{"c"}, 0, 0, 0, 1},
		{"an idle one goes", []report{aNew, bNew, bActive, bIdle, cNew}, []string{"b"}, 0, 1, 0, 0},
		{"the longest idle goes first", []report{aNew, aActive, aIdle, bNew, bActive, bIdle, cNew}, []string{"a"}, 0, 1, 0, 0},
		{"one inside its first request stays", []report{aNew, aActive, bNew, bActive, cNew}, []string{"c"}, 0, 0, 0, 1},
		{"one inside a later request goes, the longest first",
			[]report{aNew, aActive, aIdle, aActive, bNew, bActive, bIdle, bActive, cNew}, []string{"a"}, 0, 0, 1, 0},
		{"one inside a request for over a second goes before an idle one", []report{aNew, aActive, bNew, bActive, bIdle, stall, cNew}, []string{"a"}, 1, 0, 0, 0},
		{"one unread for over a second goes before an idle one", []report{aNew, stall, bNew, bActive, bIdle, cNew}, []string{"a"}, 1, 0, 0, 0},
		{"the longest stalled goes first", []report{aNew, aActive, bNew, stall, cNew}, []string{"a"}, 1, 0, 0, 0},
		{"a closed or hijacked connection frees its slot", []report{aNew, bNew, aClosed, bHijacked, cNew, dNew}, nil, 0, 0, 0, 0},
		{"a connection the cap closed stops counting at once", []report{aNew, bNew, bActive, bIdle, cNew, bClosed, dNew}, []string{"b", "d"}, 0, 1, 0, 1},
		// Its serving goroutine may have read part of a request when the
		// cap closed it, and reports StateActive, and an idle one may
		// report StateIdle, before StateClosed.
		{"the later reports of a connection the cap closed do not count it again",
			[]report{aNew, aActive, aIdle, bNew, cNew, aActive, aIdle, bClosed, cClosed, dNew, eNew, aClosed}, []string{"a"}, 0, 1, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				m := newMetrics(prometheus.NewRegistry())
				cc := newConnCap(2, slog.New(slog.DiscardHandler), m)
				conns := map[string]*closeRecorder{}
				for _, r := range tt.reports {
					if r.conn == "" {
						time.Sleep(healthStallAfter)
						continue
					}
					time.Sleep(10 * time.Millisecond)
					if conns[r.conn] == nil {
						conns[r.conn] = newCloseRecorder()
					}
					cc.track(conns[r.conn], r.state)
				}
				var closed []string
				for _, name := range slices.Sorted(maps.Keys(conns)) {
					for range conns[name].closes.Load() {
						closed = append(closed, name)
					}
				}
				if !slices.Equal(closed, tt.wantClosed) {
					t.Errorf("closed: got %q; want %q", closed, tt.wantClosed)
				}
				wantClosedAtCap(t, m, tt.wantStalled, tt.wantIdle, tt.wantBusy, tt.wantNew)
				cc.mu.Lock()
				defer cc.mu.Unlock()
				if got := len(cc.members); got != 2 {
					t.Errorf("connections counted: got %d; want 2", got)
				}
			})
		})
	}
}

// TestConnCapWarnsOncePerMinute closes a connection at the cap now and then
// for two minutes: the first closing is logged at once, the later ones at
// most once a minute, each line with the closings since the one before.
func TestConnCapWarnsOncePerMinute(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf lockedBuffer
		cc := newConnCap(1, slog.New(slog.NewTextHandler(&buf, nil)), newMetrics(prometheus.NewRegistry()))
		cc.track(newCloseRecorder(), http.StateNew) // at the cap from here on
		start := time.Now()
		steps := []struct {
			at        time.Duration // since start
			closings  int           // connections closed at the cap then
			wantLines []string      // the closed= fields logged so far
		}{
			{0, 1, []string{"closed=1"}},
			{warnEvery - time.Second, 2, []string{"closed=1"}},
			{warnEvery, 1, []string{"closed=1", "closed=3"}},
			{warnEvery + time.Second, 1, []string{"closed=1", "closed=3"}},
			{2 * warnEvery, 1, []string{"closed=1", "closed=3", "closed=2"}},
		}
		for _, s := range steps {
			time.Sleep(time.Until(start.Add(s.at)))
			for range s.closings {
				cc.track(newCloseRecorder(), http.StateNew)
			}
			var got []string
			for line := range strings.Lines(buf.String()) {
				if !strings.Contains(line, "level=WARN") || !strings.Contains(line, "health server at its connection limit") || !strings.Contains(line, "limit=1") {
					t.Errorf("log line: got %q; want a warning about the connection limit of 1", line)
				}
				for field := range strings.FieldsSeq(line) {
					if strings.HasPrefix(field, "closed=") {
						got = append(got, field)
					}
				}
			}
			if !slices.Equal(got, s.wantLines) {
				t.Errorf("at %v: got %q; want %q", s.at, got, s.wantLines)
			}
		}
	})
}

// slowCloser is a connection whose Close, once called, signals closing and
// waits for release.
type slowCloser struct {
	net.Conn
	closing, release chan struct{}
}

func (c *slowCloser) Close() error {
	close(c.closing)
	<-c.release
	return c.Conn.Close()
}

// TestConnCapClosesItsPickBeforeItsNextReport holds the cap in the Close of
// the connection it picked and meanwhile reports that connection inside a
// request, as its serving goroutine would once it has read one. The report
// must wait for the close: taken up before it, the request is served and
// then cut off, or answered on a connection counted as closed.
func TestConnCapClosesItsPickBeforeItsNextReport(t *testing.T) {
	cc := newConnCap(1, slog.New(slog.DiscardHandler), newMetrics(prometheus.NewRegistry()))
	server, _ := net.Pipe()
	pick := &slowCloser{Conn: server, closing: make(chan struct{}), release: make(chan struct{})}
	cc.track(pick, http.StateNew)
	cc.track(pick, http.StateActive)
	cc.track(pick, http.StateIdle) // so that the cap may close it
	var wg sync.WaitGroup
	wg.Go(func() { cc.track(newCloseRecorder(), http.StateNew) })
	select {
	case <-pick.closing:
	case <-time.After(5 * time.Second):
		t.Fatal("the cap did not close its pick")
	}
	reported := make(chan struct{})
	wg.Go(func() {
		cc.track(pick, http.StateActive)
		close(reported)
	})
	// Nothing is expected within the window: the report must wait.
	select {
	case <-reported:
		t.Error("StateActive of the connection being closed: got it taken up during the close; want it to wait for the close")
	case <-time.After(200 * time.Millisecond):
	}
	close(pick.release)
	wg.Wait()
}

// TestHealthServerCapClosesOldestIdle fills the real health server with
// twice its cap of keep-alive connections, each idle after one request, as
// a local process hoarding connections would. Each one past the cap closes
// the oldest, and a probe from a new client is still answered at once.
func TestHealthServerCapClosesOldestIdle(t *testing.T) {
	// Each connection is known idle before the next one opens, so which
	// is oldest is well defined.
	idle := make(chan string, 1)
	srv := startHealthServer(t, healthyHandler(), func(s *http.Server) { s.ConnState = reportState(s.ConnState, http.StateIdle, idle) })

	conns := make([]*keepAliveConn, 2*healthMaxConns)
	for i := range conns {
		conns[i] = dialKeepAlive(t, srv.addr)
		if code, err := conns[i].get("/healthz"); err != nil || code != http.StatusOK {
			t.Fatalf("connection %d: got %d, %v; want %d", i, code, err, http.StatusOK)
		}
		select {
		case <-idle:
		case <-time.After(5 * time.Second):
			t.Fatalf("connection %d never became idle", i)
		}
	}

	// A kubelet probe: a new connection, one request.
	start := time.Now()
	if code, _, _ := do(t, newTestClient(t), http.MethodGet, srv.url+"/healthz"); code != http.StatusOK {
		t.Errorf("probe: got %d; want %d", code, http.StatusOK)
	}
	if elapsed := time.Since(start); elapsed > time.Second {
		t.Errorf("probe answered after %v; want within 1s", elapsed)
	}

	// The probe closed the oldest survivor, so the first healthMaxConns+1
	// are closed, and the rest, with the probe's, made healthMaxConns.
	deadline := time.Now().Add(3 * time.Second)
	for i, k := range conns[:healthMaxConns+1] {
		if !k.closed(deadline) {
			t.Errorf("connection %d of %d: got it open; want it closed", i, len(conns))
		}
	}
	for i, k := range conns[healthMaxConns+1:] {
		if code, err := k.get("/healthz"); err != nil || code != http.StatusOK {
			t.Errorf("connection %d of %d: got %d, %v; want it open and answering %d",
				healthMaxConns+1+i, len(conns), code, err, http.StatusOK)
		}
	}
	wantClosedAtCap(t, srv.m, 0, healthMaxConns+1, 0, 0)
}

// reportState wraps the ConnState hook track, sending the remote address
// of every connection that enters want on ch, without blocking.
func reportState(track func(net.Conn, http.ConnState), want http.ConnState, ch chan<- string) func(net.Conn, http.ConnState) {
	return func(c net.Conn, state http.ConnState) {
		track(c, state)
		if state == want {
			select {
			case ch <- c.RemoteAddr().String():
			default:
			}
		}
	}
}

// TestHealthServerCapClosesStalledRequest holds every connection the real
// health server allows inside a handler for over healthStallAfter: a new
// connection is answered, and the one longest inside a request is closed
// to make room (with a reset, so its client sees it at once); the others
// are answered once they end. Before issue 44 the new connection was
// closed, and a probe could not get in while clients that never read held
// every slot for the write timeout.
func TestHealthServerCapClosesStalledRequest(t *testing.T) {
	entered := make(chan struct{}, healthMaxConns)
	release := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("/block", func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.Handle("/", healthyHandler())
	srv := startHealthServer(t, mux, nil)
	releaseAll := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseAll) // before the server stops: cleanups run last first

	busy := make([]*keepAliveConn, healthMaxConns)
	for i := range busy {
		busy[i] = dialKeepAlive(t, srv.addr)
		if err := busy[i].send("/block"); err != nil {
			t.Fatal(err)
		}
		select { // one at a time, so that the first is the longest inside
		case <-entered:
		case <-time.After(5 * time.Second):
			t.Fatalf("request %d never reached the handler", i)
		}
	}
	// The wait is the property under test: inside a request this long, a
	// connection counts as stalled.
	time.Sleep(healthStallAfter + 100*time.Millisecond)

	if code, _, _ := do(t, newTestClient(t), http.MethodGet, srv.url+"/healthz"); code != http.StatusOK {
		t.Errorf("probe with every connection stalled inside a request: got %d; want %d", code, http.StatusOK)
	}
	if !busy[0].closed(time.Now().Add(3 * time.Second)) {
		t.Error("connection longest inside a request: got it open; want it closed")
	}
	wantClosedAtCap(t, srv.m, 1, 0, 0, 0)

	releaseAll()
	for i, k := range busy[1:] {
		if code, err := k.response(); err != nil || code != http.StatusOK {
			t.Errorf("connection %d inside a request, after release: got %d, %v; want %d", i+1, code, err, http.StatusOK)
		}
	}
}

// wantClosedAtCap checks health_connections_closed_total in m by reason.
func wantClosedAtCap(t *testing.T, m *metrics, stalled, idle, busy, newConn float64) {
	t.Helper()
	for reason, want := range map[string]float64{"stalled": stalled, "waiting": idle, "busy": busy, "new": newConn} {
		if got := testutil.ToFloat64(m.healthConnsClosed.WithLabelValues(reason)); got != want {
			t.Errorf("health_connections_closed_total{reason=%q}: got %v; want %v", reason, got, want)
		}
	}
}

// closeRecorder is the server end of a net.Pipe that counts its closes.
type closeRecorder struct {
	net.Conn
	closes atomic.Int32
}

func newCloseRecorder() *closeRecorder {
	server, _ := net.Pipe()
	return &closeRecorder{Conn: server}
}

func (c *closeRecorder) Close() error {
	c.closes.Add(1)
	return c.Conn.Close()
}

// keepAliveConn is a raw HTTP/1.1 connection to a test server, kept open
// between requests.
type keepAliveConn struct {
	c  net.Conn
	br *bufio.Reader
}

// dialKeepAlive connects to addr until the test ends.
func dialKeepAlive(t *testing.T, addr string) *keepAliveConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &keepAliveConn{c: c, br: bufio.NewReader(c)}
}

func (k *keepAliveConn) send(path string) error {
	if err := k.c.SetWriteDeadline(time.Now().Add(5 * time.Second)); err != nil {
		return err
	}
	_, err := io.WriteString(k.c, "GET "+path+" HTTP/1.1\r\nHost: test\r\n\r\n")
	return err
}

// response reads one response within five seconds and returns its status.
func (k *keepAliveConn) response() (int, error) {
	if err := k.c.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		return 0, err
	}
	resp, err := http.ReadResponse(k.br, nil)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return 0, err
	}
	return resp.StatusCode, nil
}

func (k *keepAliveConn) get(path string) (int, error) {
	if err := k.send(path); err != nil {
		return 0, err
	}
	return k.response()
}

// closed reports whether the server closed or reset the connection by
// deadline without sending anything on it.
func (k *keepAliveConn) closed(deadline time.Time) bool {
	if err := k.c.SetReadDeadline(deadline); err != nil {
		return false
	}
	n, err := k.br.Read(make([]byte, 1))
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		return false
	}
	return n == 0 && err != nil
}

// failingListener is a pipeListener whose Accept fails with ENOMEM while
// failures is above zero.
type failingListener struct {
	*pipeListener
	failures atomic.Int32
}

func (l *failingListener) Accept() (net.Conn, error) {
	if l.failures.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.ENOMEM)}
	}
	return l.pipeListener.Accept()
}

// pipeListener is an in-memory net.Listener handing out net.Pipe
// connections, for servers that run inside a synctest bubble.
type pipeListener struct {
	conns     chan net.Conn
	closed    chan struct{}
	closeOnce sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), closed: make(chan struct{})}
}

// dial connects to the listener and returns the client end.
func (l *pipeListener) dial() net.Conn {
	client, server := net.Pipe()
	l.conns <- server
	return client
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return &net.UnixAddr{Name: "pipe", Net: "pipe"} }

// servePipe runs serveHealth of handler on ln, a listener of in-memory
// connections; stop cancels it and returns what serveHealth returned.
func servePipe(t *testing.T, ln net.Listener, handler http.Handler, log *slog.Logger) (stop func() error) {
	srv := newHealthServer("pipe", handler, log, newMetrics(prometheus.NewRegistry()))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- serveHealth(ctx, srv, newSteadyListener(ln, log, "health server ", new(atomic.Int64)), log)
	}()
	return func() error { cancel(); return <-done }
}

// healthyHandler is newHealthHandler of a live, ready daemon with an empty
// registry.
func healthyHandler() *http.ServeMux {
	return newHealthHandler(func() (bool, string) { return true, "" }, func() bool { return true }, prometheus.NewRegistry())
}

// testHealthServer is a health server on a real loopback socket, run by
// serveHealth in a goroutine the test owns.
type testHealthServer struct {
	addr   string   // host:port
	url    string   // http://host:port
	m      *metrics // counts the connections closed at the limit
	cancel context.CancelFunc
	done   chan error

	stopOnce sync.Once
	err      error
}

// startHealthServer serves handler on 127.0.0.1:0 until the test ends;
// adjust, if not nil, may change the server before it starts.
func startHealthServer(t *testing.T, handler http.Handler, adjust func(*http.Server)) *testHealthServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveHealthOn(t, ln, handler, adjust, slog.New(slog.DiscardHandler))
}

// serveHealthOn is startHealthServer on a listener of the caller's, logging
// to log.
func serveHealthOn(t *testing.T, ln net.Listener, handler http.Handler, adjust func(*http.Server), log *slog.Logger) *testHealthServer {
	t.Helper()
	m := newMetrics(prometheus.NewRegistry())
	srv := newHealthServer(ln.Addr().String(), handler, log, m)
	if adjust != nil {
		adjust(srv)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &testHealthServer{
		addr:   ln.Addr().String(),
		url:    "http://" + ln.Addr().String(),
		m:      m,
		cancel: cancel,
		done:   make(chan error, 1),
	}
	go func() {
		s.done <- serveHealth(ctx, srv, newSteadyListener(ln, log, "health server ", new(atomic.Int64)), log)
	}()
	t.Cleanup(func() {
		if err := s.stop(t); err != nil {
			t.Errorf("serveHealth: got %v; want nil", err)
		}
	})
	return s
}

// stop cancels the server and waits for serveHealth to return, for at most
// the shutdown deadline plus a margin. It may be called more than once.
func (s *testHealthServer) stop(t *testing.T) error {
	t.Helper()
	s.stopOnce.Do(func() {
		s.cancel()
		select {
		case s.err = <-s.done:
		case <-time.After(healthShutdownTimeout + 2*time.Second):
			s.err = errors.New("serveHealth did not return after cancel")
		}
	})
	return s.err
}

// newTestClient returns a client with its own connection pool, which it
// closes when the test ends, and which does not follow redirects, so the
// status of the requested path is what the test sees.
func newTestClient(t *testing.T) *http.Client {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{
		Transport:     tr,
		Timeout:       5 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// do sends a request without a body and returns the status, header and body.
func do(t *testing.T, client *http.Client, method, url string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(body)
}

// lockedBuffer is a bytes.Buffer safe for the concurrent writes of a logger.
type lockedBuffer struct {
	mu  sync.Mutex // guards buf
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A request with a body, which no health endpoint reads, is answered as
// usual and its connection closed at once, not held while net/http waits
// for a body the client never sends: healthMaxConns such connections would
// otherwise stay inside a request, where the cap never closes them, for the
// read timeout, and the cap would close every probe meanwhile.
func TestHealthServerDropsBodies(t *testing.T) {
	srv := startHealthServer(t, healthyHandler(), nil)
	for _, req := range []string{
		"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n",
		"GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
	} {
		k := dialKeepAlive(t, srv.addr)
		start := time.Now()
		if _, err := io.WriteString(k.c, req); err != nil {
			t.Fatal(err)
		}
		if code, err := k.response(); err != nil || code != http.StatusOK {
			t.Errorf("%q: got %d, %v; want 200", req, code, err)
		}
		if !k.closed(start.Add(5 * time.Second)) {
			t.Errorf("%q: connection still open after the reply", req)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("%q: the connection was held %v; want it closed at once", req, d)
		}
	}
}
