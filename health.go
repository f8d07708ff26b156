package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// heartbeat is the liveness state behind /healthz. The run loop calls beat
// after it has checked that the proxy still answers; a component whose loss
// the daemon cannot recover from calls fail. The health handler reads it with
// alive. All methods are safe for concurrent use and never block: a probe
// must not wait on a lock held by the loop it is judging, or a deadlocked
// loop would hang /healthz instead of failing it.
type heartbeat struct {
	threshold time.Duration

	// origin is a fixed point with a monotonic clock reading. Beats are
	// stored as the time elapsed since origin, so a wall clock step (NTP,
	// a manual date change) can neither fake a missed beat nor hide one.
	origin time.Time
	last   atomic.Int64 // time.Duration since origin of the latest beat

	failed atomic.Pointer[string] // reason given to the first fail; nil while not failed
}

// newHeartbeat returns a heartbeat that counts as having just beaten, so the
// daemon is live during its first threshold. threshold must be positive;
// config validation requires at least one second.
func newHeartbeat(threshold time.Duration) *heartbeat {
	return &heartbeat{threshold: threshold, origin: time.Now()}
}

// beat records that the run loop is responsive now.
func (h *heartbeat) beat() {
	h.last.Store(int64(time.Since(h.origin)))
}

// fail marks liveness as failed for the rest of the process's life, so the
// kubelet restarts the container. Only the first reason is kept: it names the
// root cause, and later failures are usually its consequences.
func (h *heartbeat) fail(reason string) {
	h.failed.CompareAndSwap(nil, &reason)
}

// alive reports whether the daemon is live. When it is not, reason says why:
// the reason given to fail, or how long the run loop has been silent.
func (h *heartbeat) alive() (ok bool, reason string) {
	if r := h.failed.Load(); r != nil {
		return false, *r
	}
	silent := time.Since(h.origin) - time.Duration(h.last.Load())
	if silent > h.threshold {
		return false, fmt.Sprintf("no heartbeat for %v (threshold %v)", silent, h.threshold)
	}
	return true, ""
}

// allowedMethods is the Allow header of every health server path.
const allowedMethods = "GET, HEAD, OPTIONS"

// metricsMaxInFlight bounds concurrent /metrics requests. One or two
// Prometheus servers scrape a node; more than this in flight means a
// misbehaving client, which gets 503 instead of goroutines and memory.
const metricsMaxInFlight = 4

// newHealthHandler returns the health server's routes. live backs /healthz
// and returns the reason when the daemon is not live; ready backs /readyz and
// is true while at least one upstream is healthy and not draining; gatherer
// backs /metrics. Paths match exactly; anything else is 404. A new path
// goes through readOnly like these, so the method rules stay in one place.
func newHealthHandler(live func() (bool, string), ready func() bool, gatherer prometheus.Gatherer) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/healthz", readOnly(livenessHandler(live)))
	mux.Handle("/readyz", readOnly(readinessHandler(ready)))
	mux.Handle("/metrics", readOnly(promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{
		// Our collectors are fixed and in memory, so a gathering error is
		// a bug. Failing the scrape turns it into up == 0 in Prometheus
		// rather than a partial page that nobody notices.
		ErrorHandling:       promhttp.HTTPErrorOnError,
		MaxRequestsInFlight: metricsMaxInFlight,
	})))
	return mux
}

// readOnly applies the method rules shared by every health server path:
// GET and HEAD reach h, OPTIONS answers 204, anything else 405. net/http
// drops the body of a HEAD response, so h need not handle HEAD itself.
func readOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet, http.MethodHead:
			h.ServeHTTP(w, r)
		case http.MethodOptions:
			w.Header().Set("Allow", allowedMethods)
			w.WriteHeader(http.StatusNoContent)
		default:
			w.Header().Set("Allow", allowedMethods)
			http.Error(w, http.StatusText(http.StatusMethodNotAllowed), http.StatusMethodNotAllowed)
		}
	})
}

// livenessHandler serves /healthz: 200 while live reports true, 503 with
// the reason otherwise.
func livenessHandler(live func() (bool, string)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if ok, reason := live(); !ok {
			http.Error(w, reason, http.StatusServiceUnavailable)
			return
		}
		writeOK(w)
	})
}

