package test

// Monitoring that reaches every instance: the alerts and the dashboard
// ship in the chart and in deploy/ from one source; the chart's
// PrometheusRule and dashboard ConfigMap; the job label the alerts select,
// whatever the release is called; and the node-level instances' way in,
// an opt-in in each example and deploy/prometheus/scrape-node-level.yaml.

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

var (
	// The single source of the alerts and the dashboard, inside the chart
	// because helm reads no file outside it; deploy/ holds copies.
	chartAlertsPath    = filepath.Join(chartDir, "files", "alerts.yaml")
	chartDashboardPath = filepath.Join(chartDir, "files", "dashboard.json")
	nodeScrapePath     = filepath.Join(repoRoot, "deploy", "prometheus", "scrape-node-level.yaml")
)

// errNoData is a query's answer without a series, or a file without the
// object sought.
var errNoData = errors.New("no data")

// alertJob is the job the alerts select, which the PodMonitor and the
// node-level scrape job both set.
const alertJob = "extractedprism"

// TestMonitoringOneSource checks that deploy/'s alerts and dashboard are
// the chart's files, byte for byte: copies rather than symbolic links,
// since a link reaches neither `kubectl apply -f <raw URL>` nor a Windows
// checkout.
func TestMonitoringOneSource(t *testing.T) {
	for source, copied := range map[string]string{chartAlertsPath: alertsPath, chartDashboardPath: dashboardPath} {
		want, err := os.ReadFile(source)
		if err != nil {
			t.Fatalf("%v", err)
		}
		got, err := os.ReadFile(copied)
		if err != nil {
			t.Fatalf("%v", err)
		}
		if info, err := os.Lstat(copied); err != nil {
			t.Errorf("%v", err)
		} else if info.Mode()&os.ModeSymlink != 0 {
			t.Errorf("%s: mode %v; want a regular file", copied, info.Mode())
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from %s, its source: cp %s %s", copied, source, source, copied)
		}
	}
}

// renderObjects renders values and returns the documents by kind; every
// kind at most once.
func renderObjects(t *testing.T, values map[string]any) map[string]*unstructured.Unstructured {
	t.Helper()
	text, err := renderYAML(t, values)
	if err != nil {
		t.Fatalf("%v", err)
	}
	docs, err := splitDocuments(text)
	if err != nil {
		t.Fatalf("%v", err)
	}
	byKind := map[string]*unstructured.Unstructured{}
	for _, d := range docs {
		if byKind[d.GetKind()] != nil {
			t.Fatalf("%s rendered twice", d.GetKind())
		}
		byKind[d.GetKind()] = d
	}
	return byKind
}

// monitoringValues turns on the PodMonitor, the PrometheusRule and the
// dashboard, with a surging rollout (the default) and more values.
func monitoringValues(more map[string]any) map[string]any {
	metrics := map[string]any{
		"expose":           true,
		"podMonitor":       map[string]any{"enabled": true},
		"prometheusRule":   map[string]any{"enabled": true},
		"grafanaDashboard": map[string]any{"enabled": true},
	}
	values := withEndpoints(map[string]any{"metrics": metrics})
	for k, v := range more {
		if m, ok := v.(map[string]any); ok && k == "metrics" {
			for mk, mv := range m {
				metrics[mk] = mv
			}
			continue
		}
		values[k] = v
	}
	return values
}

func TestMonitoringChartObjects(t *testing.T) {
	for _, tt := range []struct {
		name                  string
		values                map[string]any
		job, fullname, dashNS string
		ruleLabel, dashAnno   string
	}{
		{
			name:   "a release of another name",
			values: monitoringValues(map[string]any{"fullnameOverride": "node-apiproxy"}),
			job:    alertJob, fullname: "node-apiproxy", dashNS: releaseNamespace,
		},
		{
			name: "job from a pod label and the dashboard elsewhere",
			values: monitoringValues(map[string]any{
				"podLabels": map[string]any{"tier": "node-proxy"},
				"metrics": map[string]any{
					"podMonitor":       map[string]any{"enabled": true, "jobLabel": "tier"},
					"prometheusRule":   map[string]any{"enabled": true, "labels": map[string]any{"release": "prometheus"}},
					"grafanaDashboard": map[string]any{"enabled": true, "namespace": "monitoring", "annotations": map[string]any{"grafana_folder": "Platform"}},
				},
			}),
			job: "node-proxy", fullname: releaseName, dashNS: "monitoring", ruleLabel: "prometheus", dashAnno: "Platform",
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			objs := renderObjects(t, tt.values)
			checkChartRule(t, objs["PrometheusRule"], tt.job, tt.fullname, tt.ruleLabel)
			checkChartDashboard(t, objs["ConfigMap"], tt.fullname+"-dashboard", tt.dashNS, tt.dashAnno)
			checkPodMonitorJob(t, objs["PodMonitor"], tt.job)
		})
	}

	objs := renderObjects(t, withEndpoints(nil))
	for _, kind := range []string{"PodMonitor", "PrometheusRule", "ConfigMap"} {
		if objs[kind] != nil {
			t.Errorf("%s rendered by default; want it off until asked for", kind)
		}
	}
}

