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
)

// newHealthServer returns the health HTTP server for handler on addr, with
// every timeout set and its internal errors logged through log.
func newHealthServer(addr string, handler http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Addr:              addr,
		Handler:           handler,
		ReadHeaderTimeout: healthReadHeaderTimeout,
		ReadTimeout:       healthReadTimeout,
		WriteTimeout:      healthWriteTimeout,
		IdleTimeout:       healthIdleTimeout,
		MaxHeaderBytes:    healthMaxHeaderBytes,
		// net/http reports accept retries and handler panics here; without
		// it they would bypass slog and go to the standard logger.
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
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
