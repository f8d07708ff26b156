package main

import (
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics is the daemon's Prometheus metric set. It is registered on a
// private registry (never the global one) so tests can create as many
// daemons as they like and read exact values.
type metrics struct {
	upstreamsActive   prometheus.Gauge
	upstreamsTotal    prometheus.Gauge
	connectionsActive prometheus.Gauge
	connectionsTotal  prometheus.Counter
	connectionErrors  *prometheus.CounterVec // upstream
	discoveryUpdates  *prometheus.CounterVec // provider
	discoveryErrors   *prometheus.CounterVec // provider
	upstreamRTT       *prometheus.GaugeVec   // upstream; latency selection only
	upstreamTier      *prometheus.GaugeVec   // upstream; latency selection only
	upstreamReady     *prometheus.GaugeVec   // upstream; readyz health check only
	healthStatus      *prometheus.GaugeVec   // upstream

	// Beyond the spec.
	hedgedDials     prometheus.Counter
	hedgedWins      prometheus.Counter
	deadConnsClosed prometheus.Counter
	clientsRefused  prometheus.Counter
	connLimit       prometheus.Gauge
	dialSeconds     *prometheus.HistogramVec // upstream
	upstreamConns   *prometheus.GaugeVec     // upstream
	drains          prometheus.Gauge
	buildInfo       *prometheus.GaugeVec // version, revision, goversion
	// discoveryRunning is 1 while a discovery provider runs and 0 once it
	// is enabled but could not start or has stopped for good, by provider.
	discoveryRunning *prometheus.GaugeVec
	// healthConnsClosed counts the health server's connections closed at
	// its connection limit, by reason: reasonWaiting or reasonNew.
	healthConnsClosed *prometheus.CounterVec
}

const (
	metricNamespace = "extractedprism"
	labelUpstream   = "upstream"
	labelProvider   = "provider"

	// The reasons of healthConnsClosed: an open connection closed to make
	// room for a new one (idle, new for over a second, or inside a request
	// for over 3 s: see connLimiter.closableAt), or the new one, closed
	// because no connection could be.
	reasonWaiting = "waiting"
	reasonNew     = "new"
)

// newMetrics creates the metric set and registers it on reg.
func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		upstreamsActive: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metricNamespace, Name: "upstreams_active",
			Help: "Upstreams eligible for new connections (healthy, not draining).",
		}),
		//nolint:promlinter // a gauge named _total, but the spec fixes the name and dashboards use it
		upstreamsTotal: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metricNamespace, Name: "upstreams_total",
			Help: "Total known upstreams, including unhealthy and draining.",
		}),
		connectionsActive: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metricNamespace, Name: "connections_active",
			Help: "TCP connections currently passing through the proxy.",
		}),
		connectionsTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: metricNamespace, Name: "connections_total",
			Help: "Connections established to upstreams since start.",
		}),
		connectionErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricNamespace, Name: "connection_errors_total",
			Help: "Failed connection attempts to an upstream; none while no upstream is available, none caused by shutdown.",
		}, []string{labelUpstream}),
		discoveryUpdates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricNamespace, Name: "discovery_updates_total",
			Help: "Endpoint list updates received, per discovery provider.",
		}, []string{labelProvider}),
		discoveryErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricNamespace, Name: "discovery_errors_total",
			Help: "Discovery errors: provider failures (a kubernetes provider that cannot start counts once), failed List and Watch calls, watch error events (not 410 Gone).",
		}, []string{labelProvider}),
		upstreamRTT: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: metricNamespace, Name: "upstream_rtt_seconds",
			Help: "Smoothed health check connect time, including name resolution for hostname endpoints.",
		}, []string{labelUpstream}),
		upstreamTier: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: metricNamespace, Name: "upstream_latency_tier",
			Help: "Latency tier of the upstream, 0 being the closest group.",
		}, []string{labelUpstream}),
		upstreamReady: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: metricNamespace, Name: "upstream_ready",
			Help: "/readyz probe state after the consecutive-failure threshold (1 ready, 0 not ready).",
		}, []string{labelUpstream}),
		healthStatus: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: metricNamespace, Name: "health_check_status",
			Help: "Upstream health state after the consecutive-failure threshold (1 healthy, 0 unhealthy).",
		}, []string{labelUpstream}),
	}
	m.addBeyondSpec()
	reg.MustRegister(
		m.upstreamsActive, m.upstreamsTotal,
		m.connectionsActive, m.connectionsTotal, m.connectionErrors,
		m.discoveryUpdates, m.discoveryErrors,
		m.upstreamRTT, m.upstreamTier, m.upstreamReady, m.healthStatus,
		m.hedgedDials, m.hedgedWins, m.deadConnsClosed, m.clientsRefused, m.connLimit,
		m.dialSeconds, m.upstreamConns, m.drains, m.buildInfo, m.healthConnsClosed,
		m.discoveryRunning,
	)
	version, revision := versionInfo()
	m.buildInfo.WithLabelValues(version, revision, runtime.Version()).Set(1)
	return m
}

