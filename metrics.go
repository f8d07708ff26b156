package main

import (
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics is the daemon's Prometheus metric set, registered on a private
// registry (never the global one), so tests can run many daemons at once
// and read exact values.
type metrics struct {
	upstreamsActive, upstreamsTotal, connectionsActive prometheus.Gauge
	connectionsTotal                                   prometheus.Counter
	// By upstream: connectionErrors; by provider: discoveryUpdates and
	// discoveryErrors.
	connectionErrors, discoveryUpdates, discoveryErrors *prometheus.CounterVec
	// By upstream; upstreamRTT and upstreamTier with latency selection,
	// upstreamReady with readyz checks only.
	upstreamRTT, upstreamTier, upstreamReady, healthStatus *prometheus.GaugeVec

	// Beyond the spec.
	hedgedDials, hedgedWins, deadConnsClosed, clientsRefused prometheus.Counter
	connLimit, drains                                        prometheus.Gauge
	dialSeconds                                              *prometheus.HistogramVec // upstream
	upstreamConns                                            *prometheus.GaugeVec     // upstream
	discoveryRunning                                         *prometheus.GaugeVec     // provider
	healthConnsClosed                                        *prometheus.CounterVec   // reason: one of rankReasons
	idleConnsClosed                                          *prometheus.CounterVec   // reason: reasonLimit, reasonTimeout or reasonShare
	upstreamBytes                                            *prometheus.CounterVec   // upstream, direction: dirToUpstream or dirToClient
	connsClosed                                              *prometheus.CounterVec   // upstream, reason: one of endReasons
}

const (
	metricNamespace = "extractedprism"
	labelUpstream   = "upstream"
	labelProvider   = "provider"

	// The directions of upstreamBytes.
	dirToUpstream = "to_upstream"
	dirToClient   = "to_client"
)

func gauge(name, help string) prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: metricNamespace, Name: name, Help: help})
}

func counter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Namespace: metricNamespace, Name: name, Help: help})
}

func gaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: metricNamespace, Name: name, Help: help}, labels)
}

func counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: metricNamespace, Name: name, Help: help}, labels)
}

// newMetrics creates the metric set and registers it on reg.
func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		upstreamsActive:   gauge("upstreams_active", "Upstreams eligible for new connections (healthy, not draining)."),
		upstreamsTotal:    gauge("upstreams_total", "Total known upstreams, including unhealthy and draining."),
		connectionsActive: gauge("connections_active", "TCP connections currently passing through the proxy."),
		connectionsTotal:  counter("connections_total", "Connections established to upstreams since start."),
		connectionErrors: counterVec("connection_errors_total",
			"Failed connection attempts to an upstream; none while no upstream is available, none caused by shutdown.", labelUpstream),
		discoveryUpdates: counterVec("discovery_updates_total", "Endpoint list updates received, per discovery provider.", labelProvider),
		discoveryErrors: counterVec("discovery_errors_total",
			"Discovery errors: provider failures (a kubernetes provider that cannot start counts once), failed List and Watch calls, watch error events (not 410 Gone).", labelProvider),
		upstreamRTT: gaugeVec("upstream_rtt_seconds",
			"Smoothed health check connect time, including name resolution for hostname endpoints.", labelUpstream),
		upstreamTier:  gaugeVec("upstream_latency_tier", "Latency tier of the upstream, 0 being the closest group.", labelUpstream),
		upstreamReady: gaugeVec("upstream_ready", "/readyz probe state after the consecutive-failure threshold (1 ready, 0 not ready).", labelUpstream),
		healthStatus: gaugeVec("health_check_status",
			"Upstream health state after the consecutive-failure threshold (1 healthy, 0 unhealthy).", labelUpstream),
	}
	m.addBeyondSpec()
	buildInfo := gaugeVec("build_info", "Always 1; the labels say which build is running.", "version", "revision", "goversion")
	reg.MustRegister(
		m.upstreamsActive, m.upstreamsTotal, m.connectionsActive, m.connectionsTotal, m.connectionErrors,
		m.discoveryUpdates, m.discoveryErrors, m.upstreamRTT, m.upstreamTier, m.upstreamReady, m.healthStatus,
		m.hedgedDials, m.hedgedWins, m.deadConnsClosed, m.clientsRefused, m.connLimit,
		m.dialSeconds, m.upstreamConns, m.drains, buildInfo, m.healthConnsClosed, m.discoveryRunning, m.idleConnsClosed,
		m.upstreamBytes, m.connsClosed,
		// The standard process_ and go_ metrics, which dashboards for any
		// Go service chart. Their twins in prometheus/collectors would
		// link database/sql into the binary.
		prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}), //nolint:staticcheck // see above
		prometheus.NewGoCollector(),                                       //nolint:staticcheck // see above
	)
	version, revision := versionInfo()
	buildInfo.WithLabelValues(version, revision, runtime.Version()).Set(1)
	return m
}

