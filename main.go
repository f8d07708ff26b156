// Command extractedprism is a per-node TCP load balancer for the Kubernetes
// API server. Every node runs one, bound to 127.0.0.1:7445, and the node's
// kubelet, kube-proxy and CNI agent reach the API through it. It forwards
// each connection to a healthy API server, so a control-plane node that dies,
// hangs or restarts costs the node nothing but the connections that were
// open to it. There is no shared VIP, no leader election and no capability.
//
// # Running
//
//	extractedprism --endpoints 10.0.0.1:6443,10.0.0.2:6443,10.0.0.3:6443
//
// The kubelet's balancer runs as a systemd unit or a static pod: the kubelet
// learns of DaemonSet pods from the API, so it would lose the API for good
// the first time a DaemonSet pod that carries its connections went away.
//
// Every flag has an EP_* environment variable (--bind-port is EP_BIND_PORT).
// A flag given on the command line wins over its variable, which wins over
// the default. Invalid values stop the program before it listens, with a
// message that names the flag and the variable. Ports are decimal. Run
// --help for the full list:
//
//	--bind-address          EP_BIND_ADDRESS          127.0.0.1   proxy listener address
//	--bind-port             EP_BIND_PORT             7445        proxy listener port
//	--health-bind-address   EP_HEALTH_BIND_ADDRESS   (bind)      health server address
//	--health-port           EP_HEALTH_PORT           7446        health server port
//	--endpoints             EP_ENDPOINTS             (required)  static API servers, host:port,...
//	--health-interval       EP_HEALTH_INTERVAL       20s         between upstream health checks
//	--health-timeout        EP_HEALTH_TIMEOUT        15s         per check, and per upstream dial
//	--enable-discovery      EP_ENABLE_DISCOVERY      true        follow the kubernetes EndpointSlice
//	--kubeconfig            EP_KUBECONFIG            (none)      credentials for discovery outside a pod
//	--endpoint-cache-file   EP_ENDPOINT_CACHE_FILE   (none)      keep the discovered list across restarts
//	--log-level             EP_LOG_LEVEL             info        debug|info|warn|error|dpanic|panic|fatal
//	--liveness-interval     EP_LIVENESS_INTERVAL     5s          heartbeat period
//	--liveness-threshold    EP_LIVENESS_THRESHOLD    15s         heartbeat age at which /healthz fails
//	--drain-timeout         EP_DRAIN_TIMEOUT         30s         grace for connections of removed upstreams
//	--upstream-selection    EP_UPSTREAM_SELECTION    random      random|latency
//	--health-check          EP_HEALTH_CHECK          tcp         tcp|readyz
//	--health-check-ca-file, -cert-file, -key-file, -token-file, -server-name: readyz probe TLS
//	--version                                                    print version and exit
//
// A setting with no effect in the configuration given (--kubeconfig and
// --endpoint-cache-file without discovery, the readyz files with tcp checks)
// is logged as a warning at start-up.
//
// # Data path
//
// Each client connection is joined to one upstream and bytes are copied both
// ways, small bursts through a reused buffer and bulk with splice(2); a
// half-close is passed on. A dial that fails before
// any byte was forwarded is retried on another pickable upstream, each at
// most once. When no upstream is pickable, the known non-draining ones are
// tried anyway, most recently healthy first. Proxied connections are bounded
// by the open-files limit less a reserve of 256 descriptors, each connection
// counting four (two sockets, one splice pipe borrowed while bytes move; an
// idle connection holds only its sockets), and by the memory limit of its
// cgroup or of one above it, less 24 MiB, each counting 32 KiB (never below
// 64); at the bound new clients wait in the listen backlog. Accept errors
// such as EMFILE back off and retry. An endpoint that is the proxy's own
// listener is refused in --endpoints and dropped from every other source.
//
// # Upstream health
//
// Each upstream is checked by a TCP connect every --health-interval, with its
// own --health-timeout deadline, in its own goroutine. Two consecutive
// failures (checks or client dials) exclude it; one success re-includes it.
// An upstream removed from the endpoint list stops taking connections and
// its open ones get --drain-timeout to finish; re-adding it aborts the drain.
//
// # Selection and black holes
//
// --upstream-selection random picks uniformly among healthy upstreams;
// latency prefers the lowest tier of smoothed connect times (see the README
// for the exact rule). A dial slower than the hedge delay (4x the slowest
// connect time of the preferred tier, 50-500 ms) gets a second dial to
// another upstream; the first to connect wins, and the upstream of a dial
// called off after that long is checked at once. A failed check or dial of
// an included upstream is confirmed after 1 s or at once, and from the
// first failure until the next success the upstream's sockets get 1 s
// keepalive and a 3 s TCP_USER_TIMEOUT, so connections to a vanished peer
// close within seconds; 3.5 s in, those still retransmitting data without
// an ACK for 3 s (TCP_INFO) are closed too, as the kernel applies the new
// timeout only at their next retry.
//
// # Readiness
//
// With --health-check readyz, each successful TCP check continues with an
// HTTPS GET /readyz on the same connection; two failed probes mark the
// upstream not ready, or one after a failed connect. New connections prefer
// ready upstreams (all healthy ones when none is ready), and among those the
// ones without a failed connect since their last probe; an unready
// upstream's connections are closed after --drain-timeout while another
// upstream is ready. Credentials are re-read on every probe.
//
// # Health server
//
// On --health-bind-address:--health-port: /healthz (liveness: the run loop
// and the proxy beat every --liveness-interval; 503 once the last beat is
// older than --liveness-threshold, or when discovery has exited; the beats
// stop while Accept fails), /readyz (200 while an upstream is healthy and
// not draining), /metrics (Prometheus) and /upstreams (each upstream's
// state, JSON or text/plain). GET and HEAD only. The health server holds at
// most 64 connections, closing the longest-waiting idle one (or one stuck in
// a request for 3 s) to make room, and backs off and retries when its
// Accept fails. "extractedprism status"
// prints the /upstreams table of the daemon on this node.
//
// # Endpoint cache
//
// With --endpoint-cache-file the last discovered endpoint list is written
// atomically whenever it changes and used at start, beside the static
// endpoints, until discovery answers. A corrupt cache is logged and ignored,
// as is one over 64 KiB or 64 entries or with an address discovery would not
// keep (discovery leaves out unspecified, link-local, multicast, broadcast
// and zoned addresses, and keeps at most 64), and so is the cache when
// discovery cannot start (no credentials, or a --kubeconfig that does not
// load, which is logged as an error). Discovery never replaces the list with
// an empty one: while the slices hold no endpoint, the last list stays.
//
// # Metrics
//
// extractedprism_upstreams_active, _upstreams_total, _connections_active,
// _connections_total, _connection_errors_total{upstream},
// _discovery_updates_total{provider}, _discovery_errors_total{provider},
// _health_check_status{upstream}, _hedged_dials_total,
// _hedged_dials_won_total, _dead_connections_closed_total,
// _clients_refused_total, _connection_limit,
// _upstream_dial_duration_seconds{upstream}, _upstream_connections{upstream},
// _drains_in_progress, _build_info{version,revision,goversion},
// _health_connections_closed_total{reason},
// _discovery_running{provider}, and with the
// modes that produce them _upstream_rtt_seconds, _upstream_latency_tier and
// _upstream_ready. Each provider's update and error series exist from the
// start at 0, and its _discovery_running from the moment discovery starts,
// just after the health server; with --enable-discovery the kubernetes ones
// exist even when discovery cannot start, which shows as
// _discovery_running{provider="kubernetes"} 0 and one error. deploy/prometheus/alerts.yaml alerts on that
// (ExtractedprismDiscoveryNotRunning) and on failing discovery.
//
// # Shutdown
//
// SIGINT or SIGTERM stops discovery, closes the listener, force-closes the
// proxied connections, waits up to 5 s for their goroutines and gives the
// health server 5 s to finish. An endpoint cache write still under way
// gets 5 s as well; one stuck longer (fsync on a hung volume) is left
// unfinished, which keeps the cache file's last complete list. Log lines
// still queued for stderr get 2 s more. The exit status is 0, or 1 if the
// goroutines outlast the 5 s or the health server had failed. SIGHUP is logged and ignored: nothing is
// reloaded.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Version and Revision are set at build time with
// -ldflags "-X main.Version=... -X main.Revision=...".
var Version, Revision string