// checkChartRule checks the chart's PrometheusRule: alerts.yaml's groups,
// the scrape alert's job replaced by job, under the release's name.
func checkChartRule(t *testing.T, rule *unstructured.Unstructured, job, name, label string) {
	t.Helper()
	if rule == nil || rule.GetAPIVersion() != "monitoring.coreos.com/v1" {
		t.Fatalf("PrometheusRule %v; want a monitoring.coreos.com/v1 one", rule)
	}
	if rule.GetName() != name || rule.GetNamespace() != releaseNamespace || rule.GetLabels()["release"] != label {
		t.Errorf("PrometheusRule %s/%s, labels %v; want %s/%s with release=%q", rule.GetNamespace(), rule.GetName(), rule.GetLabels(), releaseNamespace, name, label)
	}
	data, err := os.ReadFile(chartAlertsPath)
	if err != nil {
		t.Fatalf("%v", err)
	}
	want := strings.ReplaceAll(string(data), `job="extractedprism"`, `job="`+job+`"`)
	var source struct {
		Spec map[string]any `json:"spec"`
	}
	if err := yaml.Unmarshal([]byte(want), &source); err != nil {
		t.Fatalf("%v", err)
	}
	got, _, _ := unstructured.NestedFieldNoCopy(rule.Object, "spec")
	if !reflect.DeepEqual(normalize(t, got), normalize(t, source.Spec)) {
		t.Errorf("PrometheusRule spec differs from %s's with job %q", chartAlertsPath, job)
	}
	if n := strings.Count(want, `up{job="`+job+`"}`); n < 2 {
		t.Errorf("the scrape alert selects job %q %d times; want it in each of its parts", job, n)
	}
}

// normalize round-trips v through JSON, so that numbers compare alike.
func normalize(t *testing.T, v any) any {
	t.Helper()
	data, err := yaml.Marshal(v)
	if err != nil {
		t.Fatalf("%v", err)
	}
	var out any
	if err := yaml.Unmarshal(data, &out); err != nil {
		t.Fatalf("%v", err)
	}
	return out
}

// checkChartDashboard checks the dashboard ConfigMap: the dashboard file
// byte for byte, with the Grafana sidecar's label.
func checkChartDashboard(t *testing.T, cm *unstructured.Unstructured, name, namespace, folder string) {
	t.Helper()
	if cm == nil {
		t.Fatal("no dashboard ConfigMap")
	}
	if cm.GetName() != name || cm.GetNamespace() != namespace || cm.GetLabels()["grafana_dashboard"] != "1" || cm.GetAnnotations()["grafana_folder"] != folder {
		t.Errorf("ConfigMap %s/%s, labels %v, annotations %v; want %s/%s, grafana_dashboard=1, grafana_folder=%q",
			cm.GetNamespace(), cm.GetName(), cm.GetLabels(), cm.GetAnnotations(), namespace, name, folder)
	}
	want, err := os.ReadFile(chartDashboardPath)
	if err != nil {
		t.Fatalf("%v", err)
	}
	got, _, _ := unstructured.NestedString(cm.Object, "data", "extractedprism.json")
	if got != string(want) {
		t.Errorf("the ConfigMap's extractedprism.json (%d bytes) differs from %s (%d bytes)", len(got), chartDashboardPath, len(want))
	}
}

