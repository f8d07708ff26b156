package test

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

const (
	serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"
	kubeletCertPath   = "/var/lib/kubelet/pki/kubelet-client-current.pem"
	// daemonUID is the chart's UID and GID for the daemon, its own: not
	// 65534, nobody, whose other processes could take the hand-over.
	daemonUID = int64(7445)
)

// withEndpoints returns values with the example endpoints added to the
// given ones.
func withEndpoints(values map[string]any) map[string]any {
	out := map[string]any{"endpoints": exampleEndpoints}
	maps.Copy(out, values)
	return out
}

func TestHelmLint(t *testing.T) {
	for _, values := range []map[string]any{
		withEndpoints(nil),
		withEndpoints(map[string]any{
			"healthCheck": "readyz",
			"readyz":      map[string]any{"credentials": "kubeletCertificate"},
			"metrics":     map[string]any{"expose": true, "podMonitor": map[string]any{"enabled": true}},
			"discovery":   map[string]any{"nodeRBAC": true},
			"handover":    map[string]any{"surge": false},
		}),
		withEndpoints(map[string]any{"handover": map[string]any{"enabled": false}}),
	} {
		if out, err := runHelm(t, "lint", "--strict", chartDir, "--namespace", releaseNamespace, "--values", valuesFile(t, values)); err != nil {
			t.Errorf("helm lint with %v: %v", values, err)
		} else if !strings.Contains(out, "0 chart(s) failed") {
			t.Errorf("helm lint output does not report success:\n%s", out)
		}
	}
}

// chartAppVersion reads appVersion from Chart.yaml, the default image tag.
func chartAppVersion(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		t.Fatalf("%v", err)
	}
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(data, &chart); err != nil {
		t.Fatalf("Chart.yaml: %v", err)
	}
	if chart.AppVersion == "" {
		t.Fatal("Chart.yaml has no appVersion")
	}
	return chart.AppVersion
}

// templateCase is one set of values the chart must render, and what the
// values are meant to change in the result.
type templateCase struct {
	name   string
	values map[string]any
	check  func(t *testing.T, m *manifest)
	// readsNode: the environment takes a value from the node (the downward
	// API's status.hostIP), which only a kubelet resolves, so the test does
	// not run the check hook's command.
	readsNode bool
}