const shutdownTimeout = 5 * time.Second

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// The first signal starts the shutdown; with the handler gone, a
	// second one ends the process at once, as an operator pressing ^C
	// twice expects.
	context.AfterFunc(ctx, stop)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		// A log reader that stopped reading must not hold the exit:
		// the line gets as long as the log sink's flush, then the
		// process ends without it.
		written := make(chan struct{})
		go func() { fmt.Fprintln(os.Stderr, "extractedprism:", err); close(written) }()
		select {
		case <-written:
		case <-time.After(logFlushTimeout):
		}
		os.Exit(1)
	}
}

// run parses the configuration, opens both listeners and serves until ctx is
// done. Help and version output are not errors. "extractedprism status"
// prints the upstream table of a running daemon instead.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "status" {
		return status(ctx, args[1:], getenv, stdout)
	}
	if len(args) > 0 && args[0] == "check" {
		return check(args[1:], getenv, stdout)
	}
	cfg, err := parseConfig(args, getenv, stdout)
	if errors.Is(err, flag.ErrHelp) || errors.Is(err, errVersionShown) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := checkReadyzCA(cfg); err != nil {
		return err
	}
	level, err := parseLogLevel(cfg.LogLevel)
	if err != nil {
		return err
	}
	// A write to a closed stderr (a log shipper or `| tee` that went away)
	// would kill the daemon with SIGPIPE and drop every proxied connection.
	// With SIGPIPE notified the write just fails. Unlike signal.Ignore, this
	// is not inherited by programs the daemon starts (a kubeconfig
	// credential plugin), and the status command keeps the default.
	pipes := make(chan os.Signal, 1)
	signal.Notify(pipes, syscall.SIGPIPE)
	sink := newLogSink(stderr)
	log := newLogger(level, sink)
	go sink.run()
	// Deferred before the rest so it runs after them: every goroutine that
	// logs has ended, and the last lines ("stopped", an error) get written.
	// A writer still stuck after the flush's bound may yet meet a closed
	// pipe, so SIGPIPE then stays caught until the process ends.
	defer func() {
		if sink.close(logFlushTimeout) {
			signal.Stop(pipes)
		}
	}()
	// SIGHUP, which a closing terminal or a habitual "reload" sends, would
	// end the daemon the same way. Nothing is reloaded (the configuration
	// is read once), so it is logged and otherwise ignored.
	hangups := make(chan os.Signal, 1)
	signal.Notify(hangups, syscall.SIGHUP)
	defer signal.Stop(hangups)
	var wg sync.WaitGroup
	hctx, cancel := context.WithCancel(ctx)
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { noteHangups(hctx, log, hangups) })
	for _, ig := range cfg.ignoredSettings() {
		log.Warn("setting has no effect", "setting", flagRef(ig.flag), "because", ig.because)
	}
	lbLn, err := listenTCP(ctx, net.JoinHostPort(cfg.BindAddress, strconv.Itoa(cfg.BindPort)))
	if err != nil {
		return fmt.Errorf("load balancer listener (--bind-address, --bind-port): %w", err)
	}
	healthAddr := net.JoinHostPort(cfg.HealthBindAddress, strconv.Itoa(cfg.HealthPort))
	var lc net.ListenConfig
	healthLn, err := lc.Listen(ctx, "tcp", healthAddr)
	if err != nil {
		_ = lbLn.Close()
		return fmt.Errorf("health server listener (--health-bind-address, --health-port): %w", err)
	}
	d := newDaemon(cfg, log, lbLn.Addr().String())
	return d.run(ctx, lbLn, healthLn)
}

