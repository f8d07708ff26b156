package test

// The Grafana dashboard's queries, run by a real Prometheus against a real
// daemon. The daemon's module holds every query to the metrics the daemon
// registers; only Prometheus says whether a query parses, whether its
// vector matching works (a one-to-many match is an execution error, not a
// parse error) and whether the labels it groups by exist once the chart's
// PodMonitor relabelings have run, with the old and the new pod of a
// surging rollout both listed. No Grafana server can be installed here
// (npm's grafana is a placeholder, Debian has none), so Grafana's part,
// substituting the variables, is done by the test.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

var dashboardPath = filepath.Join(repoRoot, "deploy", "grafana", "extractedprism.json")

// The labels the test target gets: the node name as the PodMonitor's
// relabeling reads it from Kubernetes service discovery, and the cluster
// the chart is rendered with.
const (
	testNode    = "node-a"
	testCluster = "test-cluster"
	// upstreamName is the name in httptest's certificate.
	upstreamName = "example.com"
)

// prometheusBinary returns the prometheus binary on $PATH. Without one the
// test skips, unless EP_PROMETHEUS_REQUIRE=1 (CI installs Debian's).
func prometheusBinary(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		if os.Getenv("EP_PROMETHEUS_REQUIRE") == "1" {
			t.Fatalf("EP_PROMETHEUS_REQUIRE=1 and no prometheus on $PATH: %v", err)
		}
		t.Skip("no prometheus on $PATH (apt-get install prometheus); set EP_PROMETHEUS_REQUIRE=1 to fail instead")
	}
	return bin
}

// TestDashboardQueriesInPrometheus scrapes a daemon with the relabelings
// the chart's PodMonitor renders, behind those the Prometheus Operator puts
// in front of them, for a node in the middle of a surging rollout: the old
// and the new pod, each with its hand-over init container. It checks that
// this makes one target and one series per node, then runs every alert
// expression and every dashboard query, with the variables as Grafana
// substitutes them, picked and All. Every query must execute; every
// dashboard query must return data, since the daemon creates its series
// from the start and runs here with readyz and latency selection.
func TestDashboardQueriesInPrometheus(t *testing.T) {
	promBin := prometheusBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	upstreams := []*httptest.Server{readyzUpstream(t), readyzUpstream(t)}
	caFile := filepath.Join(dir, "upstream-ca.pem")
	writeFile(t, caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: upstreams[0].Certificate().Raw}))
	// A third endpoint with nothing listening: a health flip to count.
	endpoints := []string{upstreams[0].Listener.Addr().String(), upstreams[1].Listener.Addr().String(), net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t)))}
	proxy, health := startScrapedDaemon(ctx, t, dir, endpoints, caFile)
	passTraffic(ctx, t, proxy, upstreams[0].Certificate())
	_, healthPort, err := net.SplitHostPort(health)
	if err != nil {
		t.Fatalf("%v", err)
	}
	prom := startPrometheus(ctx, t, dir, promBin, podMonitorScrapeConfig(t, healthPort, surgingPods("127.0.0.1", testNode)))
	waitForScrapes(ctx, t, prom)
	checkOneSeriesPerNode(ctx, t, prom)
	checkAlertQueries(ctx, t, prom)

	queries := dashboardQueries(t)
	t.Logf("%d dashboard queries", len(queries))
	for _, pick := range []struct{ name, cluster, node string }{
		{"picked", testCluster, testNode},
		{"All", ".*", ".+"}, // the variables' allValue
	} {
		t.Run(pick.name, func(t *testing.T) {
			vars := strings.NewReplacer("$__rate_interval", "15s", "$cluster", pick.cluster, "$node", pick.node)
			for _, q := range queries {
				expr := vars.Replace(q.expr)
				if strings.Contains(expr, "$") {
					t.Errorf("%s: %s: a variable the test does not substitute", q.where, expr)
					continue
				}
				n, err := promQuery(ctx, prom, expr)
				if q.label != "" {
					n, err = promLabelValues(ctx, prom, expr, q.label)
				}
				if err != nil {
					t.Errorf("%s: %v", q.where, err)
				} else if n == 0 {
					t.Errorf("%s: %s returned no data", q.where, expr)
				}
			}
		})
	}
}