// templateCases is the matrix TestTemplateMatrix checks and the API-server
// test sends to a real kube-apiserver. appVersion is the chart's, the
// default image tag.
func templateCases(appVersion string) []templateCase {
	return []templateCase{
		{
			name:   "defaults with endpoints",
			values: withEndpoints(nil),
			check: func(t *testing.T, m *manifest) {
				pod := m.DaemonSet.Spec.Template.Spec
				c := container(t, m)
				wantEnv := map[string]string{
					"EP_ENDPOINTS":          strings.Join(exampleEndpoints, ","),
					"EP_BIND_ADDRESS":       "127.0.0.1",
					"EP_BIND_PORT":          "7445",
					"EP_HEALTH_PORT":        "7446",
					"EP_HEALTH_INTERVAL":    "5s",
					"EP_HEALTH_TIMEOUT":     "2s",
					"EP_ENABLE_DISCOVERY":   "true",
					"EP_LOG_LEVEL":          "info",
					"EP_LIVENESS_INTERVAL":  "5s",
					"EP_LIVENESS_THRESHOLD": "15s",
					"EP_DRAIN_TIMEOUT":      "4s",
					"EP_REBALANCE_PERIOD":   "1m",
					"EP_UPSTREAM_SELECTION": "random",
					// readyz with the pod's own token and the cluster CA,
					// both from the service-account volume.
					"EP_HEALTH_CHECK":             "readyz",
					"EP_HEALTH_CHECK_CA_FILE":     serviceAccountDir + "/ca.crt",
					"EP_HEALTH_CHECK_SERVER_NAME": "kubernetes.default.svc",
					"EP_HEALTH_CHECK_TOKEN_FILE":  serviceAccountDir + "/token",
					// The release's socket in the default directory.
					"EP_HANDOVER_SOCKET": "/run/extractedprism-chart/" + releaseName + ".sock",
				}
				if got := envValues(t, c); !maps.Equal(got, wantEnv) {
					t.Errorf("env = %v; want %v", got, wantEnv)
				}
				if want := "ghcr.io/extractedprism/extractedprism:" + appVersion; c.Image != want {
					t.Errorf("image = %q; want %q", c.Image, want)
				}
				if c.ImagePullPolicy != corev1.PullIfNotPresent {
					t.Errorf("imagePullPolicy = %q; want IfNotPresent", c.ImagePullPolicy)
				}
				checkNodeCritical(t, pod)
				checkConventionDefaults(t, m)
				if len(c.Args) != 0 || c.StartupProbe != nil {
					t.Errorf("args %v, startupProbe %v; want none by default", c.Args, c.StartupProbe)
				}
				checkDiscoveryRBAC(t, m)
				if !boolValue(pod.AutomountServiceAccountToken) {
					t.Error("automountServiceAccountToken is not true with discovery on")
				}
				if m.ServiceAccount == nil || m.ServiceAccount.Name != releaseName {
					t.Errorf("ServiceAccount = %v; want one named %q", m.ServiceAccount, releaseName)
				}
				checkProbeHost(t, c, "127.0.0.1")
				if len(c.Ports) != 0 {
					t.Errorf("ports = %v; want none while the health server is on loopback", c.Ports)
				}
				// The hand-over directory only (checkHandover checks it).
				if len(ownVolumes(pod)) != 0 || len(ownMounts(c)) != 0 {
					t.Errorf("volumes %v, mounts %v; want the hand-over directory's only", pod.Volumes, c.VolumeMounts)
				}
				checkSurge(t, m)
				checkResources(t, c)
				// A pod that goes ready and then stops serving must be seen
				// before the rollout moves on: failureThreshold probes a
				// period apart, the last one timing out.
				rp := c.ReadinessProbe
				if seen := rp.PeriodSeconds*rp.FailureThreshold + rp.TimeoutSeconds; m.DaemonSet.Spec.MinReadySeconds <= seen {
					t.Errorf("minReadySeconds = %d; want more than the %d s the readiness probe may take to see a failed pod", m.DaemonSet.Spec.MinReadySeconds, seen)
				}
				if m.PodMonitor != nil {
					t.Error("PodMonitor rendered by default")
				}
				if m.CheckJob == nil {
					t.Error("no check Job rendered by default")
				}
			},
		},
		{
			name:   "check hook off",
			values: withEndpoints(map[string]any{"configCheck": map[string]any{"enabled": false}}),
			check: func(t *testing.T, m *manifest) {
				if m.CheckJob != nil {
					t.Error("check Job rendered with configCheck.enabled=false")
				}
			},
		},
		{
			name:   "discovery off",
			values: withEndpoints(map[string]any{"discovery": map[string]any{"enabled": false}}),
			check: func(t *testing.T, m *manifest) {
				if got := envValues(t, container(t, m))["EP_ENABLE_DISCOVERY"]; got != "false" {
					t.Errorf("EP_ENABLE_DISCOVERY = %q; want false", got)
				}
				if len(m.Roles) != 0 || len(m.RoleBindings) != 0 {
					t.Errorf("discovery off renders %d Roles and %d RoleBindings; want none", len(m.Roles), len(m.RoleBindings))
				}
				// The default readyz check still reads the token and CA.
				if !boolValue(m.DaemonSet.Spec.Template.Spec.AutomountServiceAccountToken) {
					t.Error("the service-account token is not mounted, which the readyz check reads")
				}
			},
		},
		{
			// Node-level instances run discovery with the kubelet's
			// credentials: the nodes get the grant of
			// deploy/node-discovery-rbac.yaml, the pods keep theirs.
			name:   "node RBAC",
			values: withEndpoints(map[string]any{"discovery": map[string]any{"nodeRBAC": true}}),
			check: func(t *testing.T, m *manifest) {
				pods, nodes := splitRBAC(m)
				checkDiscoveryRBAC(t, pods)
				checkNodeDiscoveryRBAC(t, nodes)
				if pods.Roles[0].Name == nodes.Roles[0].Name {
					t.Errorf("both Roles are named %q", pods.Roles[0].Name)
				}
			},
		},
		{
			// The chart's pods may run without discovery (serving
			// kube-proxy only) while the node-level instances run it.
			name:   "node RBAC without discovery",
			values: withEndpoints(map[string]any{"discovery": map[string]any{"enabled": false, "nodeRBAC": true}}),
			check: func(t *testing.T, m *manifest) {
				pods, nodes := splitRBAC(m)
				if len(pods.Roles) != 0 || len(pods.RoleBindings) != 0 {
					t.Errorf("discovery off renders %d Roles and %d RoleBindings for the pods; want none", len(pods.Roles), len(pods.RoleBindings))
				}
				checkNodeDiscoveryRBAC(t, nodes)
				if got := envValues(t, container(t, m))["EP_ENABLE_DISCOVERY"]; got != "false" {
					t.Errorf("EP_ENABLE_DISCOVERY = %q; want false", got)
				}
			},
		},
		{
			// The fallback where the cluster CA does not sign the API
			// servers' serving certificates: the readyz settings, defaults
			// included, are left out rather than refused.
			name:   "tcp check without discovery",
			values: withEndpoints(map[string]any{"healthCheck": "tcp", "discovery": map[string]any{"enabled": false}}),
			check: func(t *testing.T, m *manifest) {
				env := envValues(t, container(t, m))
				if env["EP_HEALTH_CHECK"] != "tcp" {
					t.Errorf("EP_HEALTH_CHECK = %q; want tcp", env["EP_HEALTH_CHECK"])
				}
				for name := range env {
					if strings.HasPrefix(name, "EP_HEALTH_CHECK_") {
						t.Errorf("%s set with the tcp check", name)
					}
				}
				if boolValue(m.DaemonSet.Spec.Template.Spec.AutomountServiceAccountToken) {
					t.Error("the service-account token is mounted although nothing reads it")
				}
			},
		},
		{
			name: "endpoint cache on a host directory",
			values: withEndpoints(map[string]any{
				"discovery": map[string]any{"cache": map[string]any{"enabled": true, "hostPath": "/var/lib/extractedprism"}},
			}),
			check: func(t *testing.T, m *manifest) {
				pod := m.DaemonSet.Spec.Template.Spec
				c := container(t, m)
				if got, want := envValues(t, c)["EP_ENDPOINT_CACHE_FILE"], "/var/lib/extractedprism/endpoints.json"; got != want {
					t.Errorf("EP_ENDPOINT_CACHE_FILE = %q; want %q", got, want)
				}
				vols := ownVolumes(pod)
				if len(vols) != 1 || vols[0].HostPath == nil || vols[0].HostPath.Path != "/var/lib/extractedprism" ||
					vols[0].HostPath.Type == nil || *vols[0].HostPath.Type != corev1.HostPathDirectoryOrCreate {
					t.Errorf("volumes = %v; want hostPath /var/lib/extractedprism, DirectoryOrCreate", vols)
				}
				// The daemon writes the file, so this one mount is writable.
				mounts := ownMounts(c)
				if len(mounts) != 1 || mounts[0].MountPath != "/var/lib/extractedprism" || mounts[0].ReadOnly {
					t.Errorf("mounts = %v; want /var/lib/extractedprism read-write", mounts)
				}
			},
		},
		{
			name: "endpoint cache in an emptyDir",
			values: withEndpoints(map[string]any{
				"discovery": map[string]any{"cache": map[string]any{"enabled": true}},
			}),
			check: func(t *testing.T, m *manifest) {
				pod := m.DaemonSet.Spec.Template.Spec
				vols := ownVolumes(pod)
				if len(vols) != 1 || vols[0].EmptyDir == nil {
					t.Errorf("volumes = %v; want one emptyDir", vols)
				}
				if envValues(t, container(t, m))["EP_ENDPOINT_CACHE_FILE"] == "" {
					t.Error("EP_ENDPOINT_CACHE_FILE is not set")
				}
			},
		},
		{
			name: "readyz with a client certificate from a Secret",
			values: withEndpoints(map[string]any{
				"healthCheck": "readyz",
				"readyz":      map[string]any{"credentials": "clientCertificate", "clientCertificate": map[string]any{"secretName": "ep-readyz.client"}},
			}),
			check: func(t *testing.T, m *manifest) {
				pod := m.DaemonSet.Spec.Template.Spec
				c := container(t, m)
				env := envValues(t, c)
				const dir = "/etc/extractedprism/readyz-client"
				if env["EP_HEALTH_CHECK_CERT_FILE"] != dir+"/tls.crt" || env["EP_HEALTH_CHECK_KEY_FILE"] != dir+"/tls.key" {
					t.Errorf("cert %q, key %q; want the Secret's tls.crt and tls.key under %s", env["EP_HEALTH_CHECK_CERT_FILE"], env["EP_HEALTH_CHECK_KEY_FILE"], dir)
				}
				vols := ownVolumes(pod)
				if len(vols) != 1 || vols[0].Secret == nil || vols[0].Secret.SecretName != "ep-readyz.client" {
					t.Fatalf("volumes = %v; want the Secret ep-readyz.client", vols)
				}
				// The files are root's; the daemon, UID 7445, must read them.
				if mode := vols[0].Secret.DefaultMode; mode == nil || *mode&0o004 == 0 {
					t.Errorf("defaultMode = %s; want the files readable by UID %d", show(mode), daemonUID)
				}
				mounts := ownMounts(c)
				if len(mounts) != 1 || mounts[0].Name != vols[0].Name || mounts[0].MountPath != dir || !mounts[0].ReadOnly {
					t.Errorf("mounts = %v; want the Secret read-only at %s", mounts, dir)
				}
				if uid := c.SecurityContext.RunAsUser; uid == nil || *uid != daemonUID {
					t.Errorf("container runs as %s; want %d: a Secret needs no root", show(uid), daemonUID)
				}
			},
		},
		{
			name: "readyz with the kubelet certificate",
			values: withEndpoints(map[string]any{
				"healthCheck": "readyz",
				"readyz":      map[string]any{"credentials": "kubeletCertificate"},
			}),
			check: func(t *testing.T, m *manifest) {
				pod := m.DaemonSet.Spec.Template.Spec
				c := container(t, m)
				env := envValues(t, c)
				for name, want := range map[string]string{
					"EP_HEALTH_CHECK":             "readyz",
					"EP_HEALTH_CHECK_CA_FILE":     serviceAccountDir + "/ca.crt",
					"EP_HEALTH_CHECK_SERVER_NAME": "kubernetes.default.svc",
					"EP_HEALTH_CHECK_CERT_FILE":   kubeletCertPath,
					"EP_HEALTH_CHECK_KEY_FILE":    kubeletCertPath,
				} {
					if env[name] != want {
						t.Errorf("%s = %q; want %q", name, env[name], want)
					}
				}
				if _, ok := env["EP_HEALTH_CHECK_TOKEN_FILE"]; ok {
					t.Error("EP_HEALTH_CHECK_TOKEN_FILE set with the certificate credential")
				}
				// The directory, not the file: the kubelet swaps the
				// symlink on rotation, and a file mount would pin the old
				// certificate.
				const dir = "/var/lib/kubelet/pki"
				vols := ownVolumes(pod)
				if len(vols) != 1 || vols[0].HostPath == nil {
					t.Fatalf("volumes = %v; want one hostPath", vols)
				}
				hp := vols[0].HostPath
				if hp.Path != dir || hp.Type == nil || *hp.Type != corev1.HostPathDirectory {
					t.Errorf("hostPath = %v; want directory %s", hp, dir)
				}
				mounts := ownMounts(c)
				if len(mounts) != 1 || mounts[0].Name != vols[0].Name ||
					mounts[0].MountPath != dir || !mounts[0].ReadOnly {
					t.Errorf("mounts = %v; want %s read-only at %s", mounts, vols[0].Name, dir)
				}
				// The key is root's, mode 0600: UID 0, and still nothing
				// else (checkInvariants covers capabilities and the rest).
				for _, sc := range []struct {
					where   string
					uid     *int64
					nonRoot *bool
				}{
					{"pod", pod.SecurityContext.RunAsUser, pod.SecurityContext.RunAsNonRoot},
					{"container", c.SecurityContext.RunAsUser, c.SecurityContext.RunAsNonRoot},
				} {
					if sc.uid == nil || *sc.uid != 0 || boolValue(sc.nonRoot) {
						t.Errorf("%s runs as %s (runAsNonRoot %s); want UID 0 to read the kubelet key", sc.where, show(sc.uid), show(sc.nonRoot))
					}
				}
				if !boolValue(pod.AutomountServiceAccountToken) {
					t.Error("the service-account CA is the readyz CA but the volume is not mounted")
				}
				// The hand-over directory becomes root's too: a root daemon
				// refuses one an earlier release left owned by 65534.
				if ics := pod.InitContainers; len(ics) != 1 || len(ics[0].Args) != 6 || ics[0].Args[2] != "0" || ics[0].Args[4] != "0" {
					t.Errorf("init containers %v; want handover-dir --uid 0 --gid 0", ics)
				}
			},
		},
		{
			name: "readyz with the service-account token",
			values: withEndpoints(map[string]any{
				"discovery":   map[string]any{"enabled": false},
				"healthCheck": "readyz",
				"readyz":      map[string]any{"credentials": "serviceAccountToken"},
			}),
			check: func(t *testing.T, m *manifest) {
				pod := m.DaemonSet.Spec.Template.Spec
				env := envValues(t, container(t, m))
				if got, want := env["EP_HEALTH_CHECK_TOKEN_FILE"], serviceAccountDir+"/token"; got != want {
					t.Errorf("EP_HEALTH_CHECK_TOKEN_FILE = %q; want %q", got, want)
				}
				if got, want := env["EP_HEALTH_CHECK_CA_FILE"], serviceAccountDir+"/ca.crt"; got != want {
					t.Errorf("EP_HEALTH_CHECK_CA_FILE = %q; want %q", got, want)
				}
				for _, name := range []string{"EP_HEALTH_CHECK_CERT_FILE", "EP_HEALTH_CHECK_KEY_FILE"} {
					if _, ok := env[name]; ok {
						t.Errorf("%s set with the token credential", name)
					}
				}
				// Discovery is off here, so only the token makes the
				// service-account volume necessary.
				if !boolValue(pod.AutomountServiceAccountToken) {
					t.Error("the token is the readyz credential but the volume is not mounted")
				}
				vols := ownVolumes(pod)
				if len(vols) != 0 {
					t.Errorf("volumes = %v; want none", vols)
				}
				if len(m.Roles) != 0 {
					t.Errorf("%d Roles with discovery off; the token needs none to GET /readyz", len(m.Roles))
				}
			},
		},
		{
			name: "readyz with an own CA and no credential",
			values: withEndpoints(map[string]any{
				"discovery":         map[string]any{"enabled": false},
				"healthCheck":       "readyz",
				"readyz":            map[string]any{"caFile": "/etc/extractedprism/ca.crt", "serverName": "api.example.com", "credentials": "none"},
				"extraVolumes":      []any{map[string]any{"name": "ca", "configMap": map[string]any{"name": "api-ca"}}},
				"extraVolumeMounts": []any{map[string]any{"name": "ca", "mountPath": "/etc/extractedprism", "readOnly": true}},
			}),
			check: func(t *testing.T, m *manifest) {
				pod := m.DaemonSet.Spec.Template.Spec
				c := container(t, m)
				env := envValues(t, c)
				if env["EP_HEALTH_CHECK_CA_FILE"] != "/etc/extractedprism/ca.crt" || env["EP_HEALTH_CHECK_SERVER_NAME"] != "api.example.com" {
					t.Errorf("CA %q, server name %q; want the configured ones", env["EP_HEALTH_CHECK_CA_FILE"], env["EP_HEALTH_CHECK_SERVER_NAME"])
				}
				if boolValue(pod.AutomountServiceAccountToken) {
					t.Error("the service-account token is mounted although neither discovery nor readyz reads it")
				}
				vols := ownVolumes(pod)
				if len(vols) != 1 || vols[0].ConfigMap == nil || vols[0].ConfigMap.Name != "api-ca" {
					t.Errorf("volumes = %v; want the extra configMap volume", vols)
				}
				mounts := ownMounts(c)
				if len(mounts) != 1 || mounts[0].MountPath != "/etc/extractedprism" {
					t.Errorf("mounts = %v; want the extra mount", mounts)
				}
			},
		},
		{
			name: "metrics exposed with a PodMonitor",
			values: withEndpoints(map[string]any{
				"metrics": map[string]any{
					"expose": true,
					"podMonitor": map[string]any{
						"enabled": true, "labels": map[string]any{"release": "prometheus"},
						"scrapeTimeout": "5s", "jobLabel": "app.kubernetes.io/name",
						"relabelings":       []any{map[string]any{"action": "labeldrop", "regex": "pod"}},
						"metricRelabelings": []any{map[string]any{"action": "drop", "sourceLabels": []string{"__name__"}, "regex": "go_gc_.*"}},
					},
				},
				// The declared port is a host port: no surge pod beside
				// the old one.
				"handover": map[string]any{"surge": false},
			}),
			check: func(t *testing.T, m *manifest) {
				checkNoSurge(t, m, intstr.FromInt32(1))
				c := container(t, m)
				var bind *corev1.EnvVar
				for i := range c.Env {
					if c.Env[i].Name == "EP_HEALTH_BIND_ADDRESS" {
						bind = &c.Env[i]
					}
				}
				if bind == nil || bind.ValueFrom == nil || bind.ValueFrom.FieldRef == nil || bind.ValueFrom.FieldRef.FieldPath != "status.hostIP" {
					t.Errorf("EP_HEALTH_BIND_ADDRESS = %v; want the downward API's status.hostIP", bind)
				}
				wantPort := corev1.ContainerPort{Name: "metrics", ContainerPort: 7446, Protocol: corev1.ProtocolTCP}
				if len(c.Ports) != 1 || c.Ports[0] != wantPort {
					t.Errorf("ports = %v; want %v", c.Ports, wantPort)
				}
				// The health server no longer listens on loopback, so the
				// probes go to the pod IP, the node IP under hostNetwork.
				checkProbeHost(t, c, "")
				pm := m.PodMonitor
				if pm == nil {
					t.Fatal("no PodMonitor")
				}
				if pm.Metadata.Namespace != releaseNamespace {
					t.Errorf("PodMonitor namespace = %q; want %q", pm.Metadata.Namespace, releaseNamespace)
				}
				if pm.Metadata.Labels["release"] != "prometheus" {
					t.Errorf("PodMonitor labels = %v; want release=prometheus among them", pm.Metadata.Labels)
				}
				podLabels := m.DaemonSet.Spec.Template.Labels
				if len(pm.Spec.Selector.MatchLabels) == 0 {
					t.Error("PodMonitor selector is empty")
				}
				for k, v := range pm.Spec.Selector.MatchLabels {
					if podLabels[k] != v {
						t.Errorf("PodMonitor selects %s=%s; the pods have %q", k, v, podLabels[k])
					}
				}
				checkPodMonitorEndpoint(t, pm)
				checkPodMonitorLabels(t, pm, "")
				checkPodMonitorConventions(t, pm)
			},
			readsNode: true,
		},
		{
			// The PodMonitor needs no declared port, so exposed metrics
			// and a surging rollout go together.
			name: "metrics exposed with a PodMonitor and a surge",
			values: withEndpoints(map[string]any{
				"metrics": map[string]any{"expose": true, "podMonitor": map[string]any{"enabled": true, "cluster": "prod-eu"}},
			}),
			check: func(t *testing.T, m *manifest) {
				checkSurge(t, m)
				c := container(t, m)
				if len(c.Ports) != 0 {
					t.Errorf("ports = %v; want none beside a surge pod", c.Ports)
				}
				checkProbeHost(t, c, "")
				if m.PodMonitor == nil {
					t.Fatal("no PodMonitor")
				}
				checkPodMonitorEndpoint(t, m.PodMonitor)
				checkPodMonitorLabels(t, m.PodMonitor, "prod-eu")
			},
			readsNode: true,
		},
		{
			name: "IPv6",
			values: map[string]any{
				"endpoints":   []string{"[2001:db8::11]:6443", "[2001:db8::12]:6443", "[2001:db8::13]:6443"},
				"bindAddress": "::1",
			},
			check: func(t *testing.T, m *manifest) {
				c := container(t, m)
				env := envValues(t, c)
				if want := "[2001:db8::11]:6443,[2001:db8::12]:6443,[2001:db8::13]:6443"; env["EP_ENDPOINTS"] != want {
					t.Errorf("EP_ENDPOINTS = %q; want %q", env["EP_ENDPOINTS"], want)
				}
				if env["EP_BIND_ADDRESS"] != "::1" {
					t.Errorf("EP_BIND_ADDRESS = %q; want ::1", env["EP_BIND_ADDRESS"])
				}
				checkProbeHost(t, c, "::1")
			},
		},
		{
			name: "every flag set",
			values: withEndpoints(map[string]any{
				"bindAddress":       "0.0.0.0",
				"bindPort":          17445,
				"healthBindAddress": "0.0.0.0",
				"healthPort":        17446,
				"healthInterval":    "10s",
				"healthTimeout":     "2500ms",
				"kubeconfig":        "/etc/extractedprism/kubeconfig",
				"logLevel":          "debug",
				"livenessInterval":  "2s",
				"livenessThreshold": "1m",
				"drainTimeout":      "0s",
				"rebalancePeriod":   "0s",
				"upstreamSelection": "latency",
				"image":             map[string]any{"registry": "registry.example", "repository": "ep", "tag": "v9.9.9", "pullPolicy": "Always"},
				"updateStrategy":    map[string]any{"maxUnavailable": "10%"},
				"handover":          map[string]any{"hostPath": "/run/ep", "surge": false},
			}),
			check: func(t *testing.T, m *manifest) {
				c := container(t, m)
				env := envValues(t, c)
				for name, want := range map[string]string{
					"EP_BIND_ADDRESS":        "0.0.0.0",
					"EP_BIND_PORT":           "17445",
					"EP_HEALTH_BIND_ADDRESS": "0.0.0.0",
					"EP_HEALTH_PORT":         "17446",
					"EP_HEALTH_INTERVAL":     "10s",
					"EP_HEALTH_TIMEOUT":      "2500ms",
					"EP_KUBECONFIG":          "/etc/extractedprism/kubeconfig",
					"EP_LOG_LEVEL":           "debug",
					"EP_LIVENESS_INTERVAL":   "2s",
					"EP_LIVENESS_THRESHOLD":  "1m",
					"EP_DRAIN_TIMEOUT":       "0s",
					"EP_REBALANCE_PERIOD":    "0s",
					"EP_UPSTREAM_SELECTION":  "latency",
					"EP_HANDOVER_SOCKET":     "/run/ep/" + releaseName + ".sock",
				} {
					if env[name] != want {
						t.Errorf("%s = %q; want %q", name, env[name], want)
					}
				}
				if c.Image != "registry.example/ep:v9.9.9" || c.ImagePullPolicy != corev1.PullAlways {
					t.Errorf("image %q pull %q; want registry.example/ep:v9.9.9, Always", c.Image, c.ImagePullPolicy)
				}
				// A wildcard listener is probed on loopback, on the
				// configured port.
				checkProbeHost(t, c, "127.0.0.1")
				if got := c.LivenessProbe.HTTPGet.Port.IntValue(); got != 17446 {
					t.Errorf("liveness port = %d; want 17446", got)
				}
				checkNoSurge(t, m, intstr.FromString("10%"))
			},
		},
		{
			name: "existing service account",
			values: withEndpoints(map[string]any{
				"serviceAccount": map[string]any{"create": false, "name": "node-agents"},
			}),
			check: func(t *testing.T, m *manifest) {
				if m.ServiceAccount != nil {
					t.Error("ServiceAccount rendered with serviceAccount.create=false")
				}
				if got := m.DaemonSet.Spec.Template.Spec.ServiceAccountName; got != "node-agents" {
					t.Errorf("serviceAccountName = %q; want node-agents", got)
				}
				if len(m.RoleBindings) != 1 || m.RoleBindings[0].Subjects[0].Name != "node-agents" {
					t.Errorf("RoleBindings = %v; want one binding node-agents", m.RoleBindings)
				}
			},
		},
		{
			// As before handover: no socket, no directory, no init
			// container, and the old pod stops before the new one starts.
			name:   "handover off",
			values: withEndpoints(map[string]any{"handover": map[string]any{"enabled": false}}),
			check: func(t *testing.T, m *manifest) {
				pod := m.DaemonSet.Spec.Template.Spec
				c := container(t, m)
				if socket, ok := envValues(t, c)["EP_HANDOVER_SOCKET"]; ok {
					t.Errorf("EP_HANDOVER_SOCKET = %q with handover off", socket)
				}
				if len(pod.InitContainers) != 0 || len(pod.Volumes) != 0 || len(c.VolumeMounts) != 0 {
					t.Errorf("init containers %v, volumes %v, mounts %v; want none with handover off", pod.InitContainers, pod.Volumes, c.VolumeMounts)
				}
				checkNoSurge(t, m, intstr.FromInt32(1))
			},
		},
		{
			// A sidecar that reads the token, where the daemon reads none:
			// serviceAccount.automountServiceAccountToken mounts it.
			name: "a sidecar with the service-account token",
			values: withEndpoints(map[string]any{
				"healthCheck":    "tcp",
				"discovery":      map[string]any{"enabled": false},
				"serviceAccount": map[string]any{"automountServiceAccountToken": true},
				"sidecars":       []any{map[string]any{"name": "token-reader", "image": "registry.example/token-reader:1"}},
			}),
			check: func(t *testing.T, m *manifest) {
				pod := m.DaemonSet.Spec.Template.Spec
				if len(pod.Containers) != 2 || pod.Containers[1].Name != "token-reader" || pod.Containers[1].Image != "registry.example/token-reader:1" {
					t.Errorf("containers %v; want the daemon's, then the sidecar token-reader", pod.Containers)
				}
				if !boolValue(pod.AutomountServiceAccountToken) || m.ServiceAccount == nil || !boolValue(m.ServiceAccount.AutomountServiceAccountToken) {
					t.Errorf("pod automountServiceAccountToken %s, ServiceAccount %v; want both true", show(pod.AutomountServiceAccountToken), m.ServiceAccount)
				}
			},
		},
		{
			// The upgrade whose old pods cannot hand over: the new pods
			// serve hand-overs, the rollout does not surge.
			name:   "handover without a surge",
			values: withEndpoints(map[string]any{"handover": map[string]any{"surge": false}, "updateStrategy": map[string]any{"maxUnavailable": 2}}),
			check: func(t *testing.T, m *manifest) {
				if got, want := envValues(t, container(t, m))["EP_HANDOVER_SOCKET"], "/run/extractedprism-chart/"+releaseName+".sock"; got != want {
					t.Errorf("EP_HANDOVER_SOCKET = %q; want %q", got, want)
				}
				if len(m.DaemonSet.Spec.Template.Spec.InitContainers) != 1 {
					t.Errorf("init containers %v; want the hand-over directory's", m.DaemonSet.Spec.Template.Spec.InitContainers)
				}
				checkNoSurge(t, m, intstr.FromInt32(2))
			},
		},
	}
}