// readinessHandler serves /readyz: 200 while ready reports true, 503
// otherwise.
func readinessHandler(ready func() bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if !ready() {
			http.Error(w, "no healthy upstream", http.StatusServiceUnavailable)
			return
		}
		writeOK(w)
	})
}

// writeOK writes the 200 body of the probe endpoints, with the same headers
// http.Error sets on the failure path.
func writeOK(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	// The status line is already out; a client that hung up needs no answer.
	_, _ = io.WriteString(w, "ok\n")
}

// Health server limits. Its clients are the kubelet (probes with a timeout of
// about a second) and Prometheus (scrapes with a timeout of about ten
// seconds); nothing legitimate comes close to these bounds.
const (
	// A client that sends its headers a byte at a time (slowloris) would
	// otherwise hold a connection and a goroutine for as long as it likes.
	healthReadHeaderTimeout = 5 * time.Second
	// No request has a body, so reading one never needs more than the
	// headers do; the extra margin only covers a slow network.
	healthReadTimeout = 10 * time.Second
	// Bounds a scrape whose client stops reading the response, which would
	// otherwise hold the connection open while its writes block.
	healthWriteTimeout = 15 * time.Second
	// Prometheus reuses its connection between scrapes; an idle client
	// must not pin a file descriptor forever.
	healthIdleTimeout = 90 * time.Second
	// Probes and scrapes send a few hundred bytes of headers. The default
	// of 1 MiB lets every connection make the server buffer a megabyte.
	healthMaxHeaderBytes = 8 << 10
	// The spec gives in-flight health requests five seconds at shutdown.
	healthShutdownTimeout = 5 * time.Second
	// Each open connection costs the server about 19 KiB (a goroutine,
	// its buffers and the socket). Unbounded, 7,000 idle keep-alive
	// connections from one local process took 150 MB, past the pod's
	// 128Mi, and the OOM kill dropped every proxied connection on the
	// node. The kubelet and one or two Prometheus servers need a handful;
	// the rest of the 64 is headroom, and 64 also fits in the descriptor
	// reserve the proxy leaves (fdReserve).
	healthMaxConns = 64
	// At healthMaxConns, a connection that has not sent a request yet is
	// not closed to make room before it has had this long to send one, and
	// a new connection waits at most this long for room (see connLimiter).
	// Honest clients send their request at once, but with 500 of them at
	// once on a loaded machine the server took over 250 ms to read some
	// (TestHostileManyConcurrentRequests under -race, where a grace of
	// 250 ms closed a few). Only a client that keeps every slot filled
	// with connections younger than this (or than healthConnBusy, inside
	// a request) can make a probe wait for it.
	healthConnGrace = time.Second
	// A request on the health server takes milliseconds; at
	// healthMaxConns, a connection still inside one after healthConnBusy
	// may be closed to make room like an idle one, so that slow clients
	// cannot hold every slot for the read or write timeout. (Request
	// bodies, the cheapest way to be slow, are not waited for: see
	// dropBodies.)
	healthConnBusy = 3 * time.Second
	// Spaces the warnings about connections closed at healthMaxConns.
	healthLimitLogEvery = time.Minute
)

// dropBodies closes the connection of a request that comes with a body
// right after the reply, without reading the body. No health endpoint
// reads one, and net/http would otherwise read up to 256 KiB of it after
// the reply, for up to the read timeout: a client declaring a body it never
// sends would hold one of the healthMaxConns connections that long.
func dropBodies(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength != 0 || len(r.TransferEncoding) > 0 {
			// A read deadline in the past makes net/http's reading of
			// the body fail at once, once the reply is written.
			_ = http.NewResponseController(w).SetReadDeadline(time.Now())
			w.Header().Set("Connection", "close")
		}
		h.ServeHTTP(w, r)
	})
}