// checkOneSeriesPerNode checks that the two pods of the surging rollout,
// which share the node's address, make one target and one series: the
// dashboard's counts and sums and the alerts' ratios would count the
// node twice otherwise.
func checkOneSeriesPerNode(ctx context.Context, t *testing.T, prom string) {
	t.Helper()
	targets := activeTargets(ctx, t, prom)
	if len(targets) != 1 {
		t.Errorf("%d active targets; want 1, the old and the new pod's being one: %v", len(targets), targets)
	}
	for _, q := range []string{
		`count(up{job="extractedprism"}) == 1`,
		`count(extractedprism_build_info) == 1`,
		`count(count by (node, upstream) (extractedprism_health_check_status) > 1) or vector(0) == 0`,
	} {
		if n, err := promQuery(ctx, prom, q); err != nil || n == 0 {
			t.Errorf("%s: %d series, %v; want it true", q, n, err)
		}
	}
}

// checkAlertQueries runs every alert's expression: each must execute (a
// many-to-many match fails only then), and none may return anything for
// this healthy node but the readyz one, whose upstream set includes one
// with nothing listening.
func checkAlertQueries(ctx context.Context, t *testing.T, prom string) {
	t.Helper()
	rf, _ := readAlerts(t)
	for _, g := range rf.Spec.Groups {
		for _, r := range g.Rules {
			n, err := promQuery(ctx, prom, r.Expr)
			if err != nil {
				t.Errorf("alert %s: %v", r.Alert, err)
			} else if r.Alert == "ExtractedprismScrapeFailing" && n != 0 {
				t.Errorf("alert %s: %d series for a node that is scraped; want none", r.Alert, n)
			}
		}
	}
}

// readyzUpstream is an HTTPS server standing in for an API server: /readyz
// answers 200, and so does every other path, with a body to count bytes.
func readyzUpstream(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok "+r.URL.Path+"\n")
	}))
	// The health check's TCP connects close without a handshake, each a
	// log line otherwise.
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// startScrapedDaemon starts the daemon on free loopback ports with static
// endpoints, readyz checks every 2 s and latency selection, so that
// every per-upstream series exists, and waits until it serves /metrics. It
// returns the proxy's and the health server's addresses.
func startScrapedDaemon(ctx context.Context, t *testing.T, dir string, endpoints []string, caFile string) (proxy, health string) {
	t.Helper()
	bindPort, healthPort := freePort(t), freePort(t)
	daemon := startProcess(t, dir, "extractedprism", daemonBinary(t),
		"--enable-discovery=false", "--endpoints", strings.Join(endpoints, ","),
		"--bind-address", "127.0.0.1", "--bind-port", strconv.Itoa(bindPort), "--health-port", strconv.Itoa(healthPort),
		"--health-interval", "2s", "--health-timeout", "1s", "--upstream-selection", "latency",
		"--health-check", "readyz", "--health-check-ca-file", caFile, "--health-check-server-name", upstreamName)
	proxy = net.JoinHostPort("127.0.0.1", strconv.Itoa(bindPort))
	health = net.JoinHostPort("127.0.0.1", strconv.Itoa(healthPort))
	waitFor(ctx, t, "the daemon's /metrics", func() error {
		exitedEarly(t, daemon, "extractedprism")
		_, err := httpGet(ctx, http.DefaultClient, "http://"+health+"/metrics")
		return err
	})
	return proxy, health
}

