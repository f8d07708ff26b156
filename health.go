package main

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// heartbeat is the liveness state behind /healthz. The run loop calls beat
// after it has checked that the pool and the accept loop still work; the
// health handler reads it with alive. All methods are safe for concurrent use and never block: a probe
// must not wait on a lock held by the loop it is judging, or a deadlocked
// loop would hang /healthz instead of failing it.
type heartbeat struct {
	threshold time.Duration

	// origin is a fixed point with a monotonic clock reading. Beats are
	// stored as the time elapsed since origin, so a wall clock step (NTP,
	// a manual date change) can neither fake a missed beat nor hide one.
	origin time.Time
	last   atomic.Int64 // time.Duration since origin of the latest beat
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

// alive reports whether the daemon is live, and when it is not, for how
// long the run loop has been silent.
func (h *heartbeat) alive() (ok bool, reason string) {
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

// Health server limits. Its clients are the kubelet (a new connection per
// probe, with a timeout of a second or a few) and Prometheus (a scrape with
// a timeout of about ten seconds); nothing legitimate comes close to them.
const (
	// A client that sends its headers a byte at a time (slowloris) would
	// otherwise hold a connection and a goroutine as long as it likes.
	healthReadHeaderTimeout = 5 * time.Second
	// No request has a body (see dropBodies); the margin covers a slow
	// network.
	healthReadTimeout = 10 * time.Second
	// Bounds a scrape whose client stops reading the response.
	healthWriteTimeout = 15 * time.Second
	// Prometheus reuses its connection between scrapes, up to a minute
	// apart; an idle client must not pin a descriptor for ever.
	healthIdleTimeout = 90 * time.Second
	// Probes and scrapes send a few hundred bytes of headers; the default
	// of 1 MiB lets every connection make the server buffer a megabyte.
	healthMaxHeaderBytes = 8 << 10
	// The spec gives in-flight health requests five seconds at shutdown.
	healthShutdownTimeout = 5 * time.Second
	// healthMaxConns bounds the open connections (see connCap). Each costs
	// about 19 KiB (a goroutine, its buffers, the socket): unbounded, 7,000
	// idle keep-alive connections from one local process once took 150 MB,
	// past the pod's limit, and the OOM kill dropped every proxied
	// connection on the node. 128 fit in the descriptor reserve (fdReserve)
	// with room for the probes and discovery.
	healthMaxConns = 128
	// healthDeferAccept keeps a connection that sends nothing away from the
	// server for about this long (TCP_DEFER_ACCEPT), so a flood of silent
	// connects costs the kernel a little and the server nothing meanwhile.
	healthDeferAccept = 5 * time.Second
)

// listenHealth opens the health server's listener, with TCP_DEFER_ACCEPT
// where the kernel has it.
func listenHealth(ctx context.Context, addr string) (net.Listener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		_ = setDeferAccept(rc, healthDeferAccept) // best effort: connCap still bounds the cost
		return nil
	}}
	return lc.Listen(ctx, "tcp", addr) // an error names the address
}

// newHealthServer returns the health HTTP server for handler on addr, with
// every timeout set, its connections capped and its internal errors logged
// through log.
func newHealthServer(addr string, handler http.Handler, log *slog.Logger, m *metrics) *http.Server {
	return &http.Server{
		Addr:              addr,
		Handler:           dropBodies(handler),
		ReadHeaderTimeout: healthReadHeaderTimeout,
		ReadTimeout:       healthReadTimeout,
		WriteTimeout:      healthWriteTimeout,
		IdleTimeout:       healthIdleTimeout,
		MaxHeaderBytes:    healthMaxHeaderBytes,
		ConnState:         newConnCap(healthMaxConns, log, m).track,
		// net/http reports accept retries and handler panics here; without
		// it they would bypass slog and go to the standard logger.
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// dropBodies closes the connection of a request that comes with a body
// right after the reply, without reading the body. No health endpoint reads
// one, and net/http would otherwise read up to 256 KiB of it after the
// reply, for up to the read timeout: a client declaring a body it never
// sends would hold a connection inside a request that long.
func dropBodies(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength != 0 || len(r.TransferEncoding) > 0 {
			// A read deadline in the past makes net/http's reading of the
			// body fail at once, once the reply is written.
			_ = http.NewResponseController(w).SetReadDeadline(time.Now())
			w.Header().Set("Connection", "close")
		}
		h.ServeHTTP(w, r)
	})
}