// newHealthServer returns the health HTTP server for handler on addr, with
// every timeout set, its internal errors logged through log and the
// connections it closes at its limit counted in m.
func newHealthServer(addr string, handler http.Handler, log *slog.Logger, m *metrics) *http.Server {
	return &http.Server{
		Addr:              addr,
		Handler:           dropBodies(handler),
		ReadHeaderTimeout: healthReadHeaderTimeout,
		ReadTimeout:       healthReadTimeout,
		WriteTimeout:      healthWriteTimeout,
		IdleTimeout:       healthIdleTimeout,
		MaxHeaderBytes:    healthMaxHeaderBytes,
		ConnState:         newConnLimiter(healthMaxConns, log, m).track,
		// net/http reports accept retries and handler panics here; without
		// it they would bypass slog and go to the standard logger.
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// connLimiter holds a server to max open connections; its track method is
// the server's ConnState hook, so net/http reports every connection to it.
//
// When a new connection would exceed max, the one that has waited longest
// without a request in progress is closed to make room: a client holding
// idle keep-alive connections loses its own oldest ones, while a kubelet
// probe, which opens a connection and sends its one request at once, gets
// in. A connection that has not sent a request yet (StateNew) is spared for
// its first grace, though: a burst of honest clients is accepted faster
// than their requests are read, and closing the oldest of them would fail
// clients that did nothing wrong. One inside a request is spared for busy,
// far longer than a health request takes. While no connection can be
// closed, the accept loop waits for one to close or become closable, so
// further clients queue in the listen backlog as the proxy's do; after
// grace the new connection is closed instead, which happens only when
// every connection is a young one or inside a young request.
type connLimiter struct {
	max   int
	grace time.Duration // see healthConnGrace
	busy  time.Duration // see healthConnBusy
	log   *slog.Logger
	// closedWaiting and closedNew count the connections closed, for ever;
	// see metrics.healthConnsClosed.
	closedWaiting, closedNew prometheus.Counter

	// freed wakes an admit waiting for room when a connection closes or
	// becomes idle. It holds one token, so a wake-up is never lost; a stale
	// one costs admit a second look.
	freed chan struct{}

	mu sync.Mutex // guards the fields below
	// conns holds every connection the server has open, less those admit
	// has closed: a closed connection stops counting at once, not when
	// net/http gets round to reporting it closed.
	conns map[net.Conn]connMark
	// evicted counts the waiting connections closed to make room, refused
	// the new ones closed because none could be, both since warned, when
	// the last warning was logged (zero before the first).
	evicted, refused int
	warned           time.Time
}

// connMark is a connection's last state and when it entered it.
type connMark struct {
	state http.ConnState
	since time.Time
}

// newConnLimiter returns a limiter for limit connections, with a grace of
// healthConnGrace, that counts what it closes in m.
func newConnLimiter(limit int, log *slog.Logger, m *metrics) *connLimiter {
	return &connLimiter{
		max: limit, grace: healthConnGrace, busy: healthConnBusy, log: log,
		closedWaiting: m.healthConnsClosed.WithLabelValues(reasonWaiting),
		closedNew:     m.healthConnsClosed.WithLabelValues(reasonNew),
		freed:         make(chan struct{}, 1),
		conns:         make(map[net.Conn]connMark, limit),
	}
}

// track records c entering state. net/http calls it for StateNew from its
// accept loop, which admit holds up for at most grace.
func (l *connLimiter) track(c net.Conn, state http.ConnState) {
	switch state {
	case http.StateNew:
		l.admit(c)
		return
	case http.StateActive, http.StateIdle:
		now := time.Now()
		l.mu.Lock()
		// A connection admit closed may still finish reading a request
		// already buffered; it must not come back.
		if _, ok := l.conns[c]; ok {
			l.conns[c] = connMark{state: state, since: now}
		}
		l.mu.Unlock()
	case http.StateHijacked, http.StateClosed:
		l.mu.Lock()
		delete(l.conns, c)
		l.mu.Unlock()
	}
	if state != http.StateActive {
		select {
		case l.freed <- struct{}{}:
		default: // a wake-up is already pending
		}
	}
}

// admit adds the new connection c, first closing another to make room if
// needed (see connLimiter), or closes c. It waits for room at most grace.
// Closing and logging happen outside the lock, so a slow log cannot hold up
// the hooks of other connections.
func (l *connLimiter) admit(c net.Conn) {
	deadline := time.Now().Add(l.grace)
	for {
		now := time.Now()
		l.mu.Lock()
		victim, retry := l.makeRoomLocked(c, now, deadline)
		evicted, refused, warn := l.warningDueLocked(victim != nil, now)
		l.mu.Unlock()
		if retry > 0 {
			l.awaitRoom(retry)
			continue
		}
		if victim == nil {
			return
		}
		l.log.Debug("health server connection closed at the connection limit", "client", victim.RemoteAddr().String())
		_ = victim.Close() // the client loses the connection either way
		if warn {
			l.log.Warn("health server at its connection limit, closing connections",
				"limit", l.max, "closed_waiting", evicted, "refused_new", refused)
		}
		return
	}
}

// makeRoomLocked adds c if there is room or a connection can be closed to
// make it, and returns the connection to close: nil if there was room, the
// one closed to make it, or c itself once deadline has passed. Otherwise it
// returns how long to wait before looking again. l.mu must be held.
func (l *connLimiter) makeRoomLocked(c net.Conn, now, deadline time.Time) (victim net.Conn, retry time.Duration) {
	if len(l.conns) >= l.max {
		var spared time.Time
		victim, spared = l.longestWaitingLocked(now)
		switch {
		case victim != nil:
			delete(l.conns, victim)
			l.evicted++
			l.closedWaiting.Inc()
		case !now.Before(deadline):
			l.refused++
			l.closedNew.Inc()
			return c, 0
		case spared.IsZero() || spared.After(deadline):
			return nil, deadline.Sub(now)
		default:
			return nil, spared.Sub(now)
		}
	}
	l.conns[c] = connMark{state: http.StateNew, since: now}
	return victim, 0
}

// longestWaitingLocked returns the connection to close to make room: of
// those that may be closed (see closableAt), the idle one that has waited
// longest, or if none is idle, the one that has. (Closing an idle one cuts
// no request.) If none may be closed, spared is when the first becomes
// closable, or zero if there are no connections. A linear scan: max is
// small and this runs only at the limit. l.mu must be held.
func (l *connLimiter) longestWaitingLocked(now time.Time) (oldest net.Conn, spared time.Time) {
	var since time.Time
	var oldestIdle bool
	for c, m := range l.conns {
		if at := l.closableAt(m); at.After(now) {
			if spared.IsZero() || at.Before(spared) {
				spared = at
			}
			continue
		}
		idle := m.state == http.StateIdle
		if oldest == nil || idle && !oldestIdle || idle == oldestIdle && m.since.Before(since) {
			oldest, since, oldestIdle = c, m.since, idle
		}
	}
	return oldest, spared
}

// closableAt is when a connection in m may be closed to make room: an idle
// one at once, a new one after its grace, one inside a request once it has
// been there for l.busy. (An idle connection may have a request on the
// way, which its close then cuts; the client tries again.)
func (l *connLimiter) closableAt(m connMark) time.Time {
	switch m.state {
	case http.StateNew:
		return m.since.Add(l.grace)
	case http.StateActive:
		return m.since.Add(l.busy)
	default:
		return m.since
	}
}

// awaitRoom waits until a connection closes or becomes idle, or for d.
func (l *connLimiter) awaitRoom(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-l.freed:
	case <-t.C:
	}
}

// warningDueLocked reports whether a connection closed at the limit now
// warrants a warning, and if so takes the counts since the last one. The
// first closing warns, later ones at most once per healthLimitLogEvery, so
// a client hammering the limit cannot flood the log. l.mu must be held.
func (l *connLimiter) warningDueLocked(closed bool, now time.Time) (evicted, refused int, due bool) {
	if !closed || now.Sub(l.warned) < healthLimitLogEvery {
		return 0, 0, false
	}
	evicted, refused = l.evicted, l.refused
	l.evicted, l.refused, l.warned = 0, 0, now
	return evicted, refused, true
}

// serveHealth serves srv on ln until ctx is done, then shuts srv down, giving
// in-flight requests healthShutdownTimeout before closing their connections.
// It returns nil after a shutdown and the error of Serve if serving stopped
// on its own. The caller creates ln, so a bind error surfaces before anything
// else starts, and owns the goroutine that runs serveHealth; serveHealth owns
// the one that runs Serve and does not return before it has ended.
func serveHealth(ctx context.Context, srv *http.Server, ln net.Listener, log *slog.Logger) error {
	errc := make(chan error, 1)
	go serveHTTP(srv, newSteadyListener(ln, log), errc)

	select {
	case err := <-errc:
		return fmt.Errorf("serve health on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}

	// ctx is already cancelled, and shutting down with it would abandon
	// in-flight requests at once; WithoutCancel keeps only its values.
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), healthShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		log.Warn("health server shutdown timed out, closing connections", "err", err)
		// Close can only fail closing the listener a second time.
		_ = srv.Close()
	}

	// Shutdown makes Serve return ErrServerClosed at once; anything else
	// is a real serving error that raced with the shutdown.
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve health on %s: %w", ln.Addr(), err)
	}
	return nil
}