// exitedEarly fails the test at once if p has exited, rather than after
// the wait for it times out.
func exitedEarly(t *testing.T, p *process, name string) {
	t.Helper()
	select {
	case <-p.exited:
		t.Fatalf("%s exited:\n%s", name, tail(p.log(), 4096))
	default:
	}
}

// passTraffic makes HTTPS requests through the proxy: one client closes its
// connection (a client_closed end), the other keeps its connection open
// until the test ends (upstream_connections above 0).
func passTraffic(ctx context.Context, t *testing.T, proxy string, ca *x509.Certificate) {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	for i := range 2 {
		dialer := &net.Dialer{Timeout: 5 * time.Second}
		client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: upstreamName, MinVersion: tls.VersionTLS12},
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return dialer.DialContext(ctx, network, proxy)
			},
		}}
		waitFor(ctx, t, "a request through the proxy", func() error {
			_, err := httpGet(ctx, client, "https://"+upstreamName+"/api")
			return err
		})
		if i == 0 {
			client.CloseIdleConnections()
		} else {
			t.Cleanup(client.CloseIdleConnections)
		}
	}
}

// httpGet returns the body of a 200 answer to GET url.
func httpGet(ctx context.Context, client *http.Client, url string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s: %s", url, resp.Status, body)
	}
	return body, err
}

// podMonitorRelabelings renders the chart's PodMonitor with cluster
// testCluster, a surging rollout (the chart's default) and the health port
// healthPort, and returns its relabelings as Prometheus relabel_configs.
func podMonitorRelabelings(t *testing.T, healthPort string) []map[string]any {
	t.Helper()
	port, err := strconv.Atoi(healthPort)
	if err != nil {
		t.Fatalf("%v", err)
	}
	m := render(t, withEndpoints(map[string]any{
		"healthPort": port,
		"metrics":    map[string]any{"expose": true, "podMonitor": map[string]any{"enabled": true, "cluster": testCluster}},
	}))
	if m.PodMonitor == nil || len(m.PodMonitor.Spec.PodMetricsEndpoints) != 1 {
		t.Fatal("the chart rendered no PodMonitor with one endpoint")
	}
	var configs []map[string]any
	for _, r := range m.PodMonitor.Spec.PodMetricsEndpoints[0].Relabelings {
		c := map[string]any{"action": r.Action}
		if r.TargetLabel != "" {
			c["target_label"] = r.TargetLabel
		}
		if len(r.SourceLabels) > 0 {
			c["source_labels"] = r.SourceLabels
		}
		if r.Replacement != nil {
			c["replacement"] = *r.Replacement
		}
		if r.Regex != "" {
			c["regex"] = r.Regex
		}
		configs = append(configs, c)
	}
	return configs
}

// operatorRelabelings are the relabelings the Prometheus Operator puts in
// front of a PodMonitor's own (pkg/prometheus/promcfg.go,
// generatePodMonitorConfig) for a PodMetricsEndpoint without a port: the
// selector's keep, then the namespace, container, pod and job labels.
func operatorRelabelings() []map[string]any {
	return []map[string]any{
		{"action": "keep", "source_labels": []string{"__meta_kubernetes_pod_label_app_kubernetes_io_name"}, "regex": "extractedprism"},
		{"source_labels": []string{"__meta_kubernetes_namespace"}, "target_label": "namespace"},
		{"source_labels": []string{"__meta_kubernetes_pod_container_name"}, "target_label": "container"},
		{"source_labels": []string{"__meta_kubernetes_pod_name"}, "target_label": "pod"},
		{"target_label": "job", "replacement": releaseNamespace + "/" + releaseName},
	}
}