// checkConventionDefaults checks the defaults of the values the
// prometheus-community charts have too: the release's namespace,
// Kubernetes' own history limit and grace period, nothing added.
func checkConventionDefaults(t *testing.T, m *manifest) {
	t.Helper()
	ds, pod := m.DaemonSet, m.DaemonSet.Spec.Template.Spec
	if ds.Namespace != releaseNamespace {
		t.Errorf("DaemonSet namespace = %q; want the release's %q", ds.Namespace, releaseNamespace)
	}
	if show(ds.Spec.RevisionHistoryLimit) != "10" || show(pod.TerminationGracePeriodSeconds) != "30" {
		t.Errorf("revisionHistoryLimit %s, terminationGracePeriodSeconds %s; want 10 and 30, Kubernetes' defaults",
			show(ds.Spec.RevisionHistoryLimit), show(pod.TerminationGracePeriodSeconds))
	}
	if len(ds.Annotations) != 0 || len(pod.ImagePullSecrets) != 0 || len(pod.Containers) != 1 || len(pod.InitContainers) != 1 {
		t.Errorf("DaemonSet annotations %v, imagePullSecrets %v, %d containers, %d init containers; want no annotations and no pull secrets, one container and handover-dir only",
			ds.Annotations, pod.ImagePullSecrets, len(pod.Containers), len(pod.InitContainers))
	}
	if m.ServiceAccount == nil || m.ServiceAccount.AutomountServiceAccountToken == nil || *m.ServiceAccount.AutomountServiceAccountToken {
		t.Errorf("ServiceAccount %v; want automountServiceAccountToken false, the pods deciding for themselves", m.ServiceAccount)
	}
}