// steadyListener keeps the health server accepting through every accept
// error but a closed listener. net/http retries only the errors it deems
// temporary, such as EMFILE, and returns on the others, such as ENOMEM and
// ENOBUFS: the proxy would go on without /healthz, /readyz and /metrics,
// and only a restart, which cuts every proxied connection, would bring
// them back. Like the proxy's accept loop, it backs off and retries, and
// logs when the failures start and end.
type steadyListener struct {
	net.Listener
	log    *slog.Logger
	closed context.Context //nolint:containedctx // done once Close is called, to end a backoff
	close  context.CancelFunc
}

func newSteadyListener(ln net.Listener, log *slog.Logger) *steadyListener {
	closed, closeFn := context.WithCancel(context.Background())
	return &steadyListener{Listener: ln, log: log, closed: closed, close: closeFn}
}

func (l *steadyListener) Accept() (net.Conn, error) {
	var backoff time.Duration
	for {
		c, err := l.Listener.Accept()
		if err == nil || errors.Is(err, net.ErrClosed) {
			if err == nil && backoff != 0 {
				l.log.Info("health server accepting again")
			}
			return c, err
		}
		if backoff == 0 {
			l.log.Error("health server accept failing, backing off until it works again", "err", err)
		}
		backoff = nextAcceptBackoff(backoff)
		if !sleepCtx(l.closed, backoff) {
			return nil, fmt.Errorf("accept on %s: %w", l.Addr(), net.ErrClosed)
		}
	}
}