// check is the "extractedprism check" command: it reads the flags and EP_
// variables exactly as a start would and reports what a start would refuse,
// with the same messages, binding nothing. Settings that would have no
// effect are listed as warnings; they do not fail the check.
func check(args []string, getenv func(string) string, stdout io.Writer) error {
	cfg, err := parseConfig(args, getenv, stdout)
	if errors.Is(err, flag.ErrHelp) || errors.Is(err, errVersionShown) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, ig := range cfg.ignoredSettings() {
		fmt.Fprintf(stdout, "warning: %s has no effect: %s\n", flagRef(ig.flag), ig.because)
	}
	fmt.Fprintln(stdout, "extractedprism check: configuration is valid")
	return nil
}

// noteHangups logs each SIGHUP on hangups until ctx is done.
func noteHangups(ctx context.Context, log *slog.Logger, hangups <-chan os.Signal) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hangups:
			log.Warn("SIGHUP ignored: the configuration is read only at start-up; restart the daemon to change it")
		}
	}
}

// checkReadyzCA fails start-up when readyz probes are on and their CA is
// unreadable: unlike a credential, which may appear later, the CA is needed
// from the first probe. Probes still re-read it, so it can rotate.
func checkReadyzCA(cfg *config) error {
	if cfg.HealthCheck != checkReadyz {
		return nil
	}
	if _, err := (&readyzProbe{caFile: cfg.HealthCheckCAFile}).tlsConfig(); err != nil {
		return fmt.Errorf("--health-check-ca-file (EP_HEALTH_CHECK_CA_FILE): %w", err)
	}
	return nil
}