// checkPodMonitorConventions checks the PodMonitor values the
// prometheus-community charts have too, as the PodMonitor case sets them:
// the scrape timeout, the job label from a pod label, the values'
// relabelings after the chart's (whose last is the node label's) and their
// metric relabelings.
func checkPodMonitorConventions(t *testing.T, pm *podMonitor) {
	t.Helper()
	ep := pm.Spec.PodMetricsEndpoints[0]
	if ep.ScrapeTimeout != "5s" || pm.Spec.JobLabel != "app.kubernetes.io/name" {
		t.Errorf("scrapeTimeout %q, jobLabel %q; want the values' 5s and app.kubernetes.io/name", ep.ScrapeTimeout, pm.Spec.JobLabel)
	}
	r := ep.Relabelings
	if len(r) < 2 || r[len(r)-2].TargetLabel != "node" || r[len(r)-1].Action != "labeldrop" || r[len(r)-1].Regex != "pod" {
		t.Errorf("relabelings = %+v; want the chart's node label, then the values' labeldrop of pod", r)
	}
	want := relabeling{Action: "drop", SourceLabels: []string{"__name__"}, Regex: "go_gc_.*"}
	if mr := ep.MetricRelabelings; len(mr) != 1 || mr[0].Action != want.Action || !slices.Equal(mr[0].SourceLabels, want.SourceLabels) || mr[0].Regex != want.Regex {
		t.Errorf("metricRelabelings = %+v; want [%+v]", mr, want)
	}
}

// checkPodMonitorEndpoint checks the PodMonitor's one endpoint: /metrics
// without a port, the address set to <pod IP>:7446 (brackets for IPv6)
// for the daemon's container alone, and no pod label, so that the old and
// the new pod of a surge are one target.
func checkPodMonitorEndpoint(t *testing.T, pm *podMonitor) {
	t.Helper()
	eps := pm.Spec.PodMetricsEndpoints
	if len(eps) != 1 || eps[0].Port != "" || eps[0].Path != "/metrics" {
		t.Fatalf("podMetricsEndpoints = %+v; want one, path /metrics, no port", eps)
	}
	var keep, address, labeldrop []string
	for _, r := range eps[0].Relabelings {
		switch {
		case r.Action == "keep":
			keep = append(keep, strings.Join(r.SourceLabels, ",")+"="+r.Regex)
		case r.TargetLabel == "__address__" && r.Replacement != nil:
			address = append(address, strings.Join(r.SourceLabels, ",")+"~"+r.Regex+"->"+*r.Replacement)
		case r.Action == "labeldrop":
			labeldrop = append(labeldrop, r.Regex)
		}
	}
	wantAddress := []string{"__meta_kubernetes_pod_ip~([^:]+)->${1}:7446", "__meta_kubernetes_pod_ip~(.*:.*)->[${1}]:7446"}
	if !slices.Equal(keep, []string{"__meta_kubernetes_pod_container_name=extractedprism"}) || !slices.Equal(address, wantAddress) || !slices.Contains(labeldrop, "pod") {
		t.Errorf("relabelings keep %q, address %q, labeldrop %q; want the daemon's container, %q, and pod dropped", keep, address, labeldrop, wantAddress)
	}
}

// checkSurge checks that the rollout surges: a new pod beside the old one,
// which it takes the sockets from, and no node without its proxy.
func checkSurge(t *testing.T, m *manifest) {
	t.Helper()
	ru := m.DaemonSet.Spec.UpdateStrategy.RollingUpdate
	if ru == nil || ru.MaxSurge == nil || *ru.MaxSurge != intstr.FromInt32(1) || ru.MaxUnavailable == nil || *ru.MaxUnavailable != intstr.FromInt32(0) {
		t.Errorf("rollingUpdate = %+v; want maxSurge 1, maxUnavailable 0", ru)
	}
}

// checkNoSurge checks that the rollout stops the old pod before it starts
// the new one, maxUnavailable nodes at a time.
func checkNoSurge(t *testing.T, m *manifest, maxUnavailable intstr.IntOrString) {
	t.Helper()
	ru := m.DaemonSet.Spec.UpdateStrategy.RollingUpdate
	if ru == nil || ru.MaxSurge == nil || *ru.MaxSurge != intstr.FromInt32(0) || ru.MaxUnavailable == nil || *ru.MaxUnavailable != maxUnavailable {
		t.Errorf("rollingUpdate = %+v; want maxSurge 0, maxUnavailable %s", ru, maxUnavailable.String())
	}
}

// handoverVolume is the chart's volume for the hand-over socket's
// directory, which checkHandover checks in every render.
const handoverVolume = "handover"

// ownVolumes returns the pod's volumes but the hand-over directory's: the
// ones a case's values add.
func ownVolumes(pod corev1.PodSpec) []corev1.Volume {
	return slices.DeleteFunc(slices.Clone(pod.Volumes), func(v corev1.Volume) bool { return v.Name == handoverVolume })
}

// ownMounts returns the container's mounts but the hand-over directory's.
func ownMounts(c *corev1.Container) []corev1.VolumeMount {
	return slices.DeleteFunc(slices.Clone(c.VolumeMounts), func(m corev1.VolumeMount) bool { return m.Name == handoverVolume })
}

// checkHandover checks the hand-over wiring of a render. Without
// EP_HANDOVER_SOCKET: no init container, no directory, no surge. With it:
// the socket named after the release, in a writable mount of the same host
// directory (DirectoryOrCreate), which the one init container hands to the
// daemon's user and group as root with CHOWN and FOWNER only; a surge only
// where no declared port (a host port under hostNetwork) keeps the
// scheduler from placing the new pod beside the old one.
func checkHandover(t *testing.T, m *manifest) {
	t.Helper()
	pod := m.DaemonSet.Spec.Template.Spec
	c := &pod.Containers[0]
	ru := m.DaemonSet.Spec.UpdateStrategy.RollingUpdate
	surge := ru != nil && ru.MaxSurge != nil && ru.MaxSurge.IntValue() != 0
	socket, ok := envValues(t, c)["EP_HANDOVER_SOCKET"]
	if !ok {
		for _, ic := range pod.InitContainers {
			if ic.Name == "handover-dir" {
				t.Errorf("init container %s without EP_HANDOVER_SOCKET; want none", ic.Name)
			}
		}
		for _, v := range pod.Volumes {
			if v.Name == handoverVolume {
				t.Errorf("volume %s without EP_HANDOVER_SOCKET", v.Name)
			}
		}
		if surge {
			t.Errorf("maxSurge = %v without EP_HANDOVER_SOCKET; want 0: two pods on one node cannot share the port", ru.MaxSurge)
		}
		return
	}
	dir := filepath.Dir(socket)
	if want := m.DaemonSet.Name + ".sock"; filepath.Base(socket) != want || !filepath.IsAbs(socket) {
		t.Errorf("EP_HANDOVER_SOCKET = %q; want an absolute path ending in %s, the release's own", socket, want)
	}
	mount := hostDirMount(pod, c, socket)
	if mount == nil || mount.ReadOnly || mount.MountPath != dir || mount.Name != handoverVolume {
		t.Fatalf("EP_HANDOVER_SOCKET %s is not in a writable mount %s of the host directory %s; mounts %v", socket, handoverVolume, dir, c.VolumeMounts)
	}
	for _, v := range pod.Volumes {
		if v.Name == handoverVolume && (v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathDirectoryOrCreate) {
			t.Errorf("volume %s has hostPath type %s; want DirectoryOrCreate", v.Name, show(v.HostPath.Type))
		}
	}

	// The chart's first, extraInitContainers after it.
	if len(pod.InitContainers) == 0 {
		t.Fatal("no init container; want the hand-over directory's first")
	}
	ic := &pod.InitContainers[0]
	// The directory must end up the daemon's: the UID and GID its
	// container runs as (checkInvariants checks that they are set).
	csc := c.SecurityContext
	want := []string{"handover-dir", "--uid", show(csc.RunAsUser), "--gid", show(csc.RunAsGroup), dir}
	if ic.Name != "handover-dir" || len(ic.Command) != 0 || !slices.Equal(ic.Args, want) {
		t.Errorf("init container %s: command %v, args %v; want handover-dir, the image's entrypoint with %v", ic.Name, ic.Command, ic.Args, want)
	}
	if ic.Image != c.Image || ic.ImagePullPolicy != c.ImagePullPolicy {
		t.Errorf("init container image %q (%s); want the daemon's %q (%s)", ic.Image, ic.ImagePullPolicy, c.Image, c.ImagePullPolicy)
	}
	if !equality.Semantic.DeepEqual(ic.Resources, c.Resources) {
		t.Errorf("init container resources = %v; want the daemon's %v, so the pod asks for no more", ic.Resources, c.Resources)
	}
	if len(ic.Env) != 0 || len(ic.EnvFrom) != 0 || len(ic.Ports) != 0 || ic.RestartPolicy != nil {
		t.Errorf("init container env %v, envFrom %v, ports %v, restartPolicy %s; want none", ic.Env, ic.EnvFrom, ic.Ports, show(ic.RestartPolicy))
	}
	if wantMounts := []corev1.VolumeMount{{Name: handoverVolume, MountPath: dir}}; !equality.Semantic.DeepEqual(ic.VolumeMounts, wantMounts) {
		t.Errorf("init container mounts = %v; want %v only", ic.VolumeMounts, wantMounts)
	}
	isc := ic.SecurityContext
	if isc == nil || isc.RunAsUser == nil || *isc.RunAsUser != 0 || isc.RunAsGroup == nil || *isc.RunAsGroup != 0 ||
		isc.RunAsNonRoot == nil || *isc.RunAsNonRoot {
		t.Errorf("init container securityContext = %+v; want UID and GID 0, runAsNonRoot false (the pod's is true)", isc)
	} else if isc.Privileged == nil || *isc.Privileged || isc.AllowPrivilegeEscalation == nil || *isc.AllowPrivilegeEscalation ||
		!boolValue(isc.ReadOnlyRootFilesystem) || isc.Capabilities == nil ||
		!slices.Equal(isc.Capabilities.Drop, []corev1.Capability{"ALL"}) || !slices.Equal(isc.Capabilities.Add, []corev1.Capability{"CHOWN", "FOWNER"}) ||
		isc.SeccompProfile == nil || isc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault || isc.ProcMount != nil || isc.SELinuxOptions != nil {
		t.Errorf("init container securityContext = %+v; want not privileged, no escalation, a read-only root, drop ALL, add CHOWN and FOWNER only, seccomp RuntimeDefault", isc)
	}

	if surge {
		checkSurge(t, m)
		if len(c.Ports) != 0 {
			t.Errorf("ports %v with a surge: under hostNetwork they are host ports, and the scheduler would not place the new pod beside the old one", c.Ports)
		}
	}
	// The old pod closes its connections over 10 s and force-closes the
	// rest by 11 s after SIGTERM; the kubelet must not kill it before.
	if g := pod.TerminationGracePeriodSeconds; g != nil && *g < 15 {
		t.Errorf("terminationGracePeriodSeconds = %d; want 15 or more (the default 30 if unset)", *g)
	}
}

// TestTemplateMatrix renders the chart with each set of values, checks the
// rules every render must keep (checkInvariants), then what the values are
// meant to change, and runs the check hook's command, which must pass.
func TestTemplateMatrix(t *testing.T) {
	for _, tt := range templateCases(chartAppVersion(t)) {
		t.Run(tt.name, func(t *testing.T) {
			m := render(t, tt.values)
			checkInvariants(t, m)
			tt.check(t, m)
			if m.CheckJob != nil && !tt.readsNode {
				checkPasses(t, m)
			}
		})
	}
}

// TestTemplateHandoverFollowsUID checks that the hand-over directory goes
// to the UID and GID securityContext gives the daemon, not the chart's:
// the daemon refuses a directory another user owns.
func TestTemplateHandoverFollowsUID(t *testing.T) {
	m := render(t, withEndpoints(map[string]any{"securityContext": map[string]any{"runAsUser": 4000000000, "runAsGroup": 1000}}))
	ics := m.DaemonSet.Spec.Template.Spec.InitContainers
	want := []string{"handover-dir", "--uid", "4000000000", "--gid", "1000", "/run/extractedprism-chart"}
	if len(ics) != 1 || !slices.Equal(ics[0].Args, want) {
		t.Errorf("init containers %v; want one with args %v", ics, want)
	}
	checkHandover(t, m)
}

