package test

// The node-level instances: the kubeadm static pod (examples/kubeadm), the
// Talos one (examples/talos), and the RBAC that lets the nodes' own
// credentials run their discovery (deploy/node-discovery-rbac.yaml).

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

var (
	kubeadmPodPath = filepath.Join(repoRoot, "examples", "kubeadm", "extractedprism.yaml")
	nodeRBACPath   = filepath.Join(repoRoot, "deploy", "node-discovery-rbac.yaml")
)

// nodeDiscoveryRBAC decodes deploy/node-discovery-rbac.yaml.
func nodeDiscoveryRBAC(t *testing.T) *manifest {
	t.Helper()
	data, err := os.ReadFile(nodeRBACPath)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return decodeManifest(t, string(data))
}

// TestNodeDiscoveryRBAC checks deploy/node-discovery-rbac.yaml: one Role in
// default with list and watch on endpointslices and nothing else, bound to
// the group every kubelet's certificate carries.
func TestNodeDiscoveryRBAC(t *testing.T) {
	m := nodeDiscoveryRBAC(t)
	if len(m.Docs) != 2 || len(m.Roles) != 1 || len(m.RoleBindings) != 1 {
		t.Fatalf("%d documents, %d Roles, %d RoleBindings; want one Role and one RoleBinding only", len(m.Docs), len(m.Roles), len(m.RoleBindings))
	}
	role, binding := m.Roles[0], m.RoleBindings[0]
	if role.Namespace != "default" || binding.Namespace != "default" {
		t.Errorf("Role in %q, RoleBinding in %q; want default, where the kubernetes EndpointSlices are", role.Namespace, binding.Namespace)
	}
	wantRule := rbacv1.PolicyRule{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}}
	if len(role.Rules) != 1 || !slices.Equal(role.Rules[0].APIGroups, wantRule.APIGroups) ||
		!slices.Equal(role.Rules[0].Resources, wantRule.Resources) || !slices.Equal(role.Rules[0].Verbs, wantRule.Verbs) ||
		len(role.Rules[0].ResourceNames) != 0 || len(role.Rules[0].NonResourceURLs) != 0 {
		t.Errorf("rules = %+v; want [%+v]", role.Rules, wantRule)
	}
	if want := (rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: role.Name}); binding.RoleRef != want {
		t.Errorf("roleRef = %+v; want %+v", binding.RoleRef, want)
	}
	want := []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: rbacv1.GroupKind, Name: "system:nodes"}}
	if !slices.Equal(binding.Subjects, want) {
		t.Errorf("subjects = %+v; want %+v", binding.Subjects, want)
	}
}

// kubeadmPod decodes the kubeadm static pod strictly: a field corev1.Pod
// lacks is a misspelling.
func kubeadmPod(t *testing.T) *corev1.Pod {
	t.Helper()
	data, err := os.ReadFile(kubeadmPodPath)
	if err != nil {
		t.Fatalf("%v", err)
	}
	pod := &corev1.Pod{}
	if err := yaml.UnmarshalStrict(data, pod); err != nil {
		t.Fatalf("%s: %v", kubeadmPodPath, err)
	}
	if pod.APIVersion != "v1" || pod.Kind != "Pod" {
		t.Fatalf("%s is a %s %s; want a v1 Pod", kubeadmPodPath, pod.APIVersion, pod.Kind)
	}
	return pod
}

// TestKubeadmExample checks the kubeadm static pod: a node-level instance
// that runs discovery with kubeadm's kubelet kubeconfig.
func TestKubeadmExample(t *testing.T) {
	pod := kubeadmPod(t)
	if pod.Namespace != "kube-system" {
		t.Errorf("namespace = %q; want kube-system, kubeadm's static pods'", pod.Namespace)
	}
	checkNodeLevelPod(t, pod.Spec, "/etc/kubernetes/kubelet.conf")
	// The README's install step pulls the image the kubelet will run.
	readme, err := os.ReadFile(filepath.Join(filepath.Dir(kubeadmPodPath), "README.md"))
	if err != nil {
		t.Fatalf("%v", err)
	}
	if image := pod.Spec.Containers[0].Image; !strings.Contains(string(readme), "crictl pull "+image+"\n") {
		t.Errorf("examples/kubeadm/README.md does not pull %s, the manifest's image", image)
	}
	checkKubeadmHandover(t, pod, string(readme))
}

