package main

// The Grafana dashboard and the alerting rules in deploy/ name metrics by
// string. A renamed or misspelt metric gives an empty panel or an alert that
// can never fire, and nothing complains. These tests hold every query to the
// names newMetrics registers, without a PromQL parser: a regular expression
// finds each extractedprism_ identifier and its selector.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	dashboardPath = filepath.Join("deploy", "grafana", "extractedprism.json")
	alertsPath    = filepath.Join("deploy", "prometheus", "alerts.yaml")
)

// registeredMetric is what a metric's descriptor says about it.
type registeredMetric struct {
	labels    []string // variable labels
	histogram bool     // exposes _bucket, _sum and _count series
}

// descRecorder is a prometheus.Registerer that registers nothing: it asks
// each collector to describe itself and records the fully-qualified names
// and variable labels of the descriptors.
type descRecorder struct {
	metrics map[string]registeredMetric
}

func (r *descRecorder) Register(c prometheus.Collector) error {
	// A descriptor does not say the metric's type; the collector's does.
	_, vec := c.(*prometheus.HistogramVec)
	_, single := c.(prometheus.Histogram)
	for _, d := range describe(c) {
		name, labels, err := parseDesc(d)
		if err != nil {
			return err
		}
		if _, dup := r.metrics[name]; dup {
			return fmt.Errorf("%s registered twice", name)
		}
		r.metrics[name] = registeredMetric{labels: labels, histogram: vec || single}
	}
	return nil
}

func (r *descRecorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

func (r *descRecorder) Unregister(prometheus.Collector) bool { return false }

// describe returns the descriptors c sends.
func describe(c prometheus.Collector) []*prometheus.Desc {
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	var descs []*prometheus.Desc
	for d := range ch {
		descs = append(descs, d)
	}
	return descs
}

// Desc.String() reads
// Desc{fqName: "…", help: "…", unit: "…", constLabels: {…}, variableLabels: {a,c(b)}}
// where c(b) marks a label with a value constraint.
var (
	descFQName = regexp.MustCompile(`fqName: "([^"]+)"`)
	descLabels = regexp.MustCompile(`variableLabels: \{([^}]*)\}`)
)

// parseDesc returns the fully-qualified name and variable labels of d.
func parseDesc(d *prometheus.Desc) (string, []string, error) {
	s := d.String()
	name := descFQName.FindStringSubmatch(s)
	labels := descLabels.FindStringSubmatch(s)
	if name == nil || labels == nil {
		return "", nil, fmt.Errorf("cannot parse descriptor %s", s)
	}
	var names []string
	for l := range strings.SplitSeq(labels[1], ",") {
		if l = strings.TrimSuffix(strings.TrimPrefix(l, "c("), ")"); l != "" {
			names = append(names, l)
		}
	}
	return name[1], names, nil
}

// registeredMetrics returns the metrics the daemon registers, by name:
// its own and the standard process_ and go_ ones.
func registeredMetrics(t *testing.T) map[string]registeredMetric {
	t.Helper()
	rec := &descRecorder{metrics: map[string]registeredMetric{}}
	newMetrics(rec)
	if len(rec.metrics) == 0 {
		t.Fatal("newMetrics registered no metric")
	}
	return rec.metrics
}

// TestObservabilityRecorderSeesEveryMetric checks the recorder against a
// real registry: every family the daemon's registry gathers is recorded,
// and the histogram is known as one.
func TestObservabilityRecorderSeesEveryMetric(t *testing.T) {
	recorded := registeredMetrics(t)
	reg := prometheus.NewRegistry()
	m := newMetrics(reg)
	// Vectors are gathered only once they have a child.
	m.dialSeconds.WithLabelValues("192.0.2.1:6443").Observe(0.01)
	m.connectionErrors.WithLabelValues("192.0.2.1:6443").Inc()
	m.discoveryUpdates.WithLabelValues(staticProviderName).Inc()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if _, ok := recorded[f.GetName()]; !ok {
			t.Errorf("%s is gathered but was not recorded", f.GetName())
		}
	}
	if !recorded["extractedprism_upstream_dial_duration_seconds"].histogram {
		t.Error("extractedprism_upstream_dial_duration_seconds not recorded as a histogram")
	}
	if got := recorded["extractedprism_health_check_status"].labels; !slices.Equal(got, []string{"upstream"}) {
		t.Errorf("extractedprism_health_check_status labels: got %v; want [upstream]", got)
	}
}

// metricSelector matches a metric name, the daemon's own or a standard
// process_ or go_ one, and the label matchers right after it, if any.
var (
	metricSelector = regexp.MustCompile(`\b((?:extractedprism|process|go)_[a-z0-9_]+)(\{[^}]*\})?`)
	labelMatcher   = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
)