// TestTemplateHandoverDirRuns runs the init container's command as the
// render gives it, with the daemon built from this repository, on a
// directory of the test's: it must leave the directory owned by the
// daemon's user and group, mode 0700. The daemon's UID and GID are the
// test's own, which chown needs no privilege for.
func TestTemplateHandoverDirRuns(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run", "extractedprism")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	uid, gid := os.Getuid(), os.Getgid()
	m := render(t, withEndpoints(map[string]any{
		"handover":        map[string]any{"hostPath": dir},
		"securityContext": map[string]any{"runAsUser": uid, "runAsGroup": gid},
	}))
	checkHandover(t, m)
	ic := m.DaemonSet.Spec.Template.Spec.InitContainers[0]
	out, err := exec.Command(daemonBinary(t), ic.Args...).CombinedOutput()
	if err != nil {
		t.Fatalf("extractedprism %s: %v\n%s", strings.Join(ic.Args, " "), err, out)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if int(st.Uid) != uid || int(st.Gid) != gid || fi.Mode().Perm() != 0o700 || !fi.IsDir() {
		t.Errorf("after handover-dir: %s owned by %d:%d, mode %v; want a directory of %d:%d, mode 0700", dir, st.Uid, st.Gid, fi.Mode(), uid, gid)
	}
}

// TestTemplatePortBySet changes one port with --set, the usual override:
// helm gives it as an integer where the values file gives a float, and
// both must reach the daemon as the decimal number it reads.
func TestTemplatePortBySet(t *testing.T) {
	for _, set := range []string{"healthPort=7447", "bindPort=7500"} {
		m := render(t, withEndpoints(nil), "--set", set)
		env := envValues(t, container(t, m))
		name, value, _ := strings.Cut(set, "=")
		variable := map[string]string{"healthPort": "EP_HEALTH_PORT", "bindPort": "EP_BIND_PORT"}[name]
		if env[variable] != value {
			t.Errorf("--set %s: %s = %q; want %s", set, variable, env[variable], value)
		}
		checkPasses(t, m)
	}
}

// TestTemplateAcceptsEdgeValues renders values at the edge of what the
// daemon and Kubernetes accept, checks that they reach the manifest
// unchanged and, where the daemon reads them, that its check passes.
func TestTemplateAcceptsEdgeValues(t *testing.T) {
	tests := []struct {
		name   string
		values map[string]any
		check  func(t *testing.T, m *manifest)
	}{
		{name: "IPv6 readyz server name", values: withEndpoints(map[string]any{"healthCheck": "readyz", "readyz": map[string]any{"serverName": "fd00::1"}}), check: func(t *testing.T, m *manifest) {
			if got := envValues(t, container(t, m))["EP_HEALTH_CHECK_SERVER_NAME"]; got != "fd00::1" {
				t.Errorf("EP_HEALTH_CHECK_SERVER_NAME = %q; want fd00::1", got)
			}
			checkPasses(t, m)
		}},
		{name: "durations at the daemon's limits", values: withEndpoints(map[string]any{"healthInterval": "1001ms", "healthTimeout": "1s", "livenessInterval": "1s", "livenessThreshold": "1.001s"}), check: func(t *testing.T, m *manifest) {
			env := envValues(t, container(t, m))
			if env["EP_HEALTH_INTERVAL"] != "1001ms" || env["EP_HEALTH_TIMEOUT"] != "1s" || env["EP_LIVENESS_THRESHOLD"] != "1.001s" {
				t.Errorf("env = %v; want the durations as given", env)
			}
			checkPasses(t, m)
		}},
		{name: "resources and durations left out", values: withEndpoints(map[string]any{"resources": nil, "healthInterval": nil, "livenessThreshold": nil}), check: func(t *testing.T, m *manifest) {
			c := container(t, m)
			if len(c.Resources.Requests) != 0 || len(c.Resources.Limits) != 0 {
				t.Errorf("resources = %v; want none", c.Resources)
			}
			// An empty variable leaves the daemon its default (config.go applyEnv).
			if env := envValues(t, c); env["EP_HEALTH_INTERVAL"] != "" || env["EP_LIVENESS_THRESHOLD"] != "" {
				t.Errorf("EP_HEALTH_INTERVAL = %q, EP_LIVENESS_THRESHOLD = %q; want empty, for the daemon's defaults", env["EP_HEALTH_INTERVAL"], env["EP_LIVENESS_THRESHOLD"])
			}
			checkPasses(t, m)
		}},
		{name: "endpoints the daemon reads as they are", values: map[string]any{"endpoints": []string{"192.0.2.11:06443", "192.0.2.11:06443", "[::1]:7445", "127.0.0.2:7445", "[fe80::1%eth0:1]:6443"}}, check: func(t *testing.T, m *manifest) {
			// A leading zero, a repeat (the daemon keeps one), a loopback
			// address the IPv4 listener does not take, and a zone of any
			// characters are all fine with the daemon.
			if got := envValues(t, container(t, m))["EP_ENDPOINTS"]; got != "192.0.2.11:06443,192.0.2.11:06443,[::1]:7445,127.0.0.2:7445,[fe80::1%eth0:1]:6443" {
				t.Errorf("EP_ENDPOINTS = %q; want the endpoints as given", got)
			}
			checkPasses(t, m)
		}},
		{name: "endpoint cache without discovery", values: withEndpoints(map[string]any{"discovery": map[string]any{"enabled": false, "cache": map[string]any{"enabled": true}}}), check: func(t *testing.T, m *manifest) {
			// Turning discovery off is an emergency change; the daemon
			// warns about the cache it then ignores, and starts.
			out := checkPasses(t, m)
			if want := "warning: --endpoint-cache-file (EP_ENDPOINT_CACHE_FILE) has no effect"; !strings.Contains(out, want) {
				t.Errorf("check output %q; want %q", out, want)
			}
		}},
		{name: "Prometheus durations", values: withEndpoints(map[string]any{"metrics": map[string]any{"expose": true, "podMonitor": map[string]any{"enabled": true, "interval": "1m30s", "scrapeTimeout": "90s"}}, "handover": map[string]any{"enabled": false}}), check: func(t *testing.T, m *manifest) {
			if m.PodMonitor == nil {
				t.Fatal("no PodMonitor")
			}
			if eps := m.PodMonitor.Spec.PodMetricsEndpoints; len(eps) != 1 || eps[0].Interval != "1m30s" || eps[0].ScrapeTimeout != "90s" {
				t.Errorf("podMetricsEndpoints = %+v; want one with interval 1m30s, scrapeTimeout 90s", eps)
			}
		}},
		{name: "PodMonitor with a cluster label", values: withEndpoints(map[string]any{"metrics": map[string]any{"expose": true, "podMonitor": map[string]any{"enabled": true, "cluster": "prod-eu-1"}}, "handover": map[string]any{"enabled": false}}), check: func(t *testing.T, m *manifest) {
			if m.PodMonitor == nil {
				t.Fatal("no PodMonitor")
			}
			checkPodMonitorLabels(t, m.PodMonitor, "prod-eu-1")
		}},
		{name: "half the nodes at once", values: withEndpoints(map[string]any{"updateStrategy": map[string]any{"maxUnavailable": "50%", "minReadySeconds": 0}, "handover": map[string]any{"enabled": false}}), check: func(t *testing.T, m *manifest) {
			ds := m.DaemonSet.Spec
			if got := ds.UpdateStrategy.RollingUpdate.MaxUnavailable.String(); got != "50%" || ds.MinReadySeconds != 0 {
				t.Errorf("maxUnavailable = %s, minReadySeconds = %d; want 50%%, 0", got, ds.MinReadySeconds)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := render(t, tt.values)
			checkInvariants(t, m)
			tt.check(t, m)
		})
	}
}

// TestTemplateHostCorpus holds the chart to testdata/hosts.txt, the list
// the daemon's own parsers are held to (config_test.go): the chart passes
// every host through as written, and its check hook passes every host the
// list accepts, as an endpoint and as the bind address, and fails on every
// one it refuses, naming the flag, so no value helm installs makes the pods
// exit at start.
func TestTemplateHostCorpus(t *testing.T) {
	accept, reject := hostCorpus(t)
	var endpoints []string
	for _, h := range accept {
		endpoints = append(endpoints, corpusEndpoint(h))
	}
	m := render(t, map[string]any{"endpoints": endpoints})
	if got, want := envValues(t, container(t, m))["EP_ENDPOINTS"], strings.Join(endpoints, ","); got != want {
		t.Errorf("EP_ENDPOINTS = %q; want %q", got, want)
	}
	checkPasses(t, m)
	for _, h := range accept {
		t.Run("accept/"+subtestName(h), func(t *testing.T) {
			m := render(t, withEndpoints(map[string]any{"bindAddress": h}))
			if got := envValues(t, container(t, m))["EP_BIND_ADDRESS"]; got != h {
				t.Errorf("EP_BIND_ADDRESS = %q; want %q", got, h)
			}
			checkPasses(t, m)
		})
	}
	for _, h := range reject {
		t.Run("reject/"+subtestName(h), func(t *testing.T) {
			checkFails(t, render(t, map[string]any{"endpoints": []string{"192.0.2.11:6443", corpusEndpoint(h)}}), "--endpoints (EP_ENDPOINTS)")
			checkFails(t, render(t, withEndpoints(map[string]any{"bindAddress": h})), "--bind-address (EP_BIND_ADDRESS)")
		})
	}
}

// subtestName names a subtest after host without its "%": the name becomes
// part of the temporary directory of the values file, and helm reads that
// path as a URL, where "%et" is a bad escape.
func subtestName(host string) string {
	return strings.ReplaceAll(host, "%", "-zone-")
}

// TestTemplateDurationsAsTheDaemonReadsThem passes durations through the
// chart to its check hook and holds the verdict to time.ParseDuration,
// which the daemon's flags use, and to the daemon's rules (config.go
// validate): each duration is tried as the health timeout under a 20s
// interval, as the health interval over a 1s timeout, and as the drain
// timeout, reaches the variable as written, and passes the check exactly
// when the daemon would start with it.
func TestTemplateDurationsAsTheDaemonReadsThem(t *testing.T) {
	durations := []string{
		"1s", "15s", "19.999999999s", "20s", "1m", "0.3s", "1.3s", "1300ms", ".5s", "5.s", "+14s", "-14s", "-0", "0",
		"1.0000000001s", "1.000000001s", "1h0.5s", "1.5m", "500μs", "500µs", "999999999ns", "1000000000ns",
		"2562047h", "2562048h", "99999999999999999999ns", "1d", "1e3s", "1.2.3s", "s", "14",
	}
	contexts := []struct {
		value string // the chart value
		flag  string // the daemon's flag, which its message must name
		ok    func(d time.Duration) bool
		with  map[string]any // other values the case needs
	}{
		{"healthTimeout", "health-timeout", func(d time.Duration) bool { return d >= time.Second && d < 20*time.Second }, map[string]any{"healthInterval": "20s"}},
		{"healthInterval", "health-interval", func(d time.Duration) bool { return d > time.Second }, map[string]any{"healthTimeout": "1s"}},
		{"drainTimeout", "drain-timeout", func(d time.Duration) bool { return d >= 0 }, nil},
		{"rebalancePeriod", "rebalance-period", func(d time.Duration) bool { return d == 0 || d >= 10*time.Second }, nil},
	}
	for _, c := range contexts {
		variable := "EP_" + strings.ToUpper(strings.ReplaceAll(c.flag, "-", "_"))
		for _, d := range durations {
			t.Run(c.value+"/"+d, func(t *testing.T) {
				values := withEndpoints(map[string]any{c.value: d})
				maps.Copy(values, c.with)
				m := render(t, values)
				if got := envValues(t, checkContainer(t, m))[variable]; got != d {
					t.Errorf("%s = %q; want %q as written", variable, got, d)
				}
				if parsed, err := time.ParseDuration(d); err == nil && c.ok(parsed) {
					checkPasses(t, m)
				} else {
					checkFails(t, m, "--"+c.flag, variable)
				}
			})
		}
	}
}

// hostCorpus reads testdata/hosts.txt: the hosts the daemon accepts and
// those it refuses.
func hostCorpus(t *testing.T) (accept, reject []string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "testdata", "hosts.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(data)) {
		line = strings.TrimSuffix(line, "\n")
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		switch verdict, host, _ := strings.Cut(line, "\t"); verdict {
		case "accept":
			accept = append(accept, host)
		case "reject":
			reject = append(reject, host)
		default:
			t.Fatalf("testdata/hosts.txt: bad line %q", line)
		}
	}
	if len(accept) < 20 || len(reject) < 20 {
		t.Fatalf("testdata/hosts.txt: %d accepted and %d refused hosts; want the whole list", len(accept), len(reject))
	}
	return accept, reject
}

// corpusEndpoint makes an endpoint of a corpus host as config_test.go
// does: port 6443, a host with a colon in brackets.
func corpusEndpoint(host string) string {
	if strings.Contains(host, ":") {
		return "[" + host + "]:6443"
	}
	return host + ":6443"
}

// TestTemplateRejects checks that values the chart itself refuses stop the
// render with helm's message (chart), and that values the daemon refuses
// render but fail the check hook with the daemon's own message (daemon),
// which is what helm install then prints.
func TestTemplateRejects(t *testing.T) {
	tests := []struct {
		name   string
		values map[string]any
		set    []string // --set arguments, for the cases that test that path
		chart  []string // the render fails, and helm's error mentions each
		daemon []string // the render passes, the check fails, and its message mentions each
	}{
		// The schema: unknown keys, types, enums, the chart's own bounds.
		{name: "unknown top-level value", values: withEndpoints(nil), set: []string{"replicas=3"}, chart: []string{"additional properties 'replicas' not allowed"}},
		{name: "unknown nested value", values: withEndpoints(map[string]any{"discovery": map[string]any{"enable": false}}), chart: []string{"at '/discovery': additional properties 'enable' not allowed"}},
		{name: "endpoints as one string", values: map[string]any{"endpoints": "192.0.2.11:6443,192.0.2.12:6443"}, chart: []string{"'/endpoints'", "want array"}},
		{name: "duration as a number", values: withEndpoints(map[string]any{"healthInterval": 20}), chart: []string{"'/healthInterval'", "want string"}},
		{name: "unknown upstream selection", values: withEndpoints(map[string]any{"upstreamSelection": "fastest"}), chart: []string{"'/upstreamSelection'", "must be one of"}},
		{name: "unknown health check", values: withEndpoints(map[string]any{"healthCheck": "http"}), chart: []string{"'/healthCheck'", "must be one of"}},
		{name: "unknown log level", values: withEndpoints(map[string]any{"logLevel": "verbose"}), chart: []string{"'/logLevel'", "must be one of"}},
		{name: "unknown credentials", values: withEndpoints(map[string]any{"readyz": map[string]any{"credentials": "password"}}), chart: []string{"'/readyz/credentials'", "must be one of"}},
		{name: "port out of range", values: withEndpoints(map[string]any{"bindPort": 70000}), chart: []string{"'/bindPort'", "maximum"}},
		{name: "check hook switch not a boolean", values: withEndpoints(map[string]any{"configCheck": map[string]any{"enabled": "no"}}), chart: []string{"'/configCheck/enabled'", "want boolean"}},
		{name: "maxUnavailable zero", values: withEndpoints(map[string]any{"updateStrategy": map[string]any{"maxUnavailable": 0}}), chart: []string{"'/updateStrategy/maxUnavailable'", "minimum"}},
		{name: "maxUnavailable every node", values: withEndpoints(map[string]any{"updateStrategy": map[string]any{"maxUnavailable": "100%"}}), chart: []string{"'/updateStrategy/maxUnavailable'"}},
		{name: "maxUnavailable over half the nodes", values: withEndpoints(map[string]any{"updateStrategy": map[string]any{"maxUnavailable": "51%"}}), chart: []string{"'/updateStrategy/maxUnavailable'"}},
		{name: "negative minReadySeconds", values: withEndpoints(map[string]any{"updateStrategy": map[string]any{"minReadySeconds": -1}}), chart: []string{"'/updateStrategy/minReadySeconds'", "minimum"}},
		{name: "relative hand-over directory", values: withEndpoints(map[string]any{"handover": map[string]any{"hostPath": "run/extractedprism"}}), chart: []string{"'/handover/hostPath'"}},
		{name: "hand-over directory with a trailing slash", values: withEndpoints(map[string]any{"handover": map[string]any{"hostPath": "/run/extractedprism/"}}), chart: []string{"'/handover/hostPath'"}},
		{name: "empty hand-over directory", values: withEndpoints(map[string]any{"handover": map[string]any{"hostPath": ""}}), chart: []string{"'/handover/hostPath'"}},
		{name: "hand-over switch not a boolean", values: withEndpoints(map[string]any{"handover": map[string]any{"surge": "yes"}}), chart: []string{"'/handover/surge'", "want boolean"}},
		{name: "unknown hand-over value", values: withEndpoints(map[string]any{"handover": map[string]any{"socket": "/run/x.sock"}}), chart: []string{"at '/handover': additional properties 'socket' not allowed"}},
		{name: "relative cache directory", values: withEndpoints(map[string]any{"discovery": map[string]any{"cache": map[string]any{"enabled": true, "hostPath": "var/lib"}}}), chart: []string{"'/discovery/cache/hostPath'"}},
		{name: "image digest without its algorithm", values: withEndpoints(map[string]any{"image": map[string]any{"digest": "0123456789abcdef"}}), chart: []string{"'/image/digest'"}},
		{name: "global image registry not a string", values: withEndpoints(map[string]any{"global": map[string]any{"imageRegistry": 5}}), chart: []string{"'/global/imageRegistry'", "want string"}},
		{name: "global pull secrets as one string", values: withEndpoints(map[string]any{"global": map[string]any{"imagePullSecrets": "mirror-pull"}}), chart: []string{"'/global/imagePullSecrets'", "want array"}},
		{name: "grace period shorter than the graceful stop", values: withEndpoints(map[string]any{"terminationGracePeriodSeconds": 10}), chart: []string{"'/terminationGracePeriodSeconds'", "minimum"}},
		{name: "unknown probe field", values: withEndpoints(map[string]any{"livenessProbe": map[string]any{"period": 5}}), chart: []string{"at '/livenessProbe': additional properties 'period' not allowed"}},
		{name: "extra arguments as one string", values: withEndpoints(map[string]any{"extraArgs": "--log-level=debug"}), chart: []string{"'/extraArgs'", "want array"}},
		{name: "client certificate Secret with a bad name", values: withEndpoints(map[string]any{"healthCheck": "readyz", "readyz": map[string]any{"credentials": "clientCertificate", "clientCertificate": map[string]any{"secretName": "EP_Readyz"}}}), chart: []string{"'/readyz/clientCertificate/secretName'"}},

		// The chart's rules about values only it reads (_helpers.tpl validate).
		{name: "PodMonitor without exposed metrics", values: withEndpoints(map[string]any{"metrics": map[string]any{"podMonitor": map[string]any{"enabled": true}}}), chart: []string{"metrics.podMonitor.enabled needs metrics.expose"}},
		{name: "exposed metrics and a health bind address", values: withEndpoints(map[string]any{"healthBindAddress": "0.0.0.0", "metrics": map[string]any{"expose": true}, "handover": map[string]any{"enabled": false}}), chart: []string{"leave healthBindAddress empty"}},
		{name: "PodMonitor with a job label the pods lack", values: withEndpoints(map[string]any{"metrics": map[string]any{"expose": true, "podMonitor": map[string]any{"enabled": true, "jobLabel": "tier"}}}), chart: []string{`metrics.podMonitor.jobLabel "tier" is no label of the pods`}},
		{name: "client certificate without a Secret", values: withEndpoints(map[string]any{"healthCheck": "readyz", "readyz": map[string]any{"credentials": "clientCertificate"}}), chart: []string{"readyz.credentials=clientCertificate needs readyz.clientCertificate.secretName"}},
		{name: "client certificate left null", values: withEndpoints(map[string]any{"healthCheck": "readyz", "readyz": map[string]any{"credentials": "clientCertificate", "clientCertificate": nil}}), chart: []string{"needs readyz.clientCertificate.secretName"}},
		{name: "node RBAC without RBAC", values: withEndpoints(map[string]any{"rbac": map[string]any{"create": false}, "discovery": map[string]any{"nodeRBAC": true}}), chart: []string{"discovery.nodeRBAC creates a Role and RoleBinding, which rbac.create=false forbids"}},
		{name: "existing service account without a name", values: withEndpoints(map[string]any{"serviceAccount": map[string]any{"create": false}}), chart: []string{"serviceAccount.name is required"}},

		// The daemon's rules (config.go), as the check hook reports them.
		{name: "missing endpoints", values: nil, daemon: []string{"--endpoints (EP_ENDPOINTS) must not be empty"}},
		{name: "empty endpoints", values: map[string]any{"endpoints": []string{}}, daemon: []string{"--endpoints (EP_ENDPOINTS) must not be empty"}},
		{name: "endpoint without port", values: map[string]any{"endpoints": []string{"192.0.2.11"}}, daemon: []string{`endpoint "192.0.2.11": want host:port`}},
		{name: "endpoint with scheme", values: map[string]any{"endpoints": []string{"https://192.0.2.11:6443"}}, daemon: []string{"want host:port without a scheme"}},
		{name: "IPv6 endpoint without brackets", values: map[string]any{"endpoints": []string{"2001:db8::11:6443"}}, daemon: []string{"an IPv6 address needs brackets and a port"}},
		{name: "IPv4 endpoint in brackets", values: map[string]any{"endpoints": []string{"[192.0.2.11]:6443"}}, daemon: []string{"brackets are only for IPv6 addresses"}},
		{name: "endpoint port out of range", values: map[string]any{"endpoints": []string{"192.0.2.11:65536"}}, daemon: []string{`port must be a number in 1-65535, got "65536"`}},
		{name: "every bad endpoint listed", values: map[string]any{"endpoints": []string{"192.0.2.11:6443", "a..b:6443", "[1:2:3]:6443", "10.0.0.256:6443"}}, daemon: []string{
			`endpoint "a..b:6443": host "a..b" is not an IP address`, `endpoint "[1:2:3]:6443": host "1:2:3"`, `endpoint "10.0.0.256:6443": host "10.0.0.256"`,
		}},
		{name: "bad bind address", values: withEndpoints(map[string]any{"bindAddress": "node-.example.com"}), daemon: []string{`--bind-address (EP_BIND_ADDRESS) must be an IP address or RFC 1123 hostname: got "node-.example.com"`}},
		{name: "bad health bind address", values: withEndpoints(map[string]any{"healthBindAddress": "1::2::3"}), daemon: []string{`--health-bind-address (EP_HEALTH_BIND_ADDRESS) must be an IP address or RFC 1123 hostname: got "1::2::3"`}},
		{name: "bad readyz server name", values: withEndpoints(map[string]any{"healthCheck": "readyz", "readyz": map[string]any{"serverName": "a..b"}}), daemon: []string{`--health-check-server-name (EP_HEALTH_CHECK_SERVER_NAME) must be an IP address or RFC 1123 hostname: got "a..b"`}},
		{name: "readyz server name with a zone", values: withEndpoints(map[string]any{"healthCheck": "readyz", "readyz": map[string]any{"serverName": "fe80::1%eth0"}}), daemon: []string{`--health-check-server-name (EP_HEALTH_CHECK_SERVER_NAME) must not have an IPv6 zone`}},
		{name: "same ports", values: withEndpoints(map[string]any{"healthPort": 7445}), daemon: []string{"--health-port (EP_HEALTH_PORT) must differ from --bind-port (EP_BIND_PORT): both are 7445"}},
		{name: "same ports with one set by flag", values: withEndpoints(nil), set: []string{"healthPort=7445"}, daemon: []string{"--health-port (EP_HEALTH_PORT) must differ from --bind-port (EP_BIND_PORT)"}},
		{name: "endpoint that is the proxy's listener", values: map[string]any{"endpoints": []string{"192.0.2.11:6443", "127.0.0.1:7445"}}, daemon: []string{"--endpoints (EP_ENDPOINTS) must not name this proxy's own listener 127.0.0.1:7445"}},
		{name: "localhost endpoint of the proxy's listener", values: map[string]any{"endpoints": []string{"localhost.:7445"}, "bindAddress": "localhost"}, daemon: []string{"own listener localhost:7445", "localhost.:7445"}},
		{name: "unspecified endpoint of a loopback listener", values: map[string]any{"endpoints": []string{"[::]:7445"}, "bindAddress": "::1"}, daemon: []string{"own listener [::1]:7445", "[::]:7445"}},
		{name: "loopback endpoint of a wildcard listener", values: map[string]any{"endpoints": []string{"[::ffff:127.0.0.9]:07445"}, "bindAddress": "0.0.0.0"}, daemon: []string{"own listener 0.0.0.0:7445", "127.0.0.9:7445"}},
		{name: "hand-over socket path too long", values: withEndpoints(map[string]any{"handover": map[string]any{"hostPath": "/run/" + strings.Repeat("d", 80)}}), daemon: []string{"--handover-socket (EP_HANDOVER_SOCKET) must be an absolute file path of at most 98 bytes"}},
		{name: "duration without unit", values: withEndpoints(map[string]any{"healthInterval": "20"}), daemon: []string{`EP_HEALTH_INTERVAL (--health-interval): invalid duration "20"`}},
		{name: "duration beyond Go's range", values: withEndpoints(map[string]any{"drainTimeout": "2562048h"}), daemon: []string{`EP_DRAIN_TIMEOUT (--drain-timeout): invalid duration "2562048h"`}},
		{name: "negative drain timeout", values: withEndpoints(map[string]any{"drainTimeout": "-1s"}), daemon: []string{"--drain-timeout (EP_DRAIN_TIMEOUT) must not be negative: got -1s"}},
		{name: "health timeout not below the interval", values: withEndpoints(map[string]any{"healthInterval": "20s", "healthTimeout": "20s"}), daemon: []string{"--health-timeout (EP_HEALTH_TIMEOUT) must be less than --health-interval (EP_HEALTH_INTERVAL): got 20s >= 20s"}},
		{name: "health timeout above the interval in other units", values: withEndpoints(map[string]any{"healthInterval": "1m", "healthTimeout": "60500ms"}), daemon: []string{"got 1m0.5s >= 1m0s"}},
		{name: "left-out interval below the timeout", values: withEndpoints(map[string]any{"healthInterval": nil, "healthTimeout": "25s"}), daemon: []string{"got 25s >= 20s"}},
		{name: "sub-second health interval", values: withEndpoints(map[string]any{"healthInterval": "900ms", "healthTimeout": "500ms"}), daemon: []string{"--health-interval (EP_HEALTH_INTERVAL) must be at least 1s: got 900ms"}},
		{name: "sub-second health timeout", values: withEndpoints(map[string]any{"healthTimeout": "0.5s"}), daemon: []string{"--health-timeout (EP_HEALTH_TIMEOUT) must be at least 1s: got 500ms"}},
		{name: "sub-second liveness interval", values: withEndpoints(map[string]any{"livenessInterval": "999999us"}), daemon: []string{"--liveness-interval (EP_LIVENESS_INTERVAL) must be at least 1s: got 999.999ms"}},
		{name: "liveness threshold not above the interval", values: withEndpoints(map[string]any{"livenessThreshold": "5s"}), daemon: []string{"--liveness-threshold (EP_LIVENESS_THRESHOLD) must be greater than --liveness-interval (EP_LIVENESS_INTERVAL): got 5s <= 5s"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var extra []string
			for _, s := range tt.set {
				extra = append(extra, "--set", s)
			}
			out, err := renderYAML(t, tt.values, extra...)
			if tt.chart != nil {
				if err == nil {
					t.Fatalf("helm template succeeded; want it to fail with %q. Output:\n%s", tt.chart, out)
				}
				for _, want := range tt.chart {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error does not mention %q:\n%v", want, err)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("helm template: %v; want the render to pass and the daemon to judge", err)
			}
			m := decodeManifest(t, out)
			checkInvariants(t, m)
			checkFails(t, m, tt.daemon...)
		})
	}
}

// checkInvariants checks what every render must keep, whatever the values.
func checkInvariants(t *testing.T, m *manifest) {
	t.Helper()
	if len(m.OtherKinds) > 0 || len(m.UnexpectedTwice) > 0 {
		t.Fatalf("unexpected objects: kinds %v, repeated %v", m.OtherKinds, m.UnexpectedTwice)
	}
	ds := m.DaemonSet
	if ds == nil {
		t.Fatal("no DaemonSet rendered")
	}
	checkNamespaces(t, m)
	if sel, labels := ds.Spec.Selector.MatchLabels, ds.Spec.Template.Labels; len(sel) == 0 {
		t.Error("DaemonSet selector is empty")
	} else {
		for k, v := range sel {
			if labels[k] != v {
				t.Errorf("selector %s=%s does not match the pod template's %q", k, v, labels[k])
			}
		}
	}

	us := ds.Spec.UpdateStrategy
	if us.Type != appsv1.RollingUpdateDaemonSetStrategyType || us.RollingUpdate == nil || us.RollingUpdate.MaxUnavailable == nil || us.RollingUpdate.MaxSurge == nil {
		t.Errorf("updateStrategy = %+v; want RollingUpdate with maxUnavailable and maxSurge", us)
	}

	pod := ds.Spec.Template.Spec
	if !pod.HostNetwork {
		t.Error("hostNetwork is not true")
	}
	// The node's resolver: the daemon never needs cluster DNS, and a
	// hostname endpoint looked up there would wait on kube-proxy or the
	// CNI, which wait on the daemon.
	if pod.DNSPolicy != corev1.DNSDefault {
		t.Errorf("dnsPolicy = %q; want Default", pod.DNSPolicy)
	}
	// The daemon's container first, sidecars after it.
	if len(pod.Containers) == 0 || pod.Containers[0].Name != "extractedprism" {
		t.Fatalf("containers %v; want extractedprism first", pod.Containers)
	}
	if pod.ServiceAccountName == "" {
		t.Error("no serviceAccountName")
	}
	if pod.AutomountServiceAccountToken == nil {
		t.Error("automountServiceAccountToken is left to the ServiceAccount; want it decided by the chart")
	}

	psc := pod.SecurityContext
	if psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext = %+v; want seccomp RuntimeDefault", psc)
	}
	c := &pod.Containers[0]
	csc := c.SecurityContext
	if csc == nil {
		t.Fatal("container has no securityContext")
	}
	if csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation {
		t.Error("allowPrivilegeEscalation is not false")
	}
	if csc.Privileged == nil || *csc.Privileged {
		t.Error("privileged is not false")
	}
	if !boolValue(csc.ReadOnlyRootFilesystem) {
		t.Error("readOnlyRootFilesystem is not true")
	}
	if csc.Capabilities == nil || !slices.Equal(csc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(csc.Capabilities.Add) != 0 {
		t.Errorf("capabilities = %+v; want drop [ALL], add none", csc.Capabilities)
	}
	if csc.SeccompProfile == nil || csc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("container seccompProfile = %+v; want RuntimeDefault", csc.SeccompProfile)
	}
	// UID 65534 unless the kubelet key must be read (see that case).
	env := envValues(t, c)
	kubeletCert := env["EP_HEALTH_CHECK_CERT_FILE"] != ""
	if !kubeletCert {
		for _, sc := range []struct {
			where        string
			uid, gid     *int64
			runAsNonRoot *bool
		}{
			{"pod", psc.RunAsUser, psc.RunAsGroup, psc.RunAsNonRoot},
			{"container", csc.RunAsUser, csc.RunAsGroup, csc.RunAsNonRoot},
		} {
			if sc.uid == nil || *sc.uid != daemonUID || sc.gid == nil || *sc.gid != daemonUID {
				t.Errorf("%s runs as %s:%s; want %d:%d", sc.where, show(sc.uid), show(sc.gid), daemonUID, daemonUID)
			}
			if !boolValue(sc.runAsNonRoot) {
				t.Errorf("%s runAsNonRoot is not true", sc.where)
			}
		}
	}

	// The image's entrypoint, the daemon; arguments only from extraArgs,
	// which are flags, never a subcommand.
	if len(c.Command) != 0 {
		t.Errorf("command %v; want the image's entrypoint", c.Command)
	}
	for _, arg := range c.Args {
		if !strings.HasPrefix(arg, "-") {
			t.Errorf("argument %q is not a flag", arg)
		}
	}
	// The chart's EP_* variables first; extraEnv's entries only after them.
	for i, e := range c.Env {
		if i > 0 && strings.HasPrefix(e.Name, "EP_") && !strings.HasPrefix(c.Env[i-1].Name, "EP_") {
			t.Errorf("env %s follows %s, an entry of extraEnv", e.Name, c.Env[i-1].Name)
		}
	}
	port, err := strconv.Atoi(env["EP_HEALTH_PORT"])
	if err != nil {
		t.Errorf("EP_HEALTH_PORT: %v", err)
	}
	for _, probe := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{
		{"liveness", c.LivenessProbe, "/healthz"},
		{"readiness", c.ReadinessProbe, "/readyz"},
	} {
		if probe.probe == nil || probe.probe.HTTPGet == nil {
			t.Errorf("no HTTP %s probe", probe.name)
			continue
		}
		get := probe.probe.HTTPGet
		if get.Path != probe.path || get.Port.IntValue() != port || get.Scheme != "" && get.Scheme != corev1.URISchemeHTTP {
			t.Errorf("%s probe = %s %s:%s; want HTTP %s on port %d", probe.name, get.Scheme, get.Path, get.Port.String(), probe.path, port)
		}
	}

	checkHandover(t, m)

	if m.CheckJob != nil {
		checkHookJob(t, m)
	}

	for _, role := range m.Roles {
		if role.Namespace != "default" {
			t.Errorf("Role %s in namespace %q; want default, where the kubernetes EndpointSlices are", role.Name, role.Namespace)
		}
	}
	for _, binding := range m.RoleBindings {
		if binding.Namespace != "default" {
			t.Errorf("RoleBinding %s in namespace %q; want default", binding.Name, binding.Namespace)
		}
	}
}

// checkNamespaces checks that the objects of a release share the
// DaemonSet's namespace, the release's or namespaceOverride, as does the
// ServiceAccount the pods' RoleBinding names; the Roles stay in default
// (checkInvariants).
func checkNamespaces(t *testing.T, m *manifest) {
	t.Helper()
	ns := m.DaemonSet.Namespace
	if ns == "" {
		t.Error("DaemonSet has no namespace")
	}
	if m.ServiceAccount != nil && m.ServiceAccount.Namespace != ns {
		t.Errorf("ServiceAccount namespace = %q; want the DaemonSet's %q", m.ServiceAccount.Namespace, ns)
	}
	if m.PodMonitor != nil && m.PodMonitor.Metadata.Namespace != ns {
		t.Errorf("PodMonitor namespace = %q; want the DaemonSet's %q", m.PodMonitor.Metadata.Namespace, ns)
	}
	for _, binding := range m.RoleBindings {
		for _, s := range binding.Subjects {
			if s.Kind == rbacv1.ServiceAccountKind && s.Namespace != ns {
				t.Errorf("RoleBinding %s names ServiceAccount %s/%s; want it in %q", binding.Name, s.Namespace, s.Name, ns)
			}
		}
	}
}

// checkNodeCritical checks the defaults that keep the pods on every node
// and last to be preempted.
func checkNodeCritical(t *testing.T, pod corev1.PodSpec) {
	t.Helper()
	if pod.PriorityClassName != "system-node-critical" {
		t.Errorf("priorityClassName = %q; want system-node-critical", pod.PriorityClassName)
	}
	if want := []corev1.Toleration{{Operator: corev1.TolerationOpExists}}; !slices.Equal(pod.Tolerations, want) {
		t.Errorf("tolerations = %+v; want exactly %+v (every taint)", pod.Tolerations, want)
	}
}

// checkDiscoveryRBAC checks the one grant discovery needs: get/list/watch
// on endpointslices in default, bound to the chart's ServiceAccount in the
// release namespace, through a Role rather than a ClusterRole.
func checkDiscoveryRBAC(t *testing.T, m *manifest) {
	t.Helper()
	if len(m.Roles) != 1 || len(m.RoleBindings) != 1 {
		t.Fatalf("%d Roles and %d RoleBindings; want one of each", len(m.Roles), len(m.RoleBindings))
	}
	role, binding := m.Roles[0], m.RoleBindings[0]
	wantRules := []rbacv1.PolicyRule{{
		APIGroups: []string{"discovery.k8s.io"},
		Resources: []string{"endpointslices"},
		Verbs:     []string{"list", "watch"},
	}}
	if len(role.Rules) != 1 || !slices.Equal(role.Rules[0].APIGroups, wantRules[0].APIGroups) ||
		!slices.Equal(role.Rules[0].Resources, wantRules[0].Resources) || !slices.Equal(role.Rules[0].Verbs, wantRules[0].Verbs) ||
		len(role.Rules[0].ResourceNames) != 0 || len(role.Rules[0].NonResourceURLs) != 0 {
		t.Errorf("Role rules = %+v; want %+v", role.Rules, wantRules)
	}
	wantRef := rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: role.Name}
	if binding.RoleRef != wantRef {
		t.Errorf("roleRef = %+v; want %+v", binding.RoleRef, wantRef)
	}
	wantSubject := rbacv1.Subject{Kind: "ServiceAccount", Name: m.DaemonSet.Spec.Template.Spec.ServiceAccountName, Namespace: m.DaemonSet.Namespace}
	if !slices.Equal(binding.Subjects, []rbacv1.Subject{wantSubject}) {
		t.Errorf("subjects = %+v; want [%+v]", binding.Subjects, wantSubject)
	}
}

