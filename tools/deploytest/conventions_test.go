package test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// ciDir holds the chart's example values files, each of which the tests
// lint, render and send to the API server.
var ciDir = filepath.Join(chartDir, "ci")

// ciValuesFiles lists the example values files in ciDir.
func ciValuesFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(ciDir, "*-values.yaml"))
	if err != nil {
		t.Fatalf("%v", err)
	}
	if len(files) < 2 {
		t.Fatalf("%d values files in %s; want the defaults and the conventions at least", len(files), ciDir)
	}
	return files
}

// TestHelmLintExamples runs helm lint --strict over every example values
// file: a warning fails it as an error would.
func TestHelmLintExamples(t *testing.T) {
	for _, file := range ciValuesFiles(t) {
		t.Run(filepath.Base(file), func(t *testing.T) {
			out, err := runHelm(t, "lint", "--strict", chartDir, "--namespace", releaseNamespace, "--values", file)
			if err != nil {
				t.Fatalf("%v", err)
			}
			if !strings.Contains(out, "0 chart(s) failed") || strings.Contains(out, "[WARNING]") {
				t.Errorf("helm lint output:\n%s", out)
			}
		})
	}
}

// TestTemplateConventions renders ci/conventions-values.yaml, which sets
// every convention value at once, and checks that each lands where it
// should, on the DaemonSet and, where it concerns the check, on its Job.
func TestTemplateConventions(t *testing.T) {
	m := render(t, nil, "--values", filepath.Join(ciDir, "conventions-values.yaml"))
	checkInvariants(t, m)
	ds, pod, c := m.DaemonSet, m.DaemonSet.Spec.Template.Spec, container(t, m)

	// Names and labels.
	if ds.Name != "node-apiproxy" || pod.ServiceAccountName != "node-apiproxy" || m.CheckJob.Name != "node-apiproxy-check" {
		t.Errorf("DaemonSet %q, ServiceAccount %q, Job %q; want fullnameOverride node-apiproxy", ds.Name, pod.ServiceAccountName, m.CheckJob.Name)
	}
	if got := ds.Spec.Selector.MatchLabels["app.kubernetes.io/name"]; got != "apiproxy" {
		t.Errorf("selector app.kubernetes.io/name = %q; want nameOverride apiproxy", got)
	}
	for _, doc := range m.Docs {
		if doc.GetLabels()["team"] != "platform" {
			t.Errorf("%s %s labels %v; want commonLabels team=platform", doc.GetKind(), doc.GetName(), doc.GetLabels())
		}
	}
	podMeta := ds.Spec.Template.ObjectMeta
	if podMeta.Labels["team"] != "platform" || podMeta.Labels["tier"] != "node" || podMeta.Annotations["example.com/owner"] != "platform" {
		t.Errorf("pod labels %v, annotations %v; want commonLabels, podLabels and podAnnotations", podMeta.Labels, podMeta.Annotations)
	}
	if got := m.CheckJob.Spec.Template.Labels["team"]; got != "platform" {
		t.Errorf("check pod label team = %q; want commonLabels on the Job's pod too", got)
	}

	// Image and scheduling.
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	if want := "registry.example/mirror/extractedprism@" + digest; c.Image != want {
		t.Errorf("image = %q; want %q: the digest wins over the tag", c.Image, want)
	}
	// global.imagePullSecrets first, a bare name among them, each name once.
	if want := []corev1.LocalObjectReference{{Name: "platform-pull"}, {Name: "mirror-credentials"}}; !slices.Equal(pod.ImagePullSecrets, want) {
		t.Errorf("imagePullSecrets = %v; want %v, global's and the chart's", pod.ImagePullSecrets, want)
	}
	wantTolerations := []corev1.Toleration{{Key: "node-role.kubernetes.io/control-plane", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	if !slices.Equal(pod.Tolerations, wantTolerations) {
		t.Errorf("tolerations = %v; want %v, the values' list in place of the default", pod.Tolerations, wantTolerations)
	}
	if pod.NodeSelector["example.com/pool"] != "general" || pod.Affinity == nil || pod.Affinity.NodeAffinity == nil {
		t.Errorf("nodeSelector %v, affinity %v; want the values'", pod.NodeSelector, pod.Affinity)
	}
	if pod.PriorityClassName != "system-cluster-critical" {
		t.Errorf("priorityClassName = %q; want system-cluster-critical", pod.PriorityClassName)
	}

	// Arguments, environment, volumes, resources.
	if !slices.Equal(c.Args, []string{"--log-level=debug"}) {
		t.Errorf("args = %v; want extraArgs", c.Args)
	}
	if last := c.Env[len(c.Env)-1]; last.Name != "GODEBUG" || last.Value != "tlsrsakex=0" {
		t.Errorf("last env entry = %+v; want extraEnv's GODEBUG", last)
	}
	if got := envValues(t, c)["EP_HEALTH_CHECK_CA_FILE"]; got != "/etc/extractedprism/api-ca/ca.crt" {
		t.Errorf("EP_HEALTH_CHECK_CA_FILE = %q; want the CA bundle from extraVolumes", got)
	}
	if vols, mounts := ownVolumes(pod), ownMounts(c); len(vols) != 1 || vols[0].ConfigMap == nil || vols[0].ConfigMap.Name != "api-serving-ca" ||
		len(mounts) != 1 || mounts[0].MountPath != "/etc/extractedprism/api-ca" || !mounts[0].ReadOnly {
		t.Errorf("volumes %v, mounts %v; want the ConfigMap api-serving-ca read-only at /etc/extractedprism/api-ca", vols, mounts)
	}
	// The socket in the values' directory, named after fullnameOverride.
	if got, want := envValues(t, c)["EP_HANDOVER_SOCKET"], "/run/node-apiproxy/node-apiproxy.sock"; got != want {
		t.Errorf("EP_HANDOVER_SOCKET = %q; want %q", got, want)
	}
	if mem := c.Resources.Limits[corev1.ResourceMemory]; mem.String() != "160Mi" {
		t.Errorf("memory limit = %s; want 160Mi", mem.String())
	}

	// Security contexts: the values merged over the chart's, which stay.
	for where, sc := range map[string]*corev1.PodSecurityContext{"DaemonSet": pod.SecurityContext, "check Job": m.CheckJob.Spec.Template.Spec.SecurityContext} {
		if !slices.Equal(sc.SupplementalGroups, []int64{65534}) || sc.RunAsUser == nil || *sc.RunAsUser != daemonUID {
			t.Errorf("%s pod securityContext = %+v; want supplementalGroups [65534] added to the chart's UID %d", where, sc, daemonUID)
		}
	}

	// Probes: timing merged into the chart's handler, or one of its own.
	lp := c.LivenessProbe
	if lp.PeriodSeconds != 20 || lp.FailureThreshold != 5 || lp.TimeoutSeconds != 3 || lp.HTTPGet == nil || lp.HTTPGet.Path != "/healthz" {
		t.Errorf("livenessProbe = %+v; want period 20, threshold 5, the default timeout 3 and the chart's GET /healthz", lp)
	}
	rp := c.ReadinessProbe
	if rp.HTTPGet == nil || rp.HTTPGet.Path != "/readyz" || rp.PeriodSeconds != 3 || len(rp.HTTPGet.HTTPHeaders) != 1 {
		t.Errorf("readinessProbe = %+v; want the values' own handler, with its header, every 3 s", rp)
	}
	sp := c.StartupProbe
	if sp == nil || sp.HTTPGet == nil || sp.HTTPGet.Path != "/healthz" || sp.HTTPGet.Host != "127.0.0.1" || sp.PeriodSeconds != 1 || sp.FailureThreshold != 30 {
		t.Errorf("startupProbe = %+v; want GET /healthz on 127.0.0.1 every 1 s, 30 failures", sp)
	}

	checkCommunityConventions(t, m)

	// The check runs with the same arguments and environment, and passes.
	checkPasses(t, m)
}

// checkCommunityConventions checks the values of the conventions file that
// the prometheus-community charts have too (their pull secrets apart).
func checkCommunityConventions(t *testing.T, m *manifest) {
	t.Helper()
	ds, pod := m.DaemonSet, m.DaemonSet.Spec.Template.Spec
	if ds.Namespace != "node-proxies" || m.ServiceAccount == nil || m.ServiceAccount.Namespace != "node-proxies" || m.CheckJob.Namespace != "node-proxies" {
		t.Errorf("DaemonSet in %q, ServiceAccount %v, check Job in %q; want all in namespaceOverride node-proxies", ds.Namespace, m.ServiceAccount, m.CheckJob.Namespace)
	}
	if ds.Annotations["example.com/change"] != "OPS-1234" || ds.Spec.Template.Annotations["example.com/change"] != "" {
		t.Errorf("DaemonSet annotations %v, pod annotations %v; want daemonsetAnnotations on the DaemonSet only", ds.Annotations, ds.Spec.Template.Annotations)
	}
	if show(ds.Spec.RevisionHistoryLimit) != "3" || show(pod.TerminationGracePeriodSeconds) != "45" {
		t.Errorf("revisionHistoryLimit %s, terminationGracePeriodSeconds %s; want 3 and 45", show(ds.Spec.RevisionHistoryLimit), show(pod.TerminationGracePeriodSeconds))
	}
	if ics := pod.InitContainers; len(ics) != 2 || ics[0].Name != "handover-dir" || ics[1].Name != "sysctl-check" {
		t.Errorf("init containers %v; want handover-dir, then extraInitContainers' sysctl-check", ics)
	}
	if len(m.Roles) != 0 || len(m.RoleBindings) != 0 {
		t.Errorf("%d Roles, %d RoleBindings with rbac.create=false; want none", len(m.Roles), len(m.RoleBindings))
	}
}

// TestTemplateExtraArgsWinOverEnv checks that a flag from extraArgs beats
// the variable the chart sets for it, in the check Job as in the daemon: a
// --health-timeout of 5s is refused under the default 5s interval,
// although EP_HEALTH_TIMEOUT says 2s.
func TestTemplateExtraArgsWinOverEnv(t *testing.T) {
	m := render(t, withEndpoints(map[string]any{"extraArgs": []string{"--health-timeout=5s"}}))
	checkInvariants(t, m)
	if got := envValues(t, container(t, m))["EP_HEALTH_TIMEOUT"]; got != "2s" {
		t.Fatalf("EP_HEALTH_TIMEOUT = %q; want the default 2s, which the flag overrides", got)
	}
	checkFails(t, m, "--health-timeout (EP_HEALTH_TIMEOUT) must be less than --health-interval (EP_HEALTH_INTERVAL): got 5s >= 5s")
}

// renderAsSubchart renders the chart as a dependency of a parent chart
// made in a temporary directory, through helm dependency build, with the
// parent's values: helm hands the subchart its block and the globals.
func renderAsSubchart(t *testing.T, parentValues map[string]any) string {
	t.Helper()
	parent := filepath.Join(t.TempDir(), "parent")
	if err := os.MkdirAll(parent, 0o700); err != nil {
		t.Fatalf("%v", err)
	}
	abs, err := filepath.Abs(chartDir)
	if err != nil {
		t.Fatalf("%v", err)
	}
	chartYAML, err := yaml.Marshal(map[string]any{
		"apiVersion": "v2", "name": "parent", "version": "0.1.0",
		"dependencies": []map[string]any{{"name": "extractedprism", "version": ">=0.0.0-0", "repository": "file://" + abs}},
	})
	if err != nil {
		t.Fatalf("%v", err)
	}
	writeFile(t, filepath.Join(parent, "Chart.yaml"), chartYAML)
	values, err := yaml.Marshal(parentValues)
	if err != nil {
		t.Fatalf("%v", err)
	}
	writeFile(t, filepath.Join(parent, "values.yaml"), values)
	if out, err := runHelm(t, "dependency", "build", parent); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	out, err := runHelm(t, "template", "platform", parent, "--namespace", releaseNamespace)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return out
}

// subchartValues is a parent's values: a global registry mirror and its
// pull secret, globals of its own that the chart must accept, and the
// chart's block.
var subchartValues = map[string]any{
	"global": map[string]any{"imageRegistry": "mirror.example", "imagePullSecrets": []any{map[string]any{"name": "mirror-pull"}}, "storageClass": "fast"},
	"extractedprism": map[string]any{
		"endpoints":    exampleEndpoints,
		"commonLabels": map[string]any{"umbrella": "platform"},
		"logLevel":     "warn",
	},
}

// TestTemplateAsSubchart renders the chart as a parent chart's dependency
// and checks that the subchart's values and global.imageRegistry apply.
func TestTemplateAsSubchart(t *testing.T) {
	m := decodeManifest(t, renderAsSubchart(t, subchartValues))
	checkInvariants(t, m)
	c := container(t, m)
	env := envValues(t, c)
	if env["EP_ENDPOINTS"] != strings.Join(exampleEndpoints, ",") || env["EP_LOG_LEVEL"] != "warn" {
		t.Errorf("EP_ENDPOINTS = %q, EP_LOG_LEVEL = %q; want the parent's values for the subchart", env["EP_ENDPOINTS"], env["EP_LOG_LEVEL"])
	}
	if want := "mirror.example/extractedprism/extractedprism:" + chartAppVersion(t); c.Image != want {
		t.Errorf("image = %q; want %q, global.imageRegistry in place of image.registry", c.Image, want)
	}
	// The check Job's are the DaemonSet's (checkHookJob).
	if want := []corev1.LocalObjectReference{{Name: "mirror-pull"}}; !slices.Equal(m.DaemonSet.Spec.Template.Spec.ImagePullSecrets, want) {
		t.Errorf("imagePullSecrets = %v; want %v, global.imagePullSecrets", m.DaemonSet.Spec.Template.Spec.ImagePullSecrets, want)
	}
	if m.DaemonSet.Name != "platform-extractedprism" {
		t.Errorf("DaemonSet name = %q; want platform-extractedprism, the parent's release name", m.DaemonSet.Name)
	}
	for _, doc := range m.Docs {
		if doc.GetLabels()["umbrella"] != "platform" {
			t.Errorf("%s %s labels %v; want the subchart's commonLabels", doc.GetKind(), doc.GetName(), doc.GetLabels())
		}
	}
	checkPasses(t, m)
}

// TestArtifactHubImage holds the image Chart.yaml declares to Artifact Hub
// (which scans it) to the image the default render runs.
func TestArtifactHubImage(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		t.Fatalf("%v", err)
	}
	var chart struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := yaml.Unmarshal(data, &chart); err != nil {
		t.Fatalf("Chart.yaml: %v", err)
	}
	var images []struct {
		Name      string   `json:"name"`
		Image     string   `json:"image"`
		Platforms []string `json:"platforms"`
	}
	if err := yaml.UnmarshalStrict([]byte(chart.Annotations["artifacthub.io/images"]), &images); err != nil {
		t.Fatalf("artifacthub.io/images: %v", err)
	}
	m := render(t, withEndpoints(nil))
	if len(images) != 1 || images[0].Image != container(t, m).Image {
		t.Errorf("artifacthub.io/images = %+v; want the default render's image %q", images, container(t, m).Image)
	}
	if chart.Annotations["artifacthub.io/license"] != "BSD-3-Clause" {
		t.Errorf("artifacthub.io/license = %q; want BSD-3-Clause, as LICENSE", chart.Annotations["artifacthub.io/license"])
	}
}