// connCap holds the health server to max open connections without ever
// making its accept loop wait, which would starve the kubelet's probes. At
// the cap, a new connection closes the one that has waited longest outside
// a request: idle, or not read from yet. A client hoarding connections
// loses its own oldest, while a probe, which sends its request at once (it
// reaches Accept only with data, see healthDeferAccept), is read long before
// it could be the oldest. If every connection is inside a request, which
// the read and write timeouts bound, the new one is closed instead. Its
// track method is the server's ConnState hook.
type connCap struct {
	max                      int
	closedWaiting, closedNew prometheus.Counter
	log                      *slog.Logger
	warn                     rateLog

	mu sync.Mutex // guards the fields below
	// members holds every open connection the cap has not closed, with its
	// element in waiting, or nil while it is inside a request.
	members map[net.Conn]*list.Element
	waiting *list.List // of net.Conn, longest waiting first
}

func newConnCap(limit int, log *slog.Logger, m *metrics) *connCap {
	return &connCap{
		max: limit, log: log, warn: rateLog{every: warnEvery},
		closedWaiting: m.healthConnsClosed.WithLabelValues(reasonWaiting),
		closedNew:     m.healthConnsClosed.WithLabelValues(reasonNew),
		members:       map[net.Conn]*list.Element{}, waiting: list.New(),
	}
}

// track records c entering state and closes the connection the cap gives
// up, outside the lock.
func (cc *connCap) track(c net.Conn, state http.ConnState) {
	cc.mu.Lock()
	victim := cc.enterLocked(c, state)
	cc.mu.Unlock()
	if victim == nil {
		return
	}
	_ = victim.Close() // net/http reports it closed soon; it no longer counts
	if n, due := cc.warn.note(); due {
		cc.log.Warn("health server at its connection limit, closing connections", "limit", cc.max, "closed", n)
	}
}

// enterLocked moves c to state and returns the connection to close, if any.
func (cc *connCap) enterLocked(c net.Conn, state http.ConnState) net.Conn {
	e, member := cc.members[c]
	if e != nil {
		cc.waiting.Remove(e)
	}
	switch {
	case state == http.StateNew && len(cc.members) >= cc.max && cc.waiting.Len() == 0:
		cc.closedNew.Inc()
		return c
	case state == http.StateNew:
		var victim net.Conn
		if len(cc.members) >= cc.max {
			victim, _ = cc.waiting.Remove(cc.waiting.Front()).(net.Conn)
			delete(cc.members, victim)
			cc.closedWaiting.Inc()
		}
		cc.members[c] = cc.waiting.PushBack(c)
		return victim
	case !member: // closed by the cap; net/http catches up
	case state == http.StateIdle:
		cc.members[c] = cc.waiting.PushBack(c)
	case state == http.StateActive:
		cc.members[c] = nil
	default: // closed or hijacked
		delete(cc.members, c)
	}
	return nil
}

// serveHealth serves srv on ln until ctx is done, then shuts srv down,
// giving in-flight requests healthShutdownTimeout before closing their
// connections. It returns nil after a shutdown and the error of Serve if
// serving stopped on its own. It owns the goroutine that runs Serve and does
// not return before it has ended.
func serveHealth(ctx context.Context, srv *http.Server, ln net.Listener, log *slog.Logger) error {
	errc := make(chan error, 1)
	go serveHTTP(srv, &steadyListener{Listener: ln, log: log, closed: make(chan struct{})}, errc)
	select {
	case err := <-errc:
		return fmt.Errorf("serve health on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	// ctx is done, and shutting down with it would abandon in-flight
	// requests at once; WithoutCancel keeps only its values.
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), healthShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		log.Warn("health server shutdown timed out, closing connections", "err", err)
		_ = srv.Close() // can fail only closing the listener a second time
	}
	// Shutdown makes Serve return ErrServerClosed at once; anything else is
	// a serving error that raced with the shutdown.
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve health on %s: %w", ln.Addr(), err)
	}
	return nil
}

// serveHTTP runs srv.Serve on ln and sends its result to errc. It is a named
// function so that it shows up in stack dumps.
func serveHTTP(srv *http.Server, ln net.Listener, errc chan<- error) {
	errc <- srv.Serve(ln)
}

// steadyListener keeps the health server accepting through every accept
// error but a closed listener. net/http retries only the errors it deems
// temporary, such as EMFILE, and returns on the others, such as ENOMEM and
// ENOBUFS: the proxy would go on without /healthz, /readyz and /metrics, and
// only a restart, which cuts every proxied connection, would bring them
// back. Like the proxy's accept loop, it backs off and retries.
type steadyListener struct {
	net.Listener
	log       *slog.Logger
	closed    chan struct{} // closed by Close, to end a backoff
	closeOnce sync.Once
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
		backoff = min(max(2*backoff, acceptBackoffMin), acceptBackoffMax)
		if !await(context.Background(), backoff, l.closed) {
			return nil, fmt.Errorf("accept on %s: %w", l.Addr(), net.ErrClosed)
		}
	}
}

func (l *steadyListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}