// splitRBAC separates the Roles and RoleBindings of a render into the
// pods' (bound to a ServiceAccount) and the nodes' (bound to a Group), by
// the binding's subjects and the Role it names; the DaemonSet goes with the
// pods' for checkDiscoveryRBAC.
func splitRBAC(m *manifest) (pods, nodes *manifest) {
	pods, nodes = &manifest{DaemonSet: m.DaemonSet}, &manifest{}
	toNodes := map[string]bool{}
	for _, binding := range m.RoleBindings {
		if len(binding.Subjects) > 0 && binding.Subjects[0].Kind == rbacv1.GroupKind {
			nodes.RoleBindings = append(nodes.RoleBindings, binding)
			toNodes[binding.RoleRef.Name] = true
			continue
		}
		pods.RoleBindings = append(pods.RoleBindings, binding)
	}
	for _, role := range m.Roles {
		if toNodes[role.Name] {
			nodes.Roles = append(nodes.Roles, role)
		} else {
			pods.Roles = append(pods.Roles, role)
		}
	}
	return pods, nodes
}

// checkNodeDiscoveryRBAC checks that the render's grant to the nodes is
// the one of deploy/node-discovery-rbac.yaml: the same rules, in the same
// namespace, bound to the same subjects. Only the names differ.
func checkNodeDiscoveryRBAC(t *testing.T, m *manifest) {
	t.Helper()
	if len(m.Roles) != 1 || len(m.RoleBindings) != 1 {
		t.Fatalf("%d Roles and %d RoleBindings for the nodes; want one of each", len(m.Roles), len(m.RoleBindings))
	}
	want := nodeDiscoveryRBAC(t)
	role, binding := m.Roles[0], m.RoleBindings[0]
	if role.Namespace != want.Roles[0].Namespace || binding.Namespace != want.RoleBindings[0].Namespace {
		t.Errorf("Role in %q, RoleBinding in %q; want %q as %s", role.Namespace, binding.Namespace, want.Roles[0].Namespace, nodeRBACPath)
	}
	if got, want := fmt.Sprint(role.Rules), fmt.Sprint(want.Roles[0].Rules); got != want {
		t.Errorf("Role rules = %s; want %s, as %s", got, want, nodeRBACPath)
	}
	if !slices.Equal(binding.Subjects, want.RoleBindings[0].Subjects) {
		t.Errorf("subjects = %+v; want %+v, as %s", binding.Subjects, want.RoleBindings[0].Subjects, nodeRBACPath)
	}
	if wantRef := (rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: role.Name}); binding.RoleRef != wantRef {
		t.Errorf("roleRef = %+v; want %+v", binding.RoleRef, wantRef)
	}
}