// surgingPods returns the targets Kubernetes pod discovery lists for one
// node in the middle of a surging rollout: the old pod and the new one,
// each with the daemon's container and the hand-over init container, none
// of them with a declared port, so each address is the pod IP alone. Under
// hostNetwork both pods have the node's IP, podIP.
func surgingPods(podIP, node string) []map[string]any {
	var targets []map[string]any
	for _, pod := range []string{"extractedprism-old12", "extractedprism-new34"} {
		for _, container := range []string{"handover-dir", "extractedprism"} {
			targets = append(targets, map[string]any{"targets": []string{podIP}, "labels": map[string]string{
				"__meta_kubernetes_namespace":                        releaseNamespace,
				"__meta_kubernetes_pod_name":                         pod,
				"__meta_kubernetes_pod_ip":                           podIP,
				"__meta_kubernetes_pod_node_name":                    node,
				"__meta_kubernetes_pod_container_name":               container,
				"__meta_kubernetes_pod_container_init":               strconv.FormatBool(container == "handover-dir"),
				"__meta_kubernetes_pod_label_app_kubernetes_io_name": "extractedprism",
			}})
		}
	}
	return targets
}

// podMonitorScrapeConfig is the scrape job the operator makes of the
// chart's PodMonitor, with targets standing in for Kubernetes discovery.
func podMonitorScrapeConfig(t *testing.T, healthPort string, targets []map[string]any) map[string]any {
	t.Helper()
	return map[string]any{
		"job_name":        "podMonitor/" + releaseNamespace + "/" + releaseName + "/0",
		"static_configs":  targets,
		"relabel_configs": append(operatorRelabelings(), podMonitorRelabelings(t, healthPort)...),
	}
}

// startPrometheus starts prometheus on a free loopback port with the
// given scrape jobs, scraping every second, and waits until it is ready.
// It returns its base URL.
func startPrometheus(ctx context.Context, t *testing.T, dir, bin string, jobs ...map[string]any) string {
	t.Helper()
	config, err := yaml.Marshal(map[string]any{
		"global":         map[string]any{"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
		"scrape_configs": jobs,
	})
	if err != nil {
		t.Fatalf("%v", err)
	}
	configFile := filepath.Join(dir, "prometheus.yml")
	writeFile(t, configFile, config)
	base := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t)))
	prom := startProcess(t, dir, "prometheus", bin, "--config.file="+configFile, "--storage.tsdb.path="+filepath.Join(dir, "tsdb"),
		"--web.listen-address="+strings.TrimPrefix(base, "http://"), "--log.level=warn")
	waitFor(ctx, t, "prometheus to be ready", func() error {
		exitedEarly(t, prom, "prometheus")
		_, err := httpGet(ctx, http.DefaultClient, base+"/-/ready")
		return err
	})
	return base
}

// activeTargets returns the labels of Prometheus's active targets, once
// it has any.
func activeTargets(ctx context.Context, t *testing.T, prom string) []map[string]string {
	t.Helper()
	var targets []map[string]string
	waitFor(ctx, t, "active targets", func() error {
		body, err := httpGet(ctx, http.DefaultClient, prom+"/api/v1/targets?state=active")
		if err != nil {
			return err
		}
		var resp struct {
			Data struct {
				ActiveTargets []struct {
					Labels map[string]string `json:"labels"`
				} `json:"activeTargets"`
			} `json:"data"`
		}
		if err := json.Unmarshal(body, &resp); err != nil {
			return fmt.Errorf("%w: %s", err, body)
		}
		targets = nil
		for _, at := range resp.Data.ActiveTargets {
			targets = append(targets, at.Labels)
		}
		if len(targets) == 0 {
			return errors.New("no active target yet")
		}
		return nil
	})
	return targets
}