// kubeadmHandoverSocket is where the kubeadm static pod serves hand-overs;
// every version of the manifest must name the same socket.
const kubeadmHandoverSocket = "/run/extractedprism/extractedprism.sock"

// checkKubeadmHandover checks the static pod's hand-over socket: in a
// writable hostPath mount of exactly its directory, which the kubelet
// creates root's and the daemon, running as root with no init container,
// closes to 0700 itself; and the README's procedure waits for the daemon's
// own log line.
func checkKubeadmHandover(t *testing.T, pod *corev1.Pod, readme string) {
	t.Helper()
	c := &pod.Spec.Containers[0]
	socket := envValues(t, c)["EP_HANDOVER_SOCKET"]
	if socket != kubeadmHandoverSocket {
		t.Fatalf("EP_HANDOVER_SOCKET = %q; want %q", socket, kubeadmHandoverSocket)
	}
	m := hostDirMount(pod.Spec, c, socket)
	if m == nil || m.ReadOnly || m.MountPath != filepath.Dir(socket) {
		t.Errorf("%s is not in a writable mount of the host directory %s, the socket's own", socket, filepath.Dir(socket))
	}
	for _, v := range pod.Spec.Volumes {
		if m != nil && v.Name == m.Name && (v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathDirectoryOrCreate) {
			t.Errorf("volume %s has hostPath type %s; want DirectoryOrCreate", v.Name, show(v.HostPath.Type))
		}
	}
	sc := pod.Spec.SecurityContext
	if sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 0 || len(pod.Spec.InitContainers) != 0 {
		t.Errorf("pod runs as %v with init containers %v; want UID 0 and none: the daemon owns the root directory the kubelet creates", sc, pod.Spec.InitContainers)
	}
	// A grace period the old pod's 10 s spread of closes fits in.
	if g := pod.Spec.TerminationGracePeriodSeconds; g != nil && *g < 15 {
		t.Errorf("terminationGracePeriodSeconds = %d; want 15 or more", *g)
	}
	for _, want := range []string{"## Changing the manifest without cutting the node off", "allowStaticPodStart", takeOverLogLine} {
		if !strings.Contains(readme, want) {
			t.Errorf("examples/kubeadm/README.md lacks %q", want)
		}
	}
	checkDaemonLogs(t, takeOverLogLine)
}

// takeOverLogLine is what a daemon logs once it serves sockets it took
// over; the kubeadm README waits for it.
const takeOverLogLine = "took over the listening sockets from the running instance"

// checkDaemonLogs checks that the pinned release's source, its non-test
// files, has msg, so the docs quote what the daemon they run logs.
func checkDaemonLogs(t *testing.T, msg string) {
	t.Helper()
	files, err := filepath.Glob(daemonSource(t, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(data), `"`+msg+`"`) {
			return
		}
	}
	t.Errorf("no source file of the pinned release in %s logs %q", daemonSource(t, ""), msg)
}