// checkProbeHost checks the host both probes connect to; "" means the pod IP.
func checkProbeHost(t *testing.T, c *corev1.Container, want string) {
	t.Helper()
	for name, probe := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if probe == nil || probe.HTTPGet == nil {
			continue // reported by checkInvariants
		}
		if probe.HTTPGet.Host != want {
			t.Errorf("%s probe host = %q; want %q", name, probe.HTTPGet.Host, want)
		}
	}
}

// checkResources checks that the default requests and limits are set and
// ordered: the measured idle RSS is documented in values.yaml.
func checkResources(t *testing.T, c *corev1.Container) {
	t.Helper()
	req, lim := c.Resources.Requests, c.Resources.Limits
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := req[name]; !ok {
			t.Errorf("no %s request", name)
		}
	}
	memLimit, ok := lim[corev1.ResourceMemory]
	if !ok {
		t.Fatal("no memory limit")
	}
	if memReq := req[corev1.ResourceMemory]; memLimit.Cmp(memReq) < 0 {
		t.Errorf("memory limit %s below request %s", memLimit.String(), memReq.String())
	}
	if floor := resource.MustParse("64Mi"); memLimit.Cmp(floor) < 0 {
		t.Errorf("memory limit %s is below the 64Mi values.yaml asks for", memLimit.String())
	}
	// 10m is 10 CPU shares, which cgroup v2 makes the lowest weight there
	// is, a BestEffort pod's: the node's API path would lose every contest
	// for a busy CPU.
	if cpu, floor := req[corev1.ResourceCPU], resource.MustParse("100m"); cpu.Cmp(floor) < 0 {
		t.Errorf("cpu request %s; want at least 100m", cpu.String())
	}
}