// The dashboard's filters: every selector applies the cluster variable, and
// those of the per-node detail rows the node variable as well, so the
// pickers mean something.
const (
	clusterFilter = `cluster=~"$cluster"`
	nodeFilter    = `node=~"$node"`
)

// histogramSuffixes are the series a histogram exposes under its name.
var histogramSuffixes = []string{"_bucket", "_sum", "_count"}

// checkQuery returns what is wrong with the extractedprism_ metrics that
// expr names: unknown names, suffixes on a metric that is no histogram,
// label matchers the metric cannot have and, with needCluster, selectors
// without the cluster filter. It also returns the metrics named, with
// histogram suffixes removed.
func checkQuery(expr string, registered map[string]registeredMetric, needCluster bool) (problems, used []string) {
	for _, m := range metricSelector.FindAllStringSubmatch(expr, -1) {
		name, selector := m[1], m[2]
		base, suffix := name, ""
		if _, ok := registered[name]; !ok {
			for _, s := range histogramSuffixes {
				if b, ok := strings.CutSuffix(name, s); ok && registered[b].histogram {
					base, suffix = b, s
				}
			}
		}
		metric, ok := registered[base]
		if !ok {
			problems = append(problems, fmt.Sprintf("%s is not a registered metric", name))
			continue
		}
		used = append(used, base)
		if metric.histogram && suffix == "" {
			// A classic histogram has no series under its own name.
			problems = append(problems, fmt.Sprintf("%s is a histogram: query its _bucket, _sum or _count series", name))
		}
		// Target labels every scrape adds, the node and cluster labels the
		// chart's PodMonitor adds, and le on histogram buckets.
		allowed := append([]string{"instance", "job", "node", "cluster"}, metric.labels...)
		if suffix == "_bucket" {
			allowed = append(allowed, "le")
		}
		for _, lm := range labelMatcher.FindAllStringSubmatch(selector, -1) {
			if !slices.Contains(allowed, lm[1]) {
				problems = append(problems, fmt.Sprintf("%s has no label %s", name, lm[1]))
			}
		}
		if needCluster && !strings.Contains(selector, clusterFilter) {
			problems = append(problems, fmt.Sprintf("%s lacks the selector %s", name, clusterFilter))
		}
	}
	return problems, used
}

// TestObservabilityQueryCheck shows that checkQuery, which the dashboard
// and alert tests rely on, fails the mistakes it is there to catch.
func TestObservabilityQueryCheck(t *testing.T) {
	registered := registeredMetrics(t)
	tests := []struct {
		name, expr  string
		needCluster bool
		wantProblem string // empty: no problem
	}{
		{"known gauge", `extractedprism_upstreams_active == 0`, false, ""},
		{"histogram bucket", `histogram_quantile(0.9, sum by (le) (rate(extractedprism_upstream_dial_duration_seconds_bucket{le!="+Inf"}[5m])))`, false, ""},
		{"histogram count", `rate(extractedprism_upstream_dial_duration_seconds_count[5m])`, false, ""},
		{"misspelt name", `extractedprism_upstreams_activ == 0`, false, "extractedprism_upstreams_activ is not a registered metric"},
		{"made-up name", `rate(extractedprism_requests_total[5m])`, false, "extractedprism_requests_total is not a registered metric"},
		{"count of a counter", `extractedprism_connections_total_count`, false, "extractedprism_connections_total_count is not a registered metric"},
		{"bare histogram name", `rate(extractedprism_upstream_dial_duration_seconds[5m])`, false, "extractedprism_upstream_dial_duration_seconds is a histogram: query its _bucket, _sum or _count series"},
		{"label of another metric", `extractedprism_upstream_ready{provider="kubernetes"}`, false, "extractedprism_upstream_ready has no label provider"},
		{"le on a sum", `extractedprism_upstream_dial_duration_seconds_sum{le="1"}`, false, "extractedprism_upstream_dial_duration_seconds_sum has no label le"},
		{"own label", `extractedprism_discovery_errors_total{provider="kubernetes", job="x"}`, false, ""},
		{"PodMonitor labels", `extractedprism_upstreams_active{node="n1", cluster="c1"} == 0`, false, ""},
		{"cluster filter present", `extractedprism_connections_active{cluster=~"$cluster"}`, true, ""},
		{"cluster filter missing", `sum(extractedprism_connections_active{node=~"$node"})`, true, "extractedprism_connections_active lacks the selector " + clusterFilter},
		{"process metric", `process_open_fds{cluster=~"$cluster"} / process_max_fds{cluster=~"$cluster"}`, true, ""},
		{"misspelt process metric", `process_open_fd`, false, "process_open_fd is not a registered metric"},
		{"go metric with a made-up label", `go_goroutines{upstream="a"}`, false, "go_goroutines has no label upstream"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			problems, _ := checkQuery(tt.expr, registered, tt.needCluster)
			if tt.wantProblem == "" {
				if len(problems) != 0 {
					t.Errorf("got %q; want no problem", problems)
				}
				return
			}
			if !slices.Contains(problems, tt.wantProblem) {
				t.Errorf("got %q; want %q among them", problems, tt.wantProblem)
			}
		})
	}
}