// daemon wires the parts together. run owns every goroutine it starts.
type daemon struct {
	cfg       *config
	log       *slog.Logger
	reg       *prometheus.Registry
	pool      *pool
	proxy     *proxy
	heartbeat *heartbeat
	discovery *mergedProvider
	cache     *endpointCache // nil without --endpoint-cache-file
	// seed is the endpoint list known before anything listens: the static
	// endpoints and the cached ones.
	seed []string
	// limitBy says what sets the proxy's connection limit (maxConnections).
	limitBy string
	// listen is the proxy listener's address, for withoutOwnListener.
	listen string
	// released is when beat last returned freed memory to the kernel and
	// how many connections had closed then; only the run loop uses it.
	released memoryRelease
}

// Many closed connections leave their goroutine stacks and buffers free
// inside the process: the runtime returns such memory only slowly, and only
// after a collection, which an idle daemon may not run for two minutes. So
// once the open connections have dropped by releaseAfterDrop below their
// highest count since the last release, the next beat collects and returns
// the memory at once, at most every releaseMinInterval. Connections that
// come and go at a steady count reuse that memory, so they do not trigger it.
const (
	releaseAfterDrop   = 1000
	releaseMinInterval = 10 * time.Second
)

// memoryRelease is the beat's record of the last release.
type memoryRelease struct {
	at   time.Time // of the last release
	high int       // the most connections open at once since then
}

// due folds peak, the most connections open at once since the last call,
// into the record and reports whether memory should be released now, with
// open connections open.
func (r *memoryRelease) due(now time.Time, open, peak int) bool {
	r.high = max(r.high, peak, open)
	return r.high-open >= releaseAfterDrop && now.Sub(r.at) >= releaseMinInterval
}

