// Command extractedprism is a per-node TCP load balancer for the Kubernetes
// API server. Every node runs one, bound to 127.0.0.1:7445, and the node's
// kubelet, kube-proxy and CNI agent reach the API through it. It forwards
// each connection to a healthy API server, so a control-plane node that
// dies, hangs or restarts costs the node only the connections open to it.
// There is no shared VIP, no leader election and no capability.
//
//	extractedprism --endpoints 10.0.0.1:6443,10.0.0.2:6443,10.0.0.3:6443
//	extractedprism check [flags]     validate as a start would, bind nothing
//	extractedprism status [--json]   the upstreams of the daemon on this node
//
// Every flag has an EP_* variable (--bind-port is EP_BIND_PORT); a flag
// wins over its variable, which wins over the default; --help lists them.
// Invalid values stop the program before it listens, all named at once by
// flag and variable; a setting without effect, or an EP_ variable no flag
// reads, is a warning.
//
// # Reading order
//
// The spec's behaviour is in config.go (flags and validation), metrics.go,
// selector.go (random and latency tiers), upstream.go (the upstream state
// machine, readiness, draining), probe.go (TCP and /readyz checks),
// proxy.go (accept loop and the copy), discovery.go (static endpoints and
// the EndpointSlice watch), health.go (/healthz, /readyz, /metrics) and
// this file, which wires them. Each feature beyond the spec has a file of
// its own: hedge.go (retries, last resort, hedged dials), sweep.go (the
// dead-connection sweep), limits.go (the connection bound), idle.go
// (silent connections give way and time out), fairshare.go (at the bound,
// the owner of the most slots gives one up), cache.go (the endpoint
// cache), healthlimits.go (the health server under abuse),
// steadylistener.go (accept errors back off and retry; the hand-over's
// gate), listeners.go
// (the sockets at start; socket activation and the graceful stop),
// handover.go and handoverdir.go (sockets handed to a successor),
// closer.go (the closes forced over time), rebalance.go, spread.go,
// kubeclient.go, ownlistener.go, status.go, check.go, version.go, log.go
// (logging that never blocks) and sockopt_linux.go.
//
// # Data path
//
// Each client connection is joined to one upstream and copied both ways
// with io.Copy, which splices TCP to TCP on Linux; a half-close is passed
// on. A failed dial is retried on another upstream, each at most once, and
// a dial slower than the hedge delay gets a second one. With nothing
// pickable, the known non-draining upstreams are tried anyway, most
// recently healthy first. Both sockets get keepalive after 30 s idle and a
// 30 s TCP_USER_TIMEOUT. Connections are bounded by the open-files and
// cgroup memory limits (limits.go); at the bound clients wait in the listen
// backlog, and silent connections give way to them (idle.go). Accept errors
// such as EMFILE back off and retry.
//
// # Upstreams
//
// Each upstream is checked every --health-interval by its own goroutine,
// with its own --health-timeout. Two consecutive failures (checks or client
// dials) exclude it; a success re-includes it, at most once an interval. An
// upstream removed from the endpoint list stops taking connections and its
// open ones get --drain-timeout; re-adding it aborts the drain. With
// --health-check readyz each successful connect continues with GET /readyz:
// new connections prefer ready upstreams, and an unready upstream's
// connections are closed after --drain-timeout while another is ready.
// Beyond the spec, once every --rebalance-period one long-lived connection
// of the most loaded upstream closes at a quiet moment while they are
// skewed (rebalance.go).
//
// # Health server
//
// On --health-bind-address:--health-port: /healthz (503 once the run and
// accept loops have not beaten for --liveness-threshold), /readyz (200 while
// an upstream is healthy and not draining and, in an instance that took the
// sockets over from a running one, once its own check has passed an
// upstream), /metrics and /upstreams.
//
// # Metrics
//
// extractedprism_upstreams_active, _upstreams_total, _connections_active,
// _connections_total, _connection_errors_total{upstream},
// _discovery_updates_total{provider}, _discovery_errors_total{provider},
// _health_check_status{upstream}, and with the modes that produce them
// _upstream_rtt_seconds, _upstream_latency_tier and _upstream_ready; beyond
// the spec _hedged_dials_total, _hedged_dials_won_total,
// _dead_connections_closed_total, _clients_refused_total, _connection_limit,
// _upstream_dial_duration_seconds{upstream}, _upstream_connections{upstream},
// _drains_in_progress, _build_info, _health_connections_closed_total{reason}
// and _discovery_running{provider}; and the standard process_ and go_ ones.
//
// # Shutdown
//
// SIGINT or SIGTERM stops discovery, closes the listener, force-closes the
// proxied connections and waits up to 5 s for their goroutines, and gives
// the health server 5 s, an endpoint cache write 5 s and log lines 2 s more.
// The exit status is 0, or 1 if something outlasted its time or the health
// server had failed. A second signal ends the process at once; SIGHUP is
// logged and ignored, as nothing is reloaded.
package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