func (l *steadyListener) Close() error {
	l.close()
	return l.Listener.Close()
}

// serveHTTP runs srv.Serve on ln and sends its result to errc. It is a named
// function so that it shows up in stack dumps.
func serveHTTP(srv *http.Server, ln net.Listener, errc chan<- error) {
	errc <- srv.Serve(ln)
}

// upstreamsHandler serves /upstreams: the state of every upstream as JSON,
// or as a table for a client that asks for text/plain (extractedprism
// status does).
func upstreamsHandler(describe func() []upstreamStatus) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st := describe()
		if strings.Contains(r.Header.Get("Accept"), "text/plain") {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			writeUpstreamTable(w, st)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(st) // a failed write means the client went away
	})
}

// writeUpstreamTable renders st as an aligned text table.
func writeUpstreamTable(w io.Writer, st []upstreamStatus) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "UPSTREAM\tSOURCES\tHEALTH\tSTREAK\tREADY\tRTT\tTIER\tCONNS\tDRAIN\tLAST CHECK\tLAST ERROR")
	for _, s := range st {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n",
			s.Address, orDash(strings.Join(s.Sources, ",")), healthWord(s.Healthy), s.FailStreak,
			readyWord(s), rttText(s.RTTSeconds), tierText(s.Tier), s.Connections,
			drainText(s), timeText(s.LastCheck), orDash(s.LastError))
	}
	_ = tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func healthWord(ok bool) string {
	if ok {
		return "healthy"
	}
	return "unhealthy"
}

func readyWord(s upstreamStatus) string {
	switch {
	case s.Ready == nil:
		return "-"
	case s.ReadyPending:
		return "pending"
	case *s.Ready && s.AwaitingProbe:
		return "ready-awaiting-probe"
	case *s.Ready:
		return "ready"
	default:
		return "not-ready"
	}
}

func rttText(sec *float64) string {
	if sec == nil {
		return "-"
	}
	return time.Duration(*sec * float64(time.Second)).Round(10 * time.Microsecond).String()
}

func tierText(t *int) string {
	if t == nil {
		return "-"
	}
	return strconv.Itoa(*t)
}

func drainText(s upstreamStatus) string {
	switch {
	case !s.Draining:
		return "-"
	case s.DrainDeadline == nil:
		return "draining"
	default:
		return "until " + s.DrainDeadline.Format(time.RFC3339)
	}
}

func timeText(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.Format(time.RFC3339)
}