func newDaemon(cfg *config, log *slog.Logger, lbAddr string) *daemon {
	reg := prometheus.NewRegistry()
	m := newMetrics(reg)
	registerRuntimeMetrics(reg)
	var sel selector = randomSelector{}
	if cfg.UpstreamSelection == selectLatency {
		sel = newLatencySelector(m)
	}
	check := tcpCheck
	if cfg.HealthCheck == checkReadyz {
		check = (&readyzProbe{
			caFile:     cfg.HealthCheckCAFile,
			certFile:   cfg.HealthCheckCertFile,
			keyFile:    cfg.HealthCheckKeyFile,
			tokenFile:  cfg.HealthCheckTokenFile,
			serverName: cfg.HealthCheckServerName,
		}).check
	}
	pl := newPool(log, m, poolConfig{
		interval:     cfg.HealthInterval,
		timeout:      cfg.HealthTimeout,
		drainTimeout: cfg.DrainTimeout,
		quickRecheck: quickRecheck,
		sweep:        true,
		readyz:       cfg.HealthCheck == checkReadyz,
	}, check, sel)
	var cache *endpointCache
	if cfg.EndpointCacheFile != "" && cfg.EnableDiscovery {
		cache = &endpointCache{path: cfg.EndpointCacheFile, log: log.With("component", "cache")}
	}
	ps := providers(cfg, log, m, lbAddr, cache)
	limit, limitBy := maxConnections(openFilesLimit(), memoryLimit())
	seed := slices.Clone(cfg.Endpoints)
	for _, p := range ps {
		if cp, ok := p.(*cacheProvider); ok {
			seed = unionEndpoints([][]string{seed, cp.endpoints})
		}
	}
	return &daemon{
		cfg:       cfg,
		log:       log,
		reg:       reg,
		pool:      pl,
		proxy:     newProxy(log.With("component", "proxy"), m, pl, cfg.HealthTimeout, limit),
		limitBy:   limitBy,
		heartbeat: newHeartbeat(cfg.LivenessThreshold),
		discovery: newMergedProvider(log.With("component", "discovery"), m, ps...),
		cache:     cache,
		seed:      seed,
		listen:    lbAddr,
	}
}

// withoutOwnListener returns eps without the endpoints that are this
// proxy's own listener (see ownListener), warning of them. Static ones are
// refused at start-up; these come from discovery or the endpoint cache.
func (d *daemon) withoutOwnListener(eps []string) []string {
	local := localAddrs() // read again each time: the node may have gained one
	var dropped []string
	kept := slices.DeleteFunc(slices.Clone(eps), func(e string) bool {
		own := ownListener(e, d.listen, local)
		if own {
			dropped = append(dropped, e)
		}
		return own
	})
	if len(dropped) > 0 {
		d.log.Warn("ignoring endpoints that are this proxy's own listener", "endpoints", dropped, "listen", d.listen)
	}
	return kept
}

// providers returns the static provider and, when enabled and credentials
// exist, the Kubernetes provider, with the endpoint cache standing in for it
// until it answers. Without the Kubernetes provider the cache is not used:
// nothing would ever replace its list, which may name API servers long gone.
// When it is enabled but cannot start, its metric series are created with
// discovery_running 0 and one error.
func providers(cfg *config, log *slog.Logger, m *metrics, lbAddr string, cache *endpointCache) []provider {
	ps := []provider{newStaticProvider(cfg.Endpoints)}
	if !cfg.EnableDiscovery {
		return ps
	}
	kp, err := newKubernetesProvider(kubeProviderConfig{
		LocalAddr:  dialableAddr(lbAddr),
		Kubeconfig: cfg.Kubeconfig,
		ServerName: "kubernetes.default.svc",
	}, log.With("component", "discovery", "provider", "kubernetes"), m)
	if err != nil {
		// Asked for but off: say so in the metrics from the first scrape
		// (ExtractedprismDiscoveryNotRunning), as the log line is easy to miss.
		m.discoveryNotStarted(kubeProviderName)
	}
	switch {
	case errors.Is(err, errNoKubeCredentials):
		log.Warn("kubernetes discovery off, serving static endpoints only", "err", err)
		return ps
	case err != nil:
		// Credentials were there, or asked for with --kubeconfig, and
		// failed: a mistake to fix, but the static endpoints still serve.
		log.Error("kubernetes discovery off, serving static endpoints only", "err", err)
		return ps
	}
	if cache != nil {
		ps = append(ps, newCacheProvider(cache))
	}
	return append(ps, kp)
}

// dialableAddr turns a wildcard listen address into a loopback one the
// discovery client can dial.
func dialableAddr(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return net.JoinHostPort(dialableHost(host), port)
}