const shutdownTimeout = 5 * time.Second

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// With the handler gone after the first signal, a second one ends the
	// process at once, as an operator pressing ^C twice expects.
	context.AfterFunc(ctx, stop)
	err := run(ctx, os.Args[1:], os.Getenv, os.Environ, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		writeExitError(os.Stderr, err)
		os.Exit(exitCode(err))
	}
}

// run runs the command args name until ctx is done: the daemon, or the
// check, status or handover-dir subcommand. Help and version output are not
// errors. The environment is read through getenv; environ lists it, for the
// warning of EP_ variables no flag reads.
func run(ctx context.Context, args []string, getenv func(string) string, environ func() []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "status":
			return status(ctx, args[1:], getenv, stdout)
		case "check":
			return check(args[1:], getenv, environ, stdout)
		case "handover-dir":
			return handoverDir(args[1:], stdout)
		}
	}
	cfg, err := parseConfig(args, getenv, stdout)
	if err != nil {
		return configError(err, environ)
	}
	if err := cfg.caError(); err != nil {
		return err
	}
	level := logLevels()[cfg.LogLevel] // validated
	log, closeLog := startLogging(level, stderr)
	defer closeLog()
	// SIGHUP, which a closing terminal or a habitual "reload" sends, would
	// end the daemon as SIGTERM does; the run loop logs and ignores it, as
	// nothing is reloaded.
	hangups := make(chan os.Signal, 1)
	signal.Notify(hangups, syscall.SIGHUP)
	defer signal.Stop(hangups)
	for _, ig := range cfg.warnings(environ) {
		log.Warn("setting has no effect", "setting", ig.setting, "because", ig.because)
	}
	s, err := openSockets(ctx, cfg, getenv, log)
	if err != nil {
		return err
	}
	return newDaemon(cfg, log, s, hangups).run(ctx)
}

// daemon wires the parts together; run owns every goroutine it starts.
type daemon struct {
	cfg       *config
	log       *slog.Logger
	reg       *prometheus.Registry
	pool      *pool
	proxy     *proxy
	heartbeat *heartbeat
	discovery *mergedProvider
	cache     *endpointCache // nil without --endpoint-cache-file
	limitBy   string         // what sets the connection limit
	listen    string         // the proxy listener's address
	hangups   <-chan os.Signal
	// sockets are the listeners, and what keeps them open beyond the
	// process (listeners.go): all a reader needs of it when no socket is
	// passed or handed over is lb and health.
	sockets
}