// dashboard is the part of the Grafana dashboard model the tests read.
type dashboard struct {
	UID           string `json:"uid"`
	SchemaVersion int    `json:"schemaVersion"`
	Templating    struct {
		List []dashboardVariable `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type dashboardVariable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Query      json.RawMessage `json:"query"` // a string, or {"query": "…"}
	Datasource *datasourceRef  `json:"datasource"`
	IncludeAll bool            `json:"includeAll"`
	AllValue   string          `json:"allValue"`
	Multi      bool            `json:"multi"`
}

// query returns the variable's query, which Grafana stores as a string or
// as an object.
func (v dashboardVariable) query() (string, error) {
	var query string
	if err := json.Unmarshal(v.Query, &query); err == nil {
		return query, nil
	}
	var obj struct{ Query string }
	if err := json.Unmarshal(v.Query, &obj); err != nil {
		return "", fmt.Errorf("variable %s: query %s is neither a string nor an object", v.Name, v.Query)
	}
	return obj.Query, nil
}

type panel struct {
	ID         int            `json:"id"`
	Type       string         `json:"type"`
	Title      string         `json:"title"`
	Datasource *datasourceRef `json:"datasource"`
	GridPos    struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Collapsed bool   `json:"collapsed"`
	Repeat    string `json:"repeat"`
	Targets   []struct {
		Datasource   *datasourceRef `json:"datasource"`
		Expr         string         `json:"expr"`
		LegendFormat string         `json:"legendFormat"`
		RefID        string         `json:"refId"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's panels
}

type datasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// isVariableRef reports whether ref points at the dashboard's Prometheus
// data source variable, so the dashboard imports into any Grafana.
func (ref *datasourceRef) isVariableRef() bool {
	return ref != nil && ref.Type == "prometheus" && (ref.UID == "${datasource}" || ref.UID == "$datasource")
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	data, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	return d
}

// flattenPanels returns every panel, rows' nested panels included.
func flattenPanels(panels []panel) []panel {
	var all []panel
	for _, p := range panels {
		all = append(all, p)
		all = append(all, flattenPanels(p.Panels)...)
	}
	return all
}

// dashboardMustShow are the metrics the dashboard was asked for, with what
// they show; every other registered metric must appear too (see below).
var dashboardMustShow = map[string]string{
	"extractedprism_health_check_status":            "upstream health",
	"extractedprism_upstream_ready":                 "readiness",
	"extractedprism_upstream_latency_tier":          "latency tiers",
	"extractedprism_upstream_rtt_seconds":           "smoothed RTT",
	"extractedprism_connections_active":             "connections",
	"extractedprism_connections_total":              "connection rate",
	"extractedprism_upstream_connections":           "connections by upstream",
	"extractedprism_connection_errors_total":        "errors",
	"extractedprism_clients_refused_total":          "refused clients",
	"extractedprism_upstream_bytes_total":           "bytes by upstream",
	"extractedprism_connections_closed_total":       "connection ends by reason, failovers",
	"extractedprism_discovery_updates_total":        "discovery updates",
	"extractedprism_discovery_errors_total":         "discovery errors",
	"extractedprism_upstream_dial_duration_seconds": "dial latency",
	"process_resident_memory_bytes":                 "memory",
	"process_open_fds":                              "descriptors",
	"process_max_fds":                               "descriptor limit",
	"process_cpu_seconds_total":                     "CPU",
	"go_goroutines":                                 "goroutines",
}

// dashboardSections splits the dashboard into its fleet panels, the
// top-level ones, and its per-node detail panels, those of the collapsed
// rows. Rows are open and empty, or collapsed with their panels inside, and
// every fleet panel comes before the first collapsed row.
func dashboardSections(d dashboard) (fleet, detail []panel, problems []string) {
	inDetail := false
	for _, p := range d.Panels {
		switch {
		case p.Type == "row" && p.Collapsed:
			inDetail = true
			detail = append(detail, p.Panels...)
		case p.Type == "row" && len(p.Panels) > 0:
			problems = append(problems, fmt.Sprintf("open row %d %q holds panels; an open row's panels follow it at the top level", p.ID, p.Title))
		case p.Type == "row":
		case inDetail:
			problems = append(problems, fmt.Sprintf("panel %d %q is outside the collapsed rows, below them; fleet panels come first", p.ID, p.Title))
		default:
			fleet = append(fleet, p)
		}
	}
	if len(fleet) == 0 || len(detail) == 0 {
		problems = append(problems, fmt.Sprintf("%d fleet panels, %d per-node panels; want both", len(fleet), len(detail)))
	}
	return fleet, detail, problems
}

// Fleet panels query a thousand nodes at once: they aggregate first, and
// name a node only in a topk or bottomk list.
var (
	fleetAggregation = regexp.MustCompile(`^\s*(?:[0-9.]+\s*\*\s*)?(?:sum|avg|min|max|count|topk|bottomk|histogram_quantile)\b`)
	byClause         = regexp.MustCompile(`\bby\s*\(([^)]*)\)`)
	perNodeLabel     = regexp.MustCompile(`\b(?:node|instance|pod)\b`)
	nodeList         = regexp.MustCompile(`\b(?:topk|bottomk)\s*\(`)
	// instanceLabel: dashboards and alerts name nodes by the node label;
	// instance is the pod's address, which tells an operator nothing.
	instanceLabel = regexp.MustCompile(`\binstance\b`)
)

// checkFleetTarget returns what makes a fleet panel's query expensive or
// unreadable at a thousand nodes: series that are not aggregated, and
// per-node groups or legends outside a topk or bottomk list.
func checkFleetTarget(expr, legend string) []string {
	var problems []string
	if !fleetAggregation.MatchString(expr) {
		problems = append(problems, "does not start with an aggregation")
	}
	if nodeList.MatchString(expr) {
		return problems
	}
	for _, by := range byClause.FindAllStringSubmatch(expr, -1) {
		if perNodeLabel.MatchString(by[1]) {
			problems = append(problems, fmt.Sprintf("groups by (%s) outside topk or bottomk", by[1]))
		}
	}
	if perNodeLabel.MatchString(legend) {
		problems = append(problems, fmt.Sprintf("legend %q names a node outside topk or bottomk", legend))
	}
	return problems
}

// TestObservabilityDashboardFleetCheck shows that checkFleetTarget fails
// the fleet queries that would draw a line per node.
func TestObservabilityDashboardFleetCheck(t *testing.T) {
	tests := []struct {
		expr, legend string
		want         int // problems
	}{
		{`sum by (upstream) (extractedprism_upstream_connections{cluster=~"$cluster"})`, "{{upstream}}", 0},
		{`60 * sum(rate(extractedprism_connections_closed_total[5m])) or vector(0)`, "per minute", 0},
		{`bottomk(10, min by (node) (extractedprism_upstreams_active))`, "", 0},
		{`extractedprism_upstream_connections{cluster=~"$cluster"}`, "{{upstream}}", 1},
		{`rate(extractedprism_connections_total[5m])`, "{{node}}", 2},
		{`sum by (node, upstream) (extractedprism_upstream_connections)`, "{{upstream}}", 1},
		{`sum by (upstream) (extractedprism_upstream_connections)`, "{{instance}} {{upstream}}", 1},
	}
	for _, tt := range tests {
		if got := checkFleetTarget(tt.expr, tt.legend); len(got) != tt.want {
			t.Errorf("%s, legend %q: got %q; want %d problems", tt.expr, tt.legend, got, tt.want)
		}
	}
}

// checkDashboardVariables checks the data source, cluster and node
// variables and returns the metrics their queries name.
func checkDashboardVariables(t *testing.T, d dashboard, registered map[string]registeredMetric) (used []string) {
	t.Helper()
	vars := map[string]dashboardVariable{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
		if v.Type != "query" {
			continue
		}
		if !v.Datasource.isVariableRef() {
			t.Errorf("variable %s: datasource %+v; want the ${datasource} variable", v.Name, v.Datasource)
		}
		query, err := v.query()
		if err != nil {
			t.Fatal(err)
		}
		problems, names := checkQuery(query, registered, false)
		for _, p := range problems {
			t.Errorf("variable %s: %s in %s", v.Name, p, query)
		}
		used = append(used, names...)
	}
	if vars["datasource"].Type != "datasource" {
		t.Errorf("variable datasource: type %q; want datasource", vars["datasource"].Type)
	}
	// All on cluster matches series without the label too: one cluster,
	// scraped without metrics.podMonitor.cluster, has none.
	if c := vars["cluster"]; c.Type != "query" || !c.IncludeAll || c.AllValue != ".*" {
		t.Errorf("variable cluster: %+v; want a query with All, matching .*", c)
	}
	n := vars["node"]
	if n.Type != "query" || !n.IncludeAll || !n.Multi {
		t.Errorf("variable node: %+v; want a multi-value query with All", n)
	}
	if q, _ := n.query(); !strings.Contains(q, clusterFilter) || !strings.HasSuffix(q, ", node)") {
		t.Errorf("variable node: query %q; want the node label values of the picked cluster", q)
	}
	return used
}

func TestObservabilityDashboard(t *testing.T) {
	registered := registeredMetrics(t)
	d := readDashboard(t)
	if d.UID == "" || d.SchemaVersion < 36 {
		t.Errorf("uid %q, schemaVersion %d; want a uid and schemaVersion 36 or later", d.UID, d.SchemaVersion)
	}
	used := map[string]bool{}
	for _, n := range checkDashboardVariables(t, d, registered) {
		used[n] = true
	}
	fleet, detail, problems := dashboardSections(d)
	for _, p := range problems {
		t.Error(p)
	}
	for _, p := range fleet {
		for _, n := range checkDashboardPanel(t, p, registered, false) {
			used[n] = true
		}
	}
	for _, p := range detail {
		for _, n := range checkDashboardPanel(t, p, registered, true) {
			used[n] = true
		}
	}
	checkPanelIDs(t, d.Panels)
	checkDashboardCoverage(t, registered, used)
}

// checkPanelIDs checks that every panel, rows and their panels included,
// has its own positive id, and that none repeats: a repeated panel or row
// would run its queries once per node.
func checkPanelIDs(t *testing.T, panels []panel) {
	t.Helper()
	ids := map[int]string{}
	for _, p := range flattenPanels(panels) {
		if p.ID <= 0 {
			t.Errorf("panel %d %q: id must be positive", p.ID, p.Title)
		}
		if other, dup := ids[p.ID]; dup {
			t.Errorf("panel %d %q: id already used by %q", p.ID, p.Title, other)
		}
		ids[p.ID] = p.Title
		if p.Repeat != "" {
			t.Errorf("panel %d %q repeats by %s; filter by $node instead", p.ID, p.Title, p.Repeat)
		}
	}
}

// checkDashboardPanel checks one panel's data source and queries, fleet
// or, with perNode, per-node detail, and returns the metrics they name.
func checkDashboardPanel(t *testing.T, p panel, registered map[string]registeredMetric, perNode bool) (used []string) {
	t.Helper()
	where := fmt.Sprintf("panel %d %q", p.ID, p.Title)
	if p.Type == "row" {
		t.Errorf("%s: a row inside a row", where)
		return nil
	}
	if !p.Datasource.isVariableRef() {
		t.Errorf("%s: datasource %+v; want the ${datasource} variable", where, p.Datasource)
	}
	if len(p.Targets) == 0 {
		t.Errorf("%s: no query", where)
	}
	refIDs := map[string]bool{}
	for _, target := range p.Targets {
		q := fmt.Sprintf("%s, query %s", where, target.RefID)
		if !target.Datasource.isVariableRef() {
			t.Errorf("%s: datasource %+v; want the ${datasource} variable", q, target.Datasource)
		}
		if target.RefID == "" || refIDs[target.RefID] {
			t.Errorf("%s: refId %q empty or repeated", where, target.RefID)
		}
		refIDs[target.RefID] = true
		if !metricSelector.MatchString(target.Expr) {
			t.Errorf("%s: %q names no extractedprism metric", q, target.Expr)
		}
		if instanceLabel.MatchString(target.Expr + target.LegendFormat) {
			t.Errorf("%s: %q, legend %q: name nodes by the node label, not instance", q, target.Expr, target.LegendFormat)
		}
		problems, names := checkQuery(target.Expr, registered, true)
		if perNode {
			problems = append(problems, lacksNodeFilter(target.Expr)...)
		} else {
			problems = append(problems, checkFleetTarget(target.Expr, target.LegendFormat)...)
		}
		for _, problem := range problems {
			t.Errorf("%s: %s in %s", q, problem, target.Expr)
		}
		used = append(used, names...)
	}
	return used
}

// lacksNodeFilter returns a problem for each selector of expr without the
// node filter, which every per-node panel applies.
func lacksNodeFilter(expr string) []string {
	var problems []string
	for _, m := range metricSelector.FindAllStringSubmatch(expr, -1) {
		if !strings.Contains(m[2], nodeFilter) {
			problems = append(problems, fmt.Sprintf("%s lacks the selector %s", m[1], nodeFilter))
		}
	}
	return problems
}

// checkDashboardCoverage checks that the dashboard shows what it was asked
// for and every metric of the daemon's own.
func checkDashboardCoverage(t *testing.T, registered map[string]registeredMetric, used map[string]bool) {
	t.Helper()
	for _, name := range slices.Sorted(maps.Keys(dashboardMustShow)) {
		if _, ok := registered[name]; !ok {
			t.Errorf("%s (%s) is not registered any more; update the dashboard and this test", name, dashboardMustShow[name])
		} else if !used[name] {
			t.Errorf("the dashboard does not show %s (%s)", name, dashboardMustShow[name])
		}
	}
	for _, name := range slices.Sorted(maps.Keys(registered)) {
		// Of the standard process_ and go_ metrics, the dashboard shows
		// those in dashboardMustShow; the rest are there for ad hoc queries.
		if !used[name] && strings.HasPrefix(name, "extractedprism_") {
			t.Errorf("no dashboard query uses %s; a metric without a panel goes unseen", name)
		}
	}
}

// TestObservabilityDashboardLayout checks that the top-level panels, and
// the panels of each collapsed row, fit the 24-column grid and do not
// overlap, which Grafana would resolve by moving panels around on load; a
// collapsed row's panels lie below it, where Grafana opens them.
func TestObservabilityDashboardLayout(t *testing.T) {
	panels := readDashboard(t).Panels
	checkGrid(t, "top level", panels)
	for _, row := range panels {
		if row.Type != "row" || len(row.Panels) == 0 {
			continue
		}
		checkGrid(t, fmt.Sprintf("row %q", row.Title), row.Panels)
		for _, p := range row.Panels {
			if p.GridPos.Y <= row.GridPos.Y {
				t.Errorf("row %q: panel %d %q at y %d, not below the row at %d", row.Title, p.ID, p.Title, p.GridPos.Y, row.GridPos.Y)
			}
		}
	}
}

// checkGrid checks that panels fit the 24-column grid and do not overlap.
func checkGrid(t *testing.T, where string, panels []panel) {
	t.Helper()
	for i, p := range panels {
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.Y < 0 || g.X+g.W > 24 {
			t.Errorf("%s: panel %d %q: gridPos %+v outside the 24-column grid", where, p.ID, p.Title, g)
		}
		for _, q := range panels[:i] {
			h := q.GridPos
			if g.X < h.X+h.W && h.X < g.X+g.W && g.Y < h.Y+h.H && h.Y < g.Y+g.H {
				t.Errorf("%s: panel %d %q overlaps panel %d %q", where, p.ID, p.Title, q.ID, q.Title)
			}
		}
	}
}

// yamlBlockIndicators introduce a block scalar spanning the lines indented
// below its key.
var yamlBlockIndicators = []string{"|", "|-", "|+", ">", ">-", ">+"}

// alertExprs returns the expr: values of the rule file text, plain,
// quoted or block scalars. It is a line scan, not a YAML parser; the
// tools/deploytest module parses the file properly. Comments are skipped.
func alertExprs(text string) []string {
	lines := strings.Split(text, "\n")
	indent := func(line string) int { return len(line) - len(strings.TrimLeft(line, " ")) }
	var exprs []string
	for i := 0; i < len(lines); i++ {
		key := strings.TrimPrefix(strings.TrimSpace(lines[i]), "- ")
		value, ok := strings.CutPrefix(key, "expr:")
		if !ok {
			continue
		}
		value = strings.TrimSpace(value)
		if !slices.Contains(yamlBlockIndicators, value) {
			exprs = append(exprs, strings.Trim(value, `'"`))
			continue
		}
		keyIndent := indent(lines[i])
		var block []string
		for i+1 < len(lines) && (strings.TrimSpace(lines[i+1]) == "" || indent(lines[i+1]) > keyIndent) {
			i++
			block = append(block, strings.TrimSpace(lines[i]))
		}
		exprs = append(exprs, strings.TrimSpace(strings.Join(block, "\n")))
	}
	return exprs
}

func TestObservabilityAlertExprScan(t *testing.T) {
	const text = `groups:
  - name: g
    rules:
      - alert: A
        expr: extractedprism_upstreams_active == 0
        for: 1m
      - alert: B
        # expr: commented_out
        expr: |-
          rate(extractedprism_connections_total[5m])
            > 1

        for: 5m
      - expr: "up == 0"
`
	got := alertExprs(text)
	want := []string{"extractedprism_upstreams_active == 0", "rate(extractedprism_connections_total[5m])\n> 1", "up == 0"}
	if !slices.Equal(got, want) {
		t.Errorf("got %q; want %q", got, want)
	}
}

// readAlerts returns the alert names and their exprs in the rule file, in
// order; one expr per alert, or the scan missed one.
func readAlerts(t *testing.T) (names, exprs []string) {
	t.Helper()
	data, err := os.ReadFile(alertsPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`(?m)^\s*-?\s*alert:\s*(\S+)`).FindAllStringSubmatch(string(data), -1) {
		names = append(names, m[1])
	}
	exprs = alertExprs(string(data))
	if len(exprs) == 0 || len(exprs) != len(names) {
		t.Fatalf("found %d exprs for %d alerts in %s", len(exprs), len(names), alertsPath)
	}
	return names, exprs
}

// alertsMustRead are the metrics some alert must read, with what for.
var alertsMustRead = map[string]string{
	"extractedprism_upstreams_active":                "a node with no usable upstream",
	"extractedprism_health_check_status":             "an API server unreachable from many nodes, or from one",
	"extractedprism_upstream_ready":                  "an API server not ready; readyz failing on every upstream of a node",
	"extractedprism_clients_refused_total":           "refused clients",
	"extractedprism_connection_limit":                "nearing the connection bound",
	"extractedprism_discovery_errors_total":          "discovery failing",
	"extractedprism_discovery_running":               "discovery enabled but not running",
	"extractedprism_health_connections_closed_total": "the health server at its cap",
}

func TestObservabilityAlerts(t *testing.T) {
	registered := registeredMetrics(t)
	_, exprs := readAlerts(t)
	read := map[string]bool{}
	for _, expr := range exprs {
		if expr == "" {
			t.Errorf("%s: empty expr", alertsPath)
		}
		problems, used := checkQuery(expr, registered, false)
		for _, p := range problems {
			t.Errorf("%s: %s in %s", alertsPath, p, expr)
		}
		for _, name := range used {
			read[name] = true
		}
	}
	for _, name := range slices.Sorted(maps.Keys(alertsMustRead)) {
		if _, ok := registered[name]; !ok {
			t.Errorf("%s (%s) is not registered any more; update the alerts and this test", name, alertsMustRead[name])
		} else if !read[name] {
			t.Errorf("%s: no alert reads %s (%s)", alertsPath, name, alertsMustRead[name])
		}
	}
}

// series is one gathered sample: its labels and value.
type series struct {
	labels map[string]string
	value  float64
}

// selectSeries returns the series of the metric name gathered from g that
// carry the labels given, as a PromQL selector with = matchers would.
func selectSeries(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) []series {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var found []series
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			s := series{labels: map[string]string{}}
			for _, lp := range m.GetLabel() {
				s.labels[lp.GetName()] = lp.GetValue()
			}
			matches := true
			for k, v := range labels {
				matches = matches && s.labels[k] == v
			}
			if !matches {
				continue
			}
			switch {
			case m.GetGauge() != nil:
				s.value = m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				s.value = m.GetCounter().GetValue()
			default:
				t.Fatalf("%s: neither a gauge nor a counter", name)
			}
			found = append(found, s)
		}
	}
	return found
}

