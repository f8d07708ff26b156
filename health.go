package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
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

// newHealthHandler returns the health server's routes. live backs /healthz
// and returns the reason when the daemon is not live; ready backs /readyz and
// is true while at least one upstream is healthy and not draining; gatherer
// backs /metrics. Paths match exactly; anything else is 404. A new path
// goes through handleReadOnly like these, so the method rules stay in one
// place.
func newHealthHandler(live func() (bool, string), ready func() bool, gatherer prometheus.Gatherer) *http.ServeMux {
	mux := http.NewServeMux()
	handleReadOnly(mux, "/healthz", probeHandler(live))
	handleReadOnly(mux, "/readyz", probeHandler(func() (bool, string) { return ready(), "no healthy upstream" }))
	handleReadOnly(mux, "/metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{
		// Our collectors are fixed and in memory, so a gathering error is
		// a bug. Failing the scrape turns it into up == 0 in Prometheus
		// rather than a partial page that nobody notices.
		ErrorHandling: promhttp.HTTPErrorOnError,
		// One or two Prometheus servers scrape a node; more than this in
		// flight means a misbehaving client, which gets 503 instead of
		// goroutines and memory.
		MaxRequestsInFlight: 4,
	}))
	return mux
}

// handleReadOnly routes path on mux to h with the method rules shared by
// every health server path: GET and HEAD reach h (net/http drops the body
// of a HEAD response), OPTIONS answers 204, anything else 405. The mux
// answers the 405 itself, with an Allow header naming the methods
// registered for the path: the same as OPTIONS gives.
func handleReadOnly(mux *http.ServeMux, path string, h http.Handler) {
	mux.Handle("GET "+path, h)
	mux.HandleFunc("OPTIONS "+path, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Allow", "GET, HEAD, OPTIONS")
		w.WriteHeader(http.StatusNoContent)
	})
}

// probeHandler serves /healthz and /readyz: 200 "ok" while check reports
// true, 503 with the reason it gives otherwise. Both answers go through
// http.Error, which writes a line of plain text with any status, so they
// carry the same headers.
func probeHandler(check func() (bool, string)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		status, body := http.StatusOK, "ok"
		if ok, reason := check(); !ok {
			status, body = http.StatusServiceUnavailable, reason
		}
		http.Error(w, body, status)
	})
}

// healthShutdownTimeout is what the spec gives in-flight health requests
// at shutdown.
const healthShutdownTimeout = 5 * time.Second

// newHealthServer returns the health HTTP server for handler on addr, with
// every timeout set, its connections capped and its internal errors logged
// through log. Its clients are the kubelet (a new connection per probe, with
// a timeout of a second or a few) and Prometheus (a scrape with a timeout of
// about ten seconds); nothing legitimate comes close to its limits.
func newHealthServer(addr string, handler http.Handler, log *slog.Logger, m *metrics) *http.Server {
	return &http.Server{
		Addr:    addr,
		Handler: dropBodies(handler),
		// A client that sends its headers a byte at a time (slowloris)
		// would otherwise hold a connection and a goroutine as long as it
		// likes.
		ReadHeaderTimeout: 5 * time.Second,
		// No request has a body (see dropBodies); the margin covers a slow
		// network.
		ReadTimeout: 10 * time.Second,
		// Bounds a scrape whose client stops reading the response.
		WriteTimeout: 15 * time.Second,
		// Prometheus reuses its connection between scrapes, up to a minute
		// apart; an idle client must not pin a descriptor for ever.
		IdleTimeout: 90 * time.Second,
		// Probes and scrapes send a few hundred bytes of headers; the
		// default of 1 MiB lets every connection make the server buffer a
		// megabyte.
		MaxHeaderBytes: 8 << 10,
		ConnState:      newConnCap(healthMaxConns, log, m).track,
		// net/http reports accept retries and handler panics here; without
		// it they would bypass slog and go to the standard logger.
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// serveHealth serves srv on ln until ctx is done, then shuts srv down,
// giving in-flight requests healthShutdownTimeout before closing their
// connections. It returns nil after a shutdown and the error of Serve if
// serving stopped on its own. It owns the goroutine that runs Serve (in
// stack dumps, the one serveHealth created) and does not return before it
// has ended.
func serveHealth(ctx context.Context, srv *http.Server, ln *steadyListener, log *slog.Logger) error {
	ln.accepted = newHealthConn
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
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