// dialableHost maps a wildcard address to the loopback of its family.
func dialableHost(host string) string {
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		if ip.To4() != nil {
			return "127.0.0.1"
		}
		return "::1"
	}
	return host
}

func (d *daemon) run(ctx context.Context, lbLn, healthLn net.Listener) error {
	d.logStart(lbLn.Addr().String(), healthLn.Addr().String())
	mux := newHealthHandler(d.heartbeat.alive, d.pool.ready, d.reg)
	mux.Handle("/upstreams", readOnly(upstreamsHandler(d.describe)))
	srv := newHealthServer(healthLn.Addr().String(), mux, d.log, d.proxy.m)
	// The static and cached endpoints are known before anything listens:
	// seed the pool with them so the first client never finds it empty.
	// Discovery sends the same list again, which changes nothing.
	d.pool.update(d.withoutOwnListener(d.seed)) //nolint:contextcheck // probes live as long as the pool, which run closes
	updates := make(chan []string)
	discDone := make(chan error, 1)
	var healthErr error
	var wg sync.WaitGroup
	// The cache writer is waited for apart and for at most shutdownTimeout
	// (see below): a write stuck in fsync, on a hung network volume, must
	// not hold the exit.
	var cacheWG sync.WaitGroup
	toCache := make(chan []string, 1)
	if d.cache != nil {
		cacheWG.Go(func() { d.cacheWriter(ctx, toCache) })
	}
	wg.Go(func() { discDone <- d.discovery.run(ctx, updates) })
	served := make(chan struct{})
	wg.Go(func() { d.proxy.serve(ctx, lbLn); close(served) })
	wg.Go(func() { healthErr = serveHealth(ctx, srv, healthLn, d.log) })

	d.loop(ctx, updates, discDone, toCache)
	d.log.Info("shutting down", "cause", context.Cause(ctx).Error())

	<-served // serve returns once ctx is done; no connection starts after it
	err := d.proxy.shutdown()
	d.pool.close()
	wg.Wait()
	if !waitShutdown(cacheWG.Wait) {
		// The write is atomic (see endpointCache.store): the file keeps
		// the last complete list, and a temporary file may stay beside it.
		d.log.Warn("endpoint cache write still running at exit, left unfinished", "path", d.cache.path, "after", shutdownTimeout)
	}
	d.log.Info("stopped")
	return errors.Join(err, healthErr)
}

// waitShutdown runs wait, which waits for goroutines to end, for up to
// shutdownTimeout, and reports whether it returned. Goroutines still
// running then end with the process, as does the one running wait.
func waitShutdown(wait func()) bool {
	done := make(chan struct{})
	go func() { wait(); close(done) }()
	t := time.NewTimer(shutdownTimeout)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// logStart logs the start-up line, and a warning when the open-files
// limit leaves room for only a few proxied connections: past them, clients
// wait in the listen backlog.
func (d *daemon) logStart(listen, health string) {
	limit := cap(d.proxy.slots)
	d.log.Info("starting", "listen", listen, "health", health, "endpoints", d.cfg.Endpoints,
		"max_connections", limit, "limited_by", d.limitBy)
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

// fewConnections is the connection limit below which start-up warns.
const fewConnections = 64

// loop is the run loop: it applies endpoint lists to the pool and beats the
// liveness heartbeat until ctx is done.
func (d *daemon) loop(ctx context.Context, updates <-chan []string, discDone <-chan error, toCache chan []string) {
	t := time.NewTicker(d.cfg.LivenessInterval)
	defer t.Stop()
	summary := time.NewTicker(summaryInterval)
	defer summary.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-summary.C:
			d.logSummary()
		case eps := <-updates:
			eps = d.withoutOwnListener(eps)
			d.log.Info("endpoint list updated", "endpoints", eps)
			d.pool.update(eps) //nolint:contextcheck // probes live as long as the pool, which run closes
			if d.cache != nil {
				offerLatest(toCache, d.discovered())
			}
		case err := <-discDone:
			if ctx.Err() != nil {
				return
			}
			d.log.Error("discovery pipeline exited", "err", err)
			d.heartbeat.fail("discovery pipeline exited")
			discDone = nil
		case <-t.C:
			d.beat()
		}
	}
}

