package harness

import (
	"fmt"
	"runtime"
	"strings"
	"time"

	"github.com/extractedprism/extractedprism/e2e/controlplane"
)

// Report is a set of results with the settings they were measured with.
type Report struct {
	Settings Settings
	Started  time.Time
	Elapsed  time.Duration
	Daemon   string // how the daemon binary was made (source revision)
	Results  []Result
}

// Markdown renders the report: settings, the table, then the notes and
// failures of each row.
func (r Report) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# extractedprism end-to-end results\n\n")
	fmt.Fprintf(&b, "Run %s, %s in total, on %d CPUs (%s/%s).\n\n",
		r.Started.UTC().Format("2006-01-02 15:04 MST"), r.Elapsed.Round(time.Second), runtime.NumCPU(), runtime.GOOS, runtime.GOARCH)
	fmt.Fprintf(&b, "- Daemon: %s; `--health-interval %s --health-timeout %s --drain-timeout %s`, discovery on through `--kubeconfig`\n",
		r.Daemon, r.Settings.HealthInterval, r.Settings.HealthTimeout, r.Settings.DrainTimeout)
	fmt.Fprintf(&b, "- chart-defaults rows: the chart's defaults instead, `--health-check readyz --upstream-selection random --health-interval %s --health-timeout %s --drain-timeout %s`, the probe with a service-account token from the TokenRequest API\n",
		ChartSettings.HealthInterval, ChartSettings.HealthTimeout, ChartSettings.DrainTimeout)
	fmt.Fprintf(&b, "- +node rows: the node-level instance on the kubelet's credentials: discovery through a kubelet.conf naming w1's node client certificate (`system:node:%s`, group `system:nodes`), allowed by deploy/node-discovery-rbac.yaml, with readyz the probe presenting it too; only cp1 static, the endpoint cache on\n", nodeName)
	fmt.Fprintf(&b, "- Control plane: kube-apiserver and etcd %s built from source, 3 etcd members, one API server per node on its local member, `--authorization-mode Node,RBAC`, EndpointSlice watch cache off\n", controlplane.KubernetesVersion)
	fmt.Fprintf(&b, "- Workload in w1 through 127.0.0.1:7445: GET /version and a quorum read (a LIST of the row's ConfigMaps, `limit=1`, no resourceVersion), each on a fresh TLS connection every %s (timeout %s), 3 HTTP/2 ConfigMap watchers, one ConfigMap create every %s (timeout %s, new connection after a failure)\n",
		shortEvery, shortTimeout, writeEvery, writeTimeout)
	fmt.Fprintf(&b, "- Latencies are of successful GET /version requests (of quorum reads in each row's notes); a watch gap is how long a written object waited before a watcher received it; recovery is fault to the end of the last failure (a GET /version, quorum read or write that failed, or a watch event more than %s late), on the harness's clock (— for no fault, 0 for nothing failed)\n\n", lateDelivery)

	writeTable(&b, r.Results)
	writeRows(&b, r.Results)
	b.WriteString("\n## Scenarios\n\n")
	seen := map[string]bool{}
	for _, res := range r.Results {
		if seen[res.Scenario] {
			continue
		}
		seen[res.Scenario] = true
		fmt.Fprintf(&b, "- **%s**: %s\n", res.Scenario, ScenarioDescriptions[res.Scenario])
	}
	return b.String()
}

// writeTable writes the result table, a line per row.
func writeTable(b *strings.Builder, results []Result) {
	b.WriteString("| # | Scenario | Mode | Result | Victim | Short failed/total (late) | Quorum read failed/total (late) | p50 | p99 | max | Watch gap per watcher | Writes failed/total | Recovery |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for i, res := range results {
		m := res.Measure
		if res.Status == StatusNotBuilt || (res.Status == StatusError && m.Shorts.Total == 0) {
			fmt.Fprintf(b, "| %d | %s | %s | %s | | | | | | | | | |\n", i+1, res.Scenario, res.Mode, res.Status)
			continue
		}
		var gaps []string
		for _, w := range m.Watchers {
			g := ms(w.MaxGap)
			if w.Upstream != "" {
				g += " (" + nodeOf(w.Upstream) + ")"
			}
			gaps = append(gaps, g)
		}
		recovery := "—"
		if m.Recovery >= 0 {
			recovery = ms(m.Recovery)
		}
		fmt.Fprintf(b, "| %d | %s | %s | %s | %s | %d/%d (%d) | %d/%d (%d) | %s | %s | %s | %s | %d/%d | %s |\n",
			i+1, res.Scenario, res.Mode, res.Status, res.Victim,
			m.Shorts.Failed, m.Shorts.Total, m.Shorts.FailedLate, m.Quorum.Failed, m.Quorum.Total, m.Quorum.FailedLate,
			ms(m.Shorts.P50), ms(m.Shorts.P99), ms(m.Shorts.Max),
			strings.Join(gaps, ", "), m.Writes.Failed, m.Writes.Total, recovery)
	}
}

// writeRows writes each row's assertions, failures and notes.
func writeRows(b *strings.Builder, results []Result) {
	b.WriteString("\n## Rows\n\n")
	for i, res := range results {
		fmt.Fprintf(b, "%d. **%s %s: %s** (%s)", i+1, res.Scenario, res.Mode, res.Status, res.Elapsed.Round(time.Second))
		if res.Err != "" {
			fmt.Fprintf(b, " %s", firstLine(res.Err))
		}
		b.WriteString("\n")
		for _, a := range res.Asserted {
			fmt.Fprintf(b, "   - asserts: %s\n", a)
		}
		for _, f := range res.Failures {
			fmt.Fprintf(b, "   - **failed:** %s\n", firstLine(f))
		}
		for _, n := range res.Notes {
			fmt.Fprintf(b, "   - %s\n", n)
		}
		if m := res.Measure; m.Shorts.FirstErr != "" {
			fmt.Fprintf(b, "   - first short-request error: %s\n", firstLine(m.Shorts.FirstErr))
		}
		if m := res.Measure; m.Quorum.Total > 0 {
			fmt.Fprintf(b, "   - quorum reads: %d/%d failed (%d late), p50 %s, max %s\n",
				m.Quorum.Failed, m.Quorum.Total, m.Quorum.FailedLate, ms(m.Quorum.P50), ms(m.Quorum.Max))
		}
		if m := res.Measure; m.Quorum.FirstErr != "" {
			fmt.Fprintf(b, "   - first quorum-read error: %s\n", firstLine(m.Quorum.FirstErr))
		}
		if m := res.Measure; m.Writes.FirstErr != "" {
			fmt.Fprintf(b, "   - first write error: %s\n", firstLine(m.Writes.FirstErr))
		}
	}
}

func ms(d time.Duration) string {
	switch {
	case d < time.Second:
		return fmt.Sprintf("%d ms", d.Milliseconds())
	default:
		return fmt.Sprintf("%.1f s", d.Seconds())
	}
}

func nodeOf(addr string) string {
	for _, n := range append(CPNames, "cp4") {
		if APIAddr(n) == addr {
			return n
		}
	}
	return addr
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