// checkNodeLevelPod checks a node-level static pod: host network,
// node-critical, the chart's image, only variables the daemon reads,
// discovery through the kubelet's kubeconfig with the endpoint cache on,
// readyz with the kubelet's certificate, every file it reads inside a
// read-only mount of a host directory and the cache inside a writable one,
// the chart's container restrictions, and the probes on 127.0.0.1:7446.
func checkNodeLevelPod(t *testing.T, spec corev1.PodSpec, kubeconfig string) {
	t.Helper()
	if !spec.HostNetwork || spec.PriorityClassName != "system-node-critical" || spec.DNSPolicy != corev1.DNSDefault {
		t.Errorf("hostNetwork %v, priorityClassName %q, dnsPolicy %q; want true, system-node-critical, Default", spec.HostNetwork, spec.PriorityClassName, spec.DNSPolicy)
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers; want 1", len(spec.Containers))
	}
	c := &spec.Containers[0]
	if want := "ghcr.io/extractedprism/extractedprism:" + chartAppVersion(t); c.Image != want {
		t.Errorf("image = %q; want %q, the chart's", c.Image, want)
	}
	known := daemonVariables(t)
	env := envValues(t, c)
	for name := range env {
		if !known[name] {
			t.Errorf("env %s is not a daemon variable", name)
		}
	}
	for _, e := range c.Env {
		if e.ValueFrom != nil {
			t.Errorf("env %s comes from the API (valueFrom), which a static pod cannot use", e.Name)
		}
	}
	const cert = "/var/lib/kubelet/pki/kubelet-client-current.pem"
	for name, want := range map[string]string{
		"EP_ENABLE_DISCOVERY":       "true",
		"EP_KUBECONFIG":             kubeconfig,
		"EP_HEALTH_CHECK":           "readyz",
		"EP_HEALTH_CHECK_CA_FILE":   "/etc/kubernetes/pki/ca.crt",
		"EP_HEALTH_CHECK_CERT_FILE": cert,
		"EP_HEALTH_CHECK_KEY_FILE":  cert,
	} {
		if env[name] != want {
			t.Errorf("%s = %q; want %q", name, env[name], want)
		}
	}
	if env["EP_ENDPOINTS"] == "" {
		t.Error("EP_ENDPOINTS is not set")
	}
	cache := env["EP_ENDPOINT_CACHE_FILE"]
	if cache == "" {
		t.Fatal("EP_ENDPOINT_CACHE_FILE is not set: the endpoint cache is off")
	}
	for _, file := range []string{kubeconfig, env["EP_HEALTH_CHECK_CA_FILE"], cert} {
		if m := hostDirMount(spec, c, file); m == nil || !m.ReadOnly {
			t.Errorf("%s is not inside a read-only mount of the same host directory", file)
		}
	}
	if m := hostDirMount(spec, c, cache); m == nil || m.ReadOnly {
		t.Errorf("the endpoint cache %s is not inside a writable mount of the same host directory", cache)
	}
	// The certificate's own directory, not /var/lib/kubelet: the pod has
	// no business with the rest of the kubelet's state.
	if m := hostDirMount(spec, c, cert); m != nil && m.MountPath != filepath.Dir(cert) {
		t.Errorf("the kubelet's certificate comes through a mount of %s; want its own directory, %s", m.MountPath, filepath.Dir(cert))
	}
	for _, v := range spec.Volumes {
		if v.HostPath == nil {
			t.Errorf("volume %s is not a hostPath: a static pod has only the host's files", v.Name)
			continue
		}
		// A file mount pins the file the kubelet replaces on rotation, and
		// a missing file behind one becomes a directory.
		if v.HostPath.Type == nil || (*v.HostPath.Type != corev1.HostPathDirectory && *v.HostPath.Type != corev1.HostPathDirectoryOrCreate) {
			t.Errorf("volume %s has hostPath type %s; want Directory or DirectoryOrCreate", v.Name, show(v.HostPath.Type))
		}
	}
	csc := c.SecurityContext
	if csc == nil || csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation ||
		!boolValue(csc.ReadOnlyRootFilesystem) || boolValue(csc.Privileged) || csc.Capabilities == nil ||
		!slices.Equal(csc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(csc.Capabilities.Add) != 0 {
		t.Errorf("container securityContext = %+v; want no escalation, not privileged, read-only root, drop ALL", csc)
	}
	if spec.SecurityContext == nil || spec.SecurityContext.SeccompProfile == nil || spec.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Error("the static pod has no RuntimeDefault seccomp profile")
	}
	for name, probe := range map[string]*corev1.Probe{"/healthz": c.LivenessProbe, "/readyz": c.ReadinessProbe} {
		if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Path != name || probe.HTTPGet.Port.IntValue() != 7446 || probe.HTTPGet.Host != "127.0.0.1" {
			t.Errorf("probe %s = %+v; want GET 127.0.0.1:7446%s", name, probe, name)
		}
	}
	if _, ok := c.Resources.Limits[corev1.ResourceMemory]; !ok {
		t.Error("no memory limit")
	}
}

// hostDirMount returns the container's mount that holds file: the one with
// the longest mount path that is file's directory or a parent of it, if
// it mounts a hostPath volume of that same path (so the path inside the
// container is the path on the host). nil if there is none.
func hostDirMount(spec corev1.PodSpec, c *corev1.Container, file string) *corev1.VolumeMount {
	var best *corev1.VolumeMount
	for i, m := range c.VolumeMounts {
		if !strings.HasPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/") {
			continue
		}
		if best == nil || len(m.MountPath) > len(best.MountPath) {
			best = &c.VolumeMounts[i]
		}
	}
	if best == nil || best.SubPath != "" || best.SubPathExpr != "" {
		return nil
	}
	for _, v := range spec.Volumes {
		if v.Name == best.Name && v.HostPath != nil && v.HostPath.Path == best.MountPath {
			return best
		}
	}
	return nil
}