// newDaemon makes the daemon that serves s.
func newDaemon(cfg *config, log *slog.Logger, s sockets, hangups <-chan os.Signal) *daemon {
	reg := prometheus.NewRegistry()
	m := newMetrics(reg)
	var sel selector = randomSelector{}
	if cfg.UpstreamSelection == selectLatency {
		sel = newLatencySelector(m)
	}
	pc := poolConfig{
		interval: cfg.HealthInterval, timeout: cfg.HealthTimeout, drainTimeout: cfg.DrainTimeout,
		quickRecheck: quickRecheck, jitter: probeJitter, sweep: true, readyz: cfg.HealthCheck == checkReadyz,
		closeSpread: closeSpread, rebalance: cfg.RebalancePeriod,
	}
	check := tcpCheck
	if cfg.HealthCheck == checkReadyz {
		rp := &readyzProbe{
			caFile: cfg.HealthCheckCAFile, certFile: cfg.HealthCheckCertFile, keyFile: cfg.HealthCheckKeyFile,
			tokenFile: cfg.HealthCheckTokenFile, serverName: cfg.HealthCheckServerName,
		}
		check, pc.forget = rp.check, rp.forget
	}
	d := &daemon{cfg: cfg, log: log, reg: reg, heartbeat: newHeartbeat(cfg.LivenessThreshold), listen: s.lb.Addr().String(), hangups: hangups, sockets: s}
	d.pool = newPool(log, m, pc, d.openShared(check), sel)
	limit, limitBy := maxConnections(openFilesLimit(), memoryLimit())
	d.proxy, d.limitBy = newProxy(log.With("component", "proxy"), m, d.pool, cfg.HealthTimeout, limit), limitBy
	d.lb.stalledSince = &d.proxy.stalledSince // the liveness beat reads it
	// A listening socket that outlives the process lets handlers outlive
	// serve (listeners.go).
	d.proxy.graceful = s.lbPassed || s.handover != nil
	d.discovery = d.newDiscovery(m)
	return d
}

// newDiscovery returns the merged provider: the static endpoints and, when
// enabled and credentials exist, the kubernetes provider, with the endpoint
// cache standing in for it until it answers. Without the kubernetes
// provider the cache is not used: nothing would ever replace its list,
// which may name API servers long gone.
func (d *daemon) newDiscovery(m *metrics) *mergedProvider {
	log := d.log.With("component", "discovery")
	if !d.cfg.EnableDiscovery {
		return newMergedProvider(log, m, d.cfg.Endpoints, nil)
	}
	// The listener's address, from Addr: a wildcard one is dialled on the
	// loopback of its family.
	host, port, _ := net.SplitHostPort(d.listen)
	kp, err := newKubernetesProvider(kubeProviderConfig{
		LocalAddr: net.JoinHostPort(dialableHost(host), port), Kubeconfig: d.cfg.Kubeconfig, ServerName: "kubernetes.default.svc",
	}, log.With("provider", kubeProviderName), m)
	if err != nil {
		// Asked for but off: the metrics say so from the first scrape
		// (ExtractedprismDiscoveryNotRunning); a log line is easy to miss.
		m.discoveryNotStarted(kubeProviderName)
		d.log.Warn("kubernetes discovery off, serving static endpoints only", "err", err)
		return newMergedProvider(log, m, d.cfg.Endpoints, nil)
	}
	var cached []string
	if d.cfg.EndpointCacheFile != "" {
		d.cache = &endpointCache{path: d.cfg.EndpointCacheFile, log: d.log.With("component", "cache")}
		cached = d.cache.loadCache()
	}
	return newMergedProvider(log, m, d.cfg.Endpoints, cached, kp)
}

func (d *daemon) run(ctx context.Context) error {
	d.logStart(d.lb.Addr().String(), d.health.Addr().String())
	mux := newHealthHandler(d.heartbeat.alive, d.ready, d.reg)
	handleReadOnly(mux, "/upstreams", upstreamsHandler(func() upstreamsDoc { return newUpstreamsDoc(d.cfg, d.pool.describe(d.discovery.sources())) }))
	srv := newHealthServer(d.health.Addr().String(), mux, d.log, d.proxy.m)
	// The static and cached endpoints are known before anything listens:
	// the first client never finds the pool empty.
	toCache := make(chan []string, 1)
	applied := d.apply(nil, toCache) //nolint:contextcheck // probes live as long as the pool, which run closes
	var wg, cacheWG sync.WaitGroup
	if d.cache != nil {
		cacheWG.Go(func() { d.cache.writer(ctx, toCache) })
	}
	wg.Go(func() { d.discovery.run(ctx) })
	served := make(chan struct{})
	wg.Go(func() { d.proxy.serve(ctx, d.lb); close(served) })
	var healthErr error
	wg.Go(func() { healthErr = serveHealth(ctx, srv, d.health, d.log) })
	if d.handover != nil {
		wg.Go(func() { d.handover.serve(ctx) })
	}
	if d.predecessor != nil {
		wg.Go(func() { d.follow(ctx) })
	}

	d.loop(ctx, applied, toCache)
	d.log.Info("shutting down", "cause", context.Cause(ctx).Error())
	<-served // serve returns once ctx is done; no connection starts after it
	d.stopGracefully()
	err := d.proxy.shutdown()
	d.pool.close()
	wg.Wait()
	// A write stuck in fsync on a hung volume must not hold the exit; the
	// write is atomic (see store), so the file keeps the last whole list.
	if !waitShutdown(cacheWG.Wait) {
		d.log.Warn("endpoint cache write still running at exit, left unfinished", "path", d.cache.path, "after", shutdownTimeout)
	}
	d.log.Info("stopped")
	return errors.Join(err, healthErr)
}