// checkPodMonitorJob checks that the PodMonitor gives its targets the job
// the rule selects: its own relabeling, or the pod label jobLabel names.
func checkPodMonitorJob(t *testing.T, pm *unstructured.Unstructured, job string) {
	t.Helper()
	if pm == nil {
		t.Fatal("no PodMonitor")
	}
	jobLabel, _, _ := unstructured.NestedString(pm.Object, "spec", "jobLabel")
	eps, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
	if len(eps) != 1 {
		t.Fatalf("podMetricsEndpoints %v; want one", eps)
	}
	var set []string
	relabelings, _ := eps[0].(map[string]any)["relabelings"].([]any)
	for _, r := range relabelings {
		if r := r.(map[string]any); r["targetLabel"] == "job" {
			set = append(set, r["replacement"].(string))
		}
	}
	switch {
	case jobLabel == "" && !slices.Equal(set, []string{job}):
		t.Errorf("relabelings set job to %q; want [%q]", set, job)
	case jobLabel != "" && len(set) != 0:
		t.Errorf("jobLabel %q and relabelings setting job to %q; want the pod label's value alone", jobLabel, set)
	}
}

// TestMonitoringJobLabelNotOnPods: a jobLabel the pods lack would leave the
// operator's <namespace>/<name> job, which the rule does not select.
func TestMonitoringJobLabelNotOnPods(t *testing.T) {
	values := monitoringValues(map[string]any{"metrics": map[string]any{"podMonitor": map[string]any{"enabled": true, "jobLabel": "tier"}}})
	_, err := renderYAML(t, values)
	if err == nil || !strings.Contains(err.Error(), `metrics.podMonitor.jobLabel "tier" is no label of the pods`) {
		t.Errorf("render with a jobLabel the pods lack: %v; want the chart to refuse it", err)
	}
}

// nodeScrapeJob reads deploy/prometheus/scrape-node-level.yaml's one job,
// with its Kubernetes node discovery replaced by targets: Debian's
// Prometheus has no Kubernetes discovery, and no cluster runs here.
func nodeScrapeJob(t *testing.T, targets []map[string]any) map[string]any {
	t.Helper()
	data, err := os.ReadFile(nodeScrapePath)
	if err != nil {
		t.Fatalf("%v", err)
	}
	var file struct {
		ScrapeConfigs []map[string]any `json:"scrape_configs"`
	}
	if err := yaml.UnmarshalStrict(data, &file); err != nil {
		t.Fatalf("%s: %v", nodeScrapePath, err)
	}
	if len(file.ScrapeConfigs) != 1 {
		t.Fatalf("%s: %d scrape jobs; want one", nodeScrapePath, len(file.ScrapeConfigs))
	}
	job := file.ScrapeConfigs[0]
	sd, _ := job["kubernetes_sd_configs"].([]any)
	if job["job_name"] != alertJob || len(sd) != 1 || !reflect.DeepEqual(sd[0], map[string]any{"role": "node"}) {
		t.Fatalf("%s: job %v, kubernetes_sd_configs %v; want job_name %s with role node", nodeScrapePath, job["job_name"], sd, alertJob)
	}
	delete(job, "kubernetes_sd_configs")
	job["static_configs"] = targets
	return job
}

// nodeTarget is a target as Kubernetes node discovery lists it: the
// kubelet's address, with the node's name.
func nodeTarget(address, node string) map[string]any {
	return map[string]any{"targets": []string{address}, "labels": map[string]string{"__meta_kubernetes_node_name": node}}
}

// TestNodeLevelScrapeConfigInPrometheus runs the node-level scrape job in a
// real Prometheus, beside the chart's PodMonitor for a node whose pod IP is
// IPv6, and checks the labels the alerts and the dashboard read: job, node
// and the health port on the node's address, brackets kept for IPv6.
func TestNodeLevelScrapeConfigInPrometheus(t *testing.T) {
	promBin := prometheusBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	node := nodeScrapeJob(t, []map[string]any{nodeTarget("127.0.0.1:10250", "node-b"), nodeTarget("[::1]:10250", "node-c")})
	chart := podMonitorScrapeConfig(t, "7447", surgingPods("::1", "node-d"))
	prom := startPrometheus(ctx, t, dir, promBin, node, chart)

	want := map[string]string{"node-b": "127.0.0.1:7446", "node-c": "[::1]:7446", "node-d": "[::1]:7447"}
	got := map[string]string{}
	for _, labels := range activeTargets(ctx, t, prom) {
		if labels["job"] != alertJob {
			t.Errorf("target %v: job %q; want %q, which the alerts select", labels, labels["job"], alertJob)
		}
		if _, dup := got[labels["node"]]; dup {
			t.Errorf("node %q has two targets", labels["node"])
		}
		got[labels["node"]] = labels["instance"]
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("instances by node %v; want %v", got, want)
	}
	// The scrape alert's selector finds every node once it has tried them.
	waitFor(ctx, t, "every target scraped once", func() error {
		return promCount(ctx, prom, `count(up{job="extractedprism", node=~"node-[bcd]"}) == 3`)
	})
}