// container returns the DaemonSet's only container.
func container(t *testing.T, m *manifest) *corev1.Container {
	t.Helper()
	return &m.DaemonSet.Spec.Template.Spec.Containers[0]
}

// envValues returns the container's literal environment; a variable set
// from a field reference maps to "".
func envValues(t *testing.T, c *corev1.Container) map[string]string {
	t.Helper()
	env := make(map[string]string, len(c.Env))
	for _, e := range c.Env {
		if _, dup := env[e.Name]; dup {
			t.Errorf("env %s set twice", e.Name)
		}
		env[e.Name] = e.Value
	}
	return env
}

func boolValue(b *bool) bool { return b != nil && *b }

// show prints what a pointer field holds, or "unset".
func show[T any](p *T) string {
	if p == nil {
		return "unset"
	}
	return fmt.Sprint(*p)
}

// checkPodMonitorLabels checks the relabelings of the PodMonitor's one
// endpoint: the node label from the pod's node name, which the dashboard
// and the alerts group by, and a cluster label set to cluster, or none when
// cluster is empty. TestDashboardQueriesInPrometheus runs them in a real
// Prometheus.
func checkPodMonitorLabels(t *testing.T, pm *podMonitor, cluster string) {
	t.Helper()
	eps := pm.Spec.PodMetricsEndpoints
	if len(eps) != 1 {
		t.Fatalf("podMetricsEndpoints = %+v; want one", eps)
	}
	var node, clusters []relabeling
	for _, r := range eps[0].Relabelings {
		switch r.TargetLabel {
		case "node":
			node = append(node, r)
		case "cluster":
			clusters = append(clusters, r)
		}
	}
	if len(node) != 1 || node[0].Action != "replace" || !slices.Equal(node[0].SourceLabels, []string{"__meta_kubernetes_pod_node_name"}) || node[0].Replacement != nil {
		t.Errorf("relabelings to node = %+v; want one replace from __meta_kubernetes_pod_node_name", node)
	}
	switch {
	case cluster == "" && len(clusters) != 0:
		t.Errorf("relabelings to cluster = %+v; want none without metrics.podMonitor.cluster", clusters)
	case cluster != "" && (len(clusters) != 1 || clusters[0].Action != "replace" || len(clusters[0].SourceLabels) != 0 ||
		clusters[0].Replacement == nil || *clusters[0].Replacement != cluster):
		t.Errorf("relabelings to cluster = %+v; want one replace setting %q", clusters, cluster)
	}
}