// waitForScrapes waits until the target is up with the node and cluster
// labels, and until every bytes counter and readiness gauge has samples
// enough for a rate over the dashboard's 15 s.
func waitForScrapes(ctx context.Context, t *testing.T, prom string) {
	t.Helper()
	labels := fmt.Sprintf(`node=%q, cluster=%q`, testNode, testCluster)
	for _, cond := range []string{
		fmt.Sprintf(`up{job="extractedprism", %s} == 1`, labels),
		fmt.Sprintf(`min(count_over_time(extractedprism_upstream_bytes_total{%s}[15s])) >= 4`, labels),
		fmt.Sprintf(`sum(extractedprism_upstream_bytes_total{%s}) > 0`, labels),
		fmt.Sprintf(`count(count_over_time(extractedprism_upstream_ready{%s}[15s]) >= 4) >= 2`, labels),
	} {
		waitFor(ctx, t, cond, func() error {
			n, err := promQuery(ctx, prom, cond)
			if err == nil && n == 0 {
				err = fmt.Errorf("%s: no data yet", cond)
			}
			return err
		})
	}
}

// promQuery runs expr as an instant query and returns how many series it
// returned (2, time and value, for a scalar); an error for a query
// Prometheus refuses.
func promQuery(ctx context.Context, prom, expr string) (int, error) {
	body, err := httpGet(ctx, http.DefaultClient, prom+"/api/v1/query?query="+url.QueryEscape(expr))
	if err != nil {
		return 0, err
	}
	var resp struct {
		Status string `json:"status"`
		Data   struct {
			Result []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &resp); err != nil {
		return 0, fmt.Errorf("query %s: %w: %s", expr, err, body)
	}
	if resp.Status != "success" {
		return 0, fmt.Errorf("query %s: %s", expr, body)
	}
	return len(resp.Data.Result), nil
}

// dashboardQuery is one target of a dashboard panel, or the selector and
// label of a variable's label_values query.
type dashboardQuery struct {
	where, expr string
	label       string // a variable's: expr is a selector, not a query
}

// grafanaPanel is the part of a dashboard panel the test reads.
type grafanaPanel struct {
	ID      int    `json:"id"`
	Title   string `json:"title"`
	Targets []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
	Panels []grafanaPanel `json:"panels"` // a collapsed row's
}

// dashboardQueries returns every query of the dashboard: its variables'
// and its panels', collapsed rows' panels included.
func dashboardQueries(t *testing.T) []dashboardQuery {
	t.Helper()
	data, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatalf("%v", err)
	}
	var d struct {
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
		Panels []grafanaPanel `json:"panels"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	var queries []dashboardQuery
	for _, v := range d.Templating.List {
		if m := labelValues.FindStringSubmatch(v.Definition); m != nil {
			queries = append(queries, dashboardQuery{where: "variable " + v.Name, expr: m[1], label: m[2]})
		}
	}
	var walk func([]grafanaPanel)
	walk = func(panels []grafanaPanel) {
		for _, p := range panels {
			for _, tg := range p.Targets {
				queries = append(queries, dashboardQuery{where: fmt.Sprintf("panel %d %q, query %s", p.ID, p.Title, tg.RefID), expr: tg.Expr})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	if len(queries) < 20 {
		t.Fatalf("%s: %d queries; the test reads the dashboard wrong", dashboardPath, len(queries))
	}
	return queries
}

// labelValues matches Grafana's label_values(selector, label) variable
// query, which is no PromQL: Grafana asks the label values API for it.
var labelValues = regexp.MustCompile(`^label_values\((.+),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$`)

// promLabelValues asks Prometheus for the values of label on the series
// selector matches, as Grafana does for a label_values variable, and
// returns how many non-empty ones there are.
func promLabelValues(ctx context.Context, prom, selector, label string) (int, error) {
	body, err := httpGet(ctx, http.DefaultClient, prom+"/api/v1/label/"+label+"/values?match[]="+url.QueryEscape(selector))
	if err != nil {
		return 0, err
	}
	var resp struct {
		Status string   `json:"status"`
		Data   []string `json:"data"`
	}
	if err := json.Unmarshal(body, &resp); err != nil || resp.Status != "success" {
		return 0, fmt.Errorf("label values of %s for %s: %v: %s", label, selector, err, body)
	}
	n := 0
	for _, v := range resp.Data {
		if v != "" {
			n++
		}
	}
	return n, nil
}