// addBeyondSpec creates the metrics the spec does not name.
func (m *metrics) addBeyondSpec() {
	m.hedgedDials = counter("hedged_dials_total", "Second dials started because the first dial of a connection was slower than the hedge delay.")
	m.hedgedWins = counter("hedged_dials_won_total", "Hedged dials that connected first and carried the connection.")
	m.deadConnsClosed = counter("dead_connections_closed_total",
		"Proxied connections closed because the kernel timed out a peer, usually the upstream (keepalive or TCP_USER_TIMEOUT), or because the sweep found their upstream had stopped acknowledging their data.")
	m.clientsRefused = counter("clients_refused_total",
		"Client connections closed because no upstream could be dialled, last-resort dials included; not during shutdown.")
	m.connLimit = gauge("connection_limit",
		"Most client connections proxied at once, from the open-files limit and the cgroup's memory limit; beyond it new clients wait in the listen backlog.")
	m.dialSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: metricNamespace, Name: "upstream_dial_duration_seconds",
		Help:    "Time to connect to an upstream for a client connection, successful dials only.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{labelUpstream})
	m.upstreamConns = gaugeVec("upstream_connections", "Proxied connections currently open to the upstream.", labelUpstream)
	m.drains = gauge("drains_in_progress", "Removed upstreams whose connections are still draining.")
	m.healthConnsClosed = counterVec("health_connections_closed_total",
		"Health server connections closed at its connection limit, the first of: reason=stalled, one waiting on its client (blocked writing an answer it does not read, reading a request it trickles, or over a second in a request); reason=waiting, an idle one; reason=busy, one inside a request; reason=new, the new one, when every other was accepted with its request but not yet read.", "reason")
	// Every series exists from the start, so that rates over them work
	// before the first closing.
	for _, reason := range rankReasons() {
		m.healthConnsClosed.WithLabelValues(reason)
	}
	m.idleConnsClosed = counterVec("idle_connections_closed_total",
		"Proxied connections closed for silence: reason=limit, at the connection limit to make room for a waiting client; reason=timeout, silent both ways for 10 minutes; reason=share, at the connection limit, none silent, one of the non-root owner (uid, or address) holding the most slots.", "reason")
	m.idleConnsClosed.WithLabelValues(reasonLimit)
	m.idleConnsClosed.WithLabelValues(reasonShare)
	m.idleConnsClosed.WithLabelValues(reasonTimeout)
	m.upstreamBytes = counterVec("upstream_bytes_total",
		"Bytes proxied between clients and the upstream: direction=to_upstream, from clients; direction=to_client, from the upstream. Counted every MiB of a direction and at its end.", labelUpstream, "direction")
	m.connsClosed = counterVec("connections_closed_total",
		"Proxied connections of the upstream that ended, by how: client_closed, upstream_closed (a clean end that side started), reset, timeout (the kernel gave up on a silent peer), error, drain, eviction (unready while another was ready), sweep, idle, shutdown, rebalance (a long-lived connection moved off the most loaded upstream).", labelUpstream, "reason")
	m.discoveryRunning = gaugeVec("discovery_running",
		"1 while the discovery provider runs; 0 once it is enabled but could not start, while its credentials do not load or are refused (401, 403), or after it stopped before shutdown. The kubernetes series exists only with --enable-discovery.", labelProvider)
}

// discoverySeries creates the update and error series of provider name at
// 0, so that increase and rate over them work from the first scrape.
func (m *metrics) discoverySeries(name string) {
	m.discoveryUpdates.WithLabelValues(name)
	m.discoveryErrors.WithLabelValues(name)
}

// discoveryNotStarted records that provider name is enabled but could not
// start: one error, and running 0. Without it the provider would have no
// series at all, and no alert over them could fire while the node followed
// only its static endpoints.
func (m *metrics) discoveryNotStarted(name string) {
	m.discoverySeries(name)
	m.discoveryErrors.WithLabelValues(name).Inc()
	m.discoveryRunning.WithLabelValues(name).Set(0)
}

// forgetUpstream deletes every per-upstream series of addr, once it has
// drained and left the pool, as the spec requires.
func (m *metrics) forgetUpstream(addr string) {
	for _, v := range []interface{ DeletePartialMatch(l prometheus.Labels) int }{
		m.connectionErrors, m.upstreamRTT, m.upstreamTier, m.upstreamReady, m.healthStatus, m.dialSeconds, m.upstreamConns,
		m.upstreamBytes, m.connsClosed,
	} {
		v.DeletePartialMatch(prometheus.Labels{labelUpstream: addr})
	}
}

// boolGauge converts a state to the 1/0 value the gauges use.
func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