// addBeyondSpec creates the metrics the spec does not name.
func (m *metrics) addBeyondSpec() {
	m.hedgedDials = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: metricNamespace, Name: "hedged_dials_total",
		Help: "Second dials started because the first dial of a connection was slower than the hedge delay.",
	})
	m.hedgedWins = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: metricNamespace, Name: "hedged_dials_won_total",
		Help: "Hedged dials that connected first and carried the connection.",
	})
	m.deadConnsClosed = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: metricNamespace, Name: "dead_connections_closed_total",
		Help: "Proxied connections closed because the kernel timed out a peer, usually the upstream (keepalive or TCP_USER_TIMEOUT), or because the sweep found their upstream had stopped acknowledging their data.",
	})
	m.clientsRefused = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: metricNamespace, Name: "clients_refused_total",
		Help: "Client connections closed because no upstream could be dialled, last-resort dials included; not during shutdown.",
	})
	m.connLimit = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: metricNamespace, Name: "connection_limit",
		Help: "Most client connections proxied at once, from the open-files limit and the cgroup's memory limit; beyond it new clients wait in the listen backlog.",
	})
	m.dialSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: metricNamespace, Name: "upstream_dial_duration_seconds",
		Help:    "Time to connect to an upstream for a client connection, successful dials only.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{labelUpstream})
	m.upstreamConns = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: metricNamespace, Name: "upstream_connections",
		Help: "Proxied connections currently open to the upstream.",
	}, []string{labelUpstream})
	m.drains = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: metricNamespace, Name: "drains_in_progress",
		Help: "Removed upstreams whose connections are still draining.",
	})
	m.buildInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: metricNamespace, Name: "build_info",
		Help: "Always 1; the labels say which build is running.",
	}, []string{"version", "revision", "goversion"})
	m.healthConnsClosed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: metricNamespace, Name: "health_connections_closed_total",
		Help: "Health server connections closed at its connection limit: reason=waiting, an open one closed to make room (idle, silent for over a second since it opened, or inside a request for over 3 s); reason=new, a new one, closed because none could be.",
	}, []string{"reason"})
	// Both series exist from the start, so that a rate over them works
	// before the first closing.
	m.healthConnsClosed.WithLabelValues(reasonWaiting)
	m.healthConnsClosed.WithLabelValues(reasonNew)
	m.discoveryRunning = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: metricNamespace, Name: "discovery_running",
		Help: "1 while the discovery provider runs; 0 once it is enabled but could not start, or stopped before shutdown. The kubernetes series exists only with --enable-discovery.",
	}, []string{labelProvider})
}

// discoverySeries creates the update and error series of provider name at
// 0, so that increase and rate over them work from the first scrape.
func (m *metrics) discoverySeries(name string) {
	m.discoveryUpdates.WithLabelValues(name)
	m.discoveryErrors.WithLabelValues(name)
}

// discoveryNotStarted records that provider name is enabled but could not
// start: one error, and running 0. Without it an enabled provider that
// never started would have no series at all, and no alert over them could
// fire while the node silently followed only its static endpoints.
func (m *metrics) discoveryNotStarted(name string) {
	m.discoverySeries(name)
	m.discoveryErrors.WithLabelValues(name).Inc()
	m.discoveryRunning.WithLabelValues(name).Set(0)
}

// registerRuntimeMetrics registers the standard process_ and go_ metrics on
// reg: resident memory, open and allowed descriptors, CPU time, goroutines,
// heap and collector figures. They are what an operator alerts on for a
// daemon on every node (a leak shows there before the node does), and what
// dashboards built for any Go service already chart.
//
// The constructors of the prometheus package are used rather than their
// twins in prometheus/collectors, which build the same collectors but also
// hold the database/sql one, and so would link database/sql into the binary.
func registerRuntimeMetrics(reg prometheus.Registerer) {
	reg.MustRegister(
		//nolint:staticcheck // see above: the collectors package links database/sql
		prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}),
		//nolint:staticcheck // see above
		prometheus.NewGoCollector(),
	)
}

// forgetUpstream deletes every per-upstream series of addr. It is called once
// an upstream has drained and left the pool, as the spec requires.
func (m *metrics) forgetUpstream(addr string) {
	m.connectionErrors.DeleteLabelValues(addr)
	m.upstreamRTT.DeleteLabelValues(addr)
	m.upstreamTier.DeleteLabelValues(addr)
	m.upstreamReady.DeleteLabelValues(addr)
	m.healthStatus.DeleteLabelValues(addr)
	m.dialSeconds.DeleteLabelValues(addr)
	m.upstreamConns.DeleteLabelValues(addr)
}

// boolGauge converts a state to the 1/0 value the gauges use.
func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