// comparisonRule is the one expression form firingSeries evaluates: a
// selector with = matchers compared with a number.
var (
	comparisonRule = regexp.MustCompile(`^([a-z_]+)\{([^}]*)\}\s*(==|!=|>|<)\s*([0-9.]+)$`)
	equalMatcher   = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"([^"]*)"`)
)

// firingSeries evaluates expr over what g gathers, as Prometheus evaluates
// an alert's expression at one instant, and returns the series for which it
// holds: each would be an alert once the pending time has passed.
func firingSeries(t *testing.T, expr string, g prometheus.Gatherer) []series {
	t.Helper()
	m := comparisonRule.FindStringSubmatch(expr)
	if m == nil {
		t.Fatalf("%q: not a selector compared with a number; firingSeries cannot evaluate it", expr)
	}
	name, matchers, op := m[1], m[2], m[3]
	bound, err := strconv.ParseFloat(m[4], 64)
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{}
	for _, lm := range equalMatcher.FindAllStringSubmatch(matchers, -1) {
		labels[lm[1]] = lm[2]
	}
	if len(labels) != len(labelMatcher.FindAllString(matchers, -1)) {
		t.Fatalf("%q: a matcher other than =; firingSeries cannot evaluate it", expr)
	}
	holds := map[string]func(v float64) bool{
		"==": func(v float64) bool { return v == bound },
		"!=": func(v float64) bool { return v != bound },
		">":  func(v float64) bool { return v > bound },
		"<":  func(v float64) bool { return v < bound },
	}[op]
	return slices.DeleteFunc(selectSeries(t, g, name, labels), func(s series) bool { return !holds(s.value) })
}