// summaryInterval is how often a debug line sums up the upstreams, so a
// debug log shows the state even while nothing changes.
const summaryInterval = 5 * time.Minute

func (d *daemon) logSummary() {
	st := d.describe()
	healthy, conns := 0, 0
	for _, s := range st {
		if s.Healthy {
			healthy++
		}
		conns += s.Connections
	}
	d.log.Debug("summary", "upstreams", len(st), "healthy", healthy, "connections", conns)
}

// describe is the state of every upstream, for /upstreams.
func (d *daemon) describe() []upstreamStatus {
	return d.pool.describe(d.discovery.sources())
}

// discovered is the current list of the kubernetes provider, nil if it has
// not answered.
func (d *daemon) discovered() []string {
	var eps []string
	for addr, srcs := range d.discovery.sources() {
		if slices.Contains(srcs, kubeProviderName) {
			eps = append(eps, addr)
		}
	}
	slices.Sort(eps)
	return eps
}

// offerLatest hands list to the cache writer without blocking the run loop,
// replacing a list the writer has not taken yet. The run loop is the only
// sender.
func offerLatest(ch chan []string, list []string) {
	if len(list) == 0 {
		return
	}
	select {
	case <-ch:
	default:
	}
	ch <- list
}

// cacheWriter writes each discovered list that differs from the last one
// written. It runs apart from the run loop, so a slow disk delays the
// cache, not the liveness heartbeat.
func (d *daemon) cacheWriter(ctx context.Context, lists <-chan []string) {
	var written []string
	for {
		select {
		case <-ctx.Done():
			return
		case eps := <-lists:
			if slices.Equal(eps, written) {
				continue
			}
			if err := d.cache.store(eps); err != nil {
				d.log.Warn("endpoint cache not written", "err", err)
				continue
			}
			written = eps
			d.log.Debug("endpoint cache written", "endpoints", eps)
		}
	}
}

// beat proves the run loop, the pool and the accept loop are working. A
// pool that deadlocked blocks here, and a failing Accept skips the beat, so
// in both cases /healthz fails once --liveness-threshold has passed.
func (d *daemon) beat() {
	d.pool.responsive()
	if now, open := time.Now(), d.proxy.open(); d.released.due(now, open, d.proxy.takePeak()) {
		d.released = memoryRelease{at: now, high: open}
		debug.FreeOSMemory()
	}
	if stalled := d.proxy.acceptStalledFor(); stalled > 0 {
		d.log.Warn("liveness beat skipped: accept failing", "for", stalled)
		return
	}
	d.heartbeat.beat()
}

// status is the "extractedprism status" command: it asks the daemon's health
// server for /upstreams and prints the table. The address comes from
// --health-address, else from EP_HEALTH_BIND_ADDRESS (or EP_BIND_ADDRESS)
// and EP_HEALTH_PORT, else 127.0.0.1:7446.
func status(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := flag.NewFlagSet("extractedprism status", flag.ContinueOnError)
	fs.SetOutput(stdout)
	addr := fs.String("health-address", defaultHealthAddress(getenv), "host:port of the daemon's health server")
	asJSON := fs.Bool("json", false, "print the JSON document instead of the table")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+*addr+"/upstreams", nil)
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	if !*asJSON {
		req.Header.Set("Accept", "text/plain")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status: %s answered %s", *addr, resp.Status)
	}
	if _, err := io.Copy(stdout, io.LimitReader(resp.Body, 1<<20)); err != nil {
		return fmt.Errorf("status: %w", err)
	}
	return nil
}

func defaultHealthAddress(getenv func(string) string) string {
	host := cmp.Or(getenv("EP_HEALTH_BIND_ADDRESS"), getenv("EP_BIND_ADDRESS"), "127.0.0.1")
	return net.JoinHostPort(dialableHost(host), cmp.Or(getenv("EP_HEALTH_PORT"), "7446"))
}