// promCount returns nil once expr returns a series.
func promCount(ctx context.Context, prom, expr string) error {
	n, err := promQuery(ctx, prom, expr)
	if err == nil && n == 0 {
		err = errNoData
	}
	return err
}

// optInLines are the commented lines of the kubeadm and Talos examples
// that serve the health server on every address.
var optInLines = []string{"# - name: EP_HEALTH_BIND_ADDRESS", "#   value: 0.0.0.0"}

// uncommentOptIn returns text with the opt-in lines uncommented, and how
// many it uncommented.
func uncommentOptIn(text string, commented []string) (string, int) {
	lines := strings.Split(text, "\n")
	n := 0
	for i, line := range lines {
		trimmed := strings.TrimSpace(line)
		if slices.Contains(commented, trimmed) {
			indent := line[:len(line)-len(strings.TrimLeft(line, " "))]
			lines[i] = indent + strings.TrimPrefix(strings.TrimPrefix(trimmed, "#"), " ")
			n++
		}
	}
	return strings.Join(lines, "\n"), n
}

// TestNodeLevelScrapeOptIn checks the static pods' opt-in: commented out as
// shipped, so the health server stays on loopback, and uncommented a pod
// whose health server listens on every address at the port the node-level
// scrape job targets, with probes that still reach it and settings the
// daemon accepts.
func TestNodeLevelScrapeOptIn(t *testing.T) {
	for path, pod := range map[string]func([]byte) (*corev1.Pod, error){
		kubeadmPodPath: func(data []byte) (*corev1.Pod, error) {
			var pod corev1.Pod
			return &pod, yaml.UnmarshalStrict(data, &pod)
		},
		talosPatchPath: func(data []byte) (*corev1.Pod, error) {
			var patch struct {
				Machine struct {
					Pods []corev1.Pod `json:"pods"`
				} `json:"machine"`
			}
			if err := yaml.Unmarshal(data, &patch); err != nil || len(patch.Machine.Pods) != 1 {
				return nil, errNoData
			}
			return &patch.Machine.Pods[0], nil
		},
	} {
		t.Run(filepath.Base(filepath.Dir(path)), func(t *testing.T) {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v", err)
			}
			shipped, err := pod(data)
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			if env := podEnv(shipped); env["EP_HEALTH_BIND_ADDRESS"] != "" {
				t.Errorf("%s sets EP_HEALTH_BIND_ADDRESS=%q; want loopback until the operator opts in", path, env["EP_HEALTH_BIND_ADDRESS"])
			}
			text, n := uncommentOptIn(string(data), optInLines)
			if n != len(optInLines) {
				t.Fatalf("%s: %d of the opt-in lines %q", path, n, optInLines)
			}
			opted, err := pod([]byte(text))
			if err != nil {
				t.Fatalf("%s uncommented: %v", path, err)
			}
			env := podEnv(opted)
			if env["EP_HEALTH_BIND_ADDRESS"] != "0.0.0.0" || cmp.Or(env["EP_HEALTH_PORT"], "7446") != "7446" {
				t.Errorf("uncommented: EP_HEALTH_BIND_ADDRESS=%q, EP_HEALTH_PORT=%q; want 0.0.0.0 and 7446, the scrape job's port", env["EP_HEALTH_BIND_ADDRESS"], env["EP_HEALTH_PORT"])
			}
			for _, p := range []*corev1.Probe{opted.Spec.Containers[0].LivenessProbe, opted.Spec.Containers[0].ReadinessProbe} {
				if p == nil || p.HTTPGet == nil || p.HTTPGet.Host != "127.0.0.1" || p.HTTPGet.Port.IntValue() != 7446 {
					t.Errorf("probe %v; want 127.0.0.1:7446, which 0.0.0.0 serves too", p)
				}
			}
			daemonCheck(t, env)
		})
	}
}

// podEnv returns the first container's literal environment values.
func podEnv(pod *corev1.Pod) map[string]string {
	env := map[string]string{}
	if len(pod.Spec.Containers) == 0 {
		return env
	}
	for _, e := range pod.Spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	return env
}

// daemonCheck runs `extractedprism check` with env alone and fails t
// unless the daemon accepts the settings.
func daemonCheck(t *testing.T, env map[string]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, daemonBinary(t), "check")
	cmd.Env = []string{}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "configuration is valid") {
		t.Errorf("extractedprism check with %v: %v\n%s", env, err, out)
	}
}