// TestObservabilityFiringSeries shows that firingSeries selects, compares
// and refuses what it cannot evaluate.
func TestObservabilityFiringSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := newMetrics(reg)
	m.discoveryRunning.WithLabelValues(kubeProviderName).Set(0)
	m.discoveryRunning.WithLabelValues(staticProviderName).Set(1)
	tests := []struct {
		expr string
		want []string // provider labels of the firing series, sorted
	}{
		{`extractedprism_discovery_running{provider="kubernetes"} == 0`, []string{kubeProviderName}},
		{`extractedprism_discovery_running{provider="static"} == 0`, nil},
		{`extractedprism_discovery_running{} < 1`, []string{kubeProviderName}},
		{`extractedprism_discovery_running{} > 0`, []string{staticProviderName}},
		{`extractedprism_discovery_running{provider="cache"} == 0`, nil},
	}
	for _, tt := range tests {
		var got []string
		for _, s := range firingSeries(t, tt.expr, reg) {
			got = append(got, s.labels[labelProvider])
		}
		slices.Sort(got)
		if !slices.Equal(got, tt.want) {
			t.Errorf("%s: got %q; want %q", tt.expr, got, tt.want)
		}
	}
}

// TestObservabilityDiscoveryNotRunningAlert evaluates the rule's expression
// over what the daemon exports: it holds for the kubernetes provider when
// discovery is enabled and could not start, its credentials are refused, or
// it stopped; not when discovery
// is off or runs (discovery_running is the merged provider's, whatever the
// provider: TestMergedReportsRunningProviders).
func TestObservabilityDiscoveryNotRunningAlert(t *testing.T) {
	names, exprs := readAlerts(t)
	i := slices.Index(names, "ExtractedprismDiscoveryNotRunning")
	if i < 0 {
		t.Fatalf("%s: no alert ExtractedprismDiscoveryNotRunning", alertsPath)
	}
	expr := exprs[i]
	wantKube := func(t *testing.T, got []series) {
		t.Helper()
		if len(got) != 1 || got[0].labels[labelProvider] != kubeProviderName {
			t.Errorf("%s holds for %v; want the kubernetes provider alone", expr, got)
		}
	}
	t.Run("no credentials", func(t *testing.T) {
		if _, err := os.Stat(defaultServiceAccountDir); !errors.Is(err, fs.ErrNotExist) {
			t.Skipf("%s exists here", defaultServiceAccountDir)
		}
		reg := prometheus.NewRegistry()
		cfg := &config{Endpoints: []string{"10.0.0.1:6443"}, EnableDiscovery: true}
		(&daemon{cfg: cfg, log: testLogger(t), listen: "127.0.0.1:7445"}).newDiscovery(newMetrics(reg))
		wantKube(t, firingSeries(t, expr, reg))
	})
	t.Run("credentials refused", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			h := startKube(t, 0)
			h.failList(apierrors.NewForbidden(schema.GroupResource{Group: "discovery.k8s.io", Resource: "endpointslices"}, "", errors.New("no")))
			synctest.Wait()
			wantKube(t, firingSeries(t, expr, h.reg))
			h.answerList("1", kubeSlice("a", "1", "10.0.0.1"))
			h.expectOut("10.0.0.1:6443")
			if got := firingSeries(t, expr, h.reg); len(got) != 0 {
				t.Errorf("once a List succeeds, %s holds for %v; want nothing", expr, got)
			}
		})
	})
	t.Run("discovery disabled", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		(&daemon{cfg: &config{Endpoints: []string{"10.0.0.1:6443"}}, log: testLogger(t), listen: "127.0.0.1:7445"}).newDiscovery(newMetrics(reg))
		if got := firingSeries(t, expr, reg); len(got) != 0 {
			t.Errorf("%s holds for %v; want nothing", expr, got)
		}
	})
	t.Run("kubernetes provider stopped", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			kube := newScripted(kubeProviderName, errors.New("kubernetes broke"))
			h := startMerged(t, []string{"10.0.0.1:6443"}, nil, kube)
			synctest.Wait()
			if got := firingSeries(t, expr, h.reg); len(got) != 0 {
				t.Errorf("while it runs, %s holds for %v; want nothing", expr, got)
			}
			close(kube.lists)
			synctest.Wait()
			wantKube(t, firingSeries(t, expr, h.reg))
			h.stop(t)
		})
	})
}