// ready backs /readyz: an upstream is usable, and this instance takes
// proxied connections, which a successor does only once its own check
// passed one (openShared).
func (d *daemon) ready() bool {
	return d.lb.isOpen() && d.pool.ready()
}

// waitShutdown runs wait, which waits for goroutines to end, for up to
// shutdownTimeout, and reports whether it returned. Goroutines still
// running then end with the process, as does the one running wait.
func waitShutdown(wait func()) bool {
	done := make(chan struct{})
	go func() { wait(); close(done) }()
	return !await(done, shutdownTimeout)
}

// logStart logs the start-up line, and a warning when the limits leave room
// for few proxied connections: past them, clients wait in the backlog.
func (d *daemon) logStart(listen, health string) {
	limit := cap(d.proxy.slots)
	d.log.Info("starting", "version", versionLine(), "listen", listen, "health", health, "endpoints", d.cfg.Endpoints,
		"max_connections", limit, "limited_by", d.limitBy, slog.Group("settings", d.cfg.settings()...))
	switch {
	case limit >= fewConnections:
	case d.limitBy == limitByMemory:
		d.log.Warn("the memory limit allows few proxied connections; raise it (the container's memory limit)",
			"max_connections", limit, "bytes_per_connection", memPerConn, "reserved_bytes", memReserve)
	default:
		d.log.Warn("the open-files limit allows few proxied connections; raise it (ulimit -n, LimitNOFILE)",
			"max_connections", limit, "descriptors_per_connection", fdsPerConn, "reserved_descriptors", fdReserve)
	}
}

// loop is the run loop: it applies endpoint lists to the pool and beats the
// liveness heartbeat until ctx is done. applied is the list last applied.
func (d *daemon) loop(ctx context.Context, applied []string, toCache chan []string) {
	t := time.NewTicker(d.cfg.LivenessInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.discovery.notify:
			applied = d.apply(applied, toCache) //nolint:contextcheck // as in run
		case <-t.C:
			d.beat()
		case <-d.hangups:
			d.log.Warn("SIGHUP ignored: the configuration is read only at start-up; restart the daemon to change it")
		}
	}
}

// apply gives the pool the union of the discovery sources, when it differs
// from applied and is not empty: the pool keeps its last upstreams rather
// than route to none. It returns the list now applied, and offers the
// discovered one to the cache writer.
func (d *daemon) apply(applied []string, toCache chan []string) []string {
	eps := withoutOwnListener(d.discovery.endpoints(), d.listen, d.log)
	if len(eps) == 0 || slices.Equal(eps, applied) {
		return applied
	}
	d.log.Info("endpoint list updated", "endpoints", eps)
	d.pool.update(eps)
	if d.cache != nil {
		offerLatest(toCache, d.discovery.discovered())
	}
	return eps
}

// beat proves the run loop, the pool and the accept loop are working. A
// pool that deadlocked blocks here, and a failing Accept skips the beat, so
// in both cases /healthz fails once --liveness-threshold has passed.
func (d *daemon) beat() {
	d.pool.mu.Lock()
	d.pool.mu.Unlock() //nolint:staticcheck // an empty critical section is the point
	if stalled := d.proxy.acceptStalledFor(); stalled > 0 {
		d.log.Warn("liveness beat skipped: accept failing", "for", stalled)
		return
	}
	d.heartbeat.beat()
}
