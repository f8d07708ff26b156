package test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"
)

// The kube-apiserver and etcd binaries this test runs, built by
// e2e/build-binaries.sh. EP_E2E_BIN_DIR points elsewhere; EP_E2E_REQUIRE=1
// turns their absence from a skip into a failure, for CI that has them.
const defaultE2EBinDir = "/root/.cache/extractedprism-e2e/v1.37.2"

// TestAPIServerAcceptsManifests sends every render of the template matrix,
// of the example values files (the chart's ci/), of the
// chart as a subchart, deploy/extractedprism.yaml, deploy/node-discovery-rbac.yaml and
// the Talos and kubeadm static pods to a real kube-apiserver as server-side
// apply dry runs with strict field validation, so the API server's own
// schema and admission judge them. It then applies the discovery RBAC, the
// chart's and the nodes', for real and asks the authorizer what the
// service account and a node may do.
func TestAPIServerAcceptsManifests(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and kube-apiserver; skipped with -short")
	}
	apiserverBin, etcdBin := e2eBinaries(t)

	// Render first: a broken chart fails here, before anything starts.
	renders := map[string][]*unstructured.Unstructured{}
	for _, tc := range templateCases(chartAppVersion(t)) {
		text, err := renderYAML(t, tc.values)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		docs, err := splitDocuments(text)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		renders["chart: "+tc.name] = docs
	}
	plain, err := os.ReadFile(manifestPath)
	if err != nil {
		t.Fatalf("%v", err)
	}
	plainDocs, err := splitDocuments(string(plain))
	if err != nil {
		t.Fatalf("%s: %v", manifestPath, err)
	}
	renders[manifestPath] = plainDocs
	nodeRBAC, err := os.ReadFile(nodeRBACPath)
	if err != nil {
		t.Fatalf("%v", err)
	}
	nodeRBACDocs, err := splitDocuments(string(nodeRBAC))
	if err != nil {
		t.Fatalf("%s: %v", nodeRBACPath, err)
	}
	renders[nodeRBACPath] = nodeRBACDocs
	for _, file := range ciValuesFiles(t) {
		text, err := renderYAML(t, nil, "--values", file)
		if err != nil {
			t.Fatalf("%v", err)
		}
		if renders["chart: "+file], err = splitDocuments(text); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
	}
	if renders["chart as a subchart"], err = splitDocuments(renderAsSubchart(t, subchartValues)); err != nil {
		t.Fatalf("%v", err)
	}
	staticPods := map[string]*unstructured.Unstructured{
		talosPatchPath: talosStaticPod(t),
		kubeadmPodPath: kubeadmStaticPod(t),
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg := startControlPlane(ctx, t, apiserverBin, etcdBin)
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("%v", err)
	}
	clientset, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("%v", err)
	}
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatalf("%v", err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disco))

	installPodMonitorCRD(ctx, t, dyn, mapper)
	createNamespaces(ctx, t, dyn, mapper, renders)

	for name, docs := range renders {
		t.Run("dry run "+name, func(t *testing.T) {
			for _, obj := range docs {
				if err := apply(ctx, dyn, mapper, obj, true); err != nil {
					t.Errorf("%v", err)
				}
			}
		})
	}

	// The static pods, as the Pods the API server would see (the kubelet
	// creates their mirror pods). Without a controller manager nobody
	// creates kube-system's default ServiceAccount, which the
	// ServiceAccount admission plugin looks up.
	defaultSA := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "ServiceAccount",
		"metadata": map[string]any{"name": "default", "namespace": "kube-system"},
	}}
	if err := apply(ctx, dyn, mapper, defaultSA, false); err != nil {
		t.Fatalf("%v", err)
	}
	for path, pod := range staticPods {
		t.Run("dry run "+path, func(t *testing.T) {
			if err := apply(ctx, dyn, mapper, pod, true); err != nil {
				t.Errorf("%v", err)
			}
		})
	}

	// The RBAC of the default render, applied for real, with its
	// ServiceAccount; the authorizer then answers for that account.
	var sa serviceAccount
	for _, obj := range renders["chart: defaults with endpoints"] {
		switch obj.GetKind() {
		case "ServiceAccount":
			sa = serviceAccount{namespace: obj.GetNamespace(), name: obj.GetName()}
			fallthrough
		case "Role", "RoleBinding":
			if err := apply(ctx, dyn, mapper, obj, false); err != nil {
				t.Fatalf("%v", err)
			}
		}
	}
	if sa.name == "" {
		t.Fatal("the default render has no ServiceAccount")
	}
	checkAccess(ctx, t, clientset, sa.subject())

	// The nodes' grant, applied for real; a kubelet's certificate names
	// the user system:node:<name> in the group system:nodes.
	for _, obj := range nodeRBACDocs {
		if err := apply(ctx, dyn, mapper, obj, false); err != nil {
			t.Fatalf("%v", err)
		}
	}
	checkAccess(ctx, t, clientset, accessSubject{user: "system:node:worker-1", groups: []string{"system:nodes", "system:authenticated"}})
}

// kubeadmStaticPod returns the kubeadm example's pod as an object.
func kubeadmStaticPod(t *testing.T) *unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(kubeadmPodPath)
	if err != nil {
		t.Fatalf("%v", err)
	}
	pod := map[string]any{}
	if err := yaml.Unmarshal(data, &pod); err != nil {
		t.Fatalf("%s: %v", kubeadmPodPath, err)
	}
	return &unstructured.Unstructured{Object: pod}
}

// talosStaticPod returns the static pod of the Talos patch as an object.
func talosStaticPod(t *testing.T) *unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(talosPatchPath)
	if err != nil {
		t.Fatalf("%v", err)
	}
	var patch struct {
		Machine struct {
			Pods []map[string]any `json:"pods"`
		} `json:"machine"`
	}
	if err := yaml.Unmarshal(data, &patch); err != nil {
		t.Fatalf("%s: %v", talosPatchPath, err)
	}
	if len(patch.Machine.Pods) != 1 {
		t.Fatalf("%s: %d pods; want 1", talosPatchPath, len(patch.Machine.Pods))
	}
	return &unstructured.Unstructured{Object: patch.Machine.Pods[0]}
}

// e2eBinaries returns the kube-apiserver and etcd paths, or skips.
func e2eBinaries(t *testing.T) (apiserver, etcd string) {
	t.Helper()
	dir := os.Getenv("EP_E2E_BIN_DIR")
	if dir == "" {
		dir = defaultE2EBinDir
	}
	apiserver, etcd = filepath.Join(dir, "kube-apiserver"), filepath.Join(dir, "etcd")
	for _, bin := range []string{apiserver, etcd} {
		if _, err := os.Stat(bin); err != nil {
			msg := fmt.Sprintf("no %s (%v): build it with e2e/build-binaries.sh, or set EP_E2E_BIN_DIR", bin, err)
			if os.Getenv("EP_E2E_REQUIRE") == "1" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
	return apiserver, etcd
}

// serviceAccount names a ServiceAccount.
type serviceAccount struct{ namespace, name string }

// subject is the user and groups the API server gives the account's
// tokens.
func (sa serviceAccount) subject() accessSubject {
	return accessSubject{
		user:   "system:serviceaccount:" + sa.namespace + ":" + sa.name,
		groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + sa.namespace, "system:authenticated"},
	}
}

// accessSubject is who a SubjectAccessReview asks about.
type accessSubject struct {
	user   string
	groups []string
}

// checkAccess asks the API server's authorizer, through
// SubjectAccessReviews, what the subject may do: read the EndpointSlices
// in default, and nothing else this test can think of.
func checkAccess(ctx context.Context, t *testing.T, clientset kubernetes.Interface, who accessSubject) {
	t.Helper()
	namespace := func(ns string) string {
		if ns == "" {
			return "all namespaces"
		}
		return ns
	}
	tests := []struct {
		verb, group, resource, namespace string
		want                             bool
	}{
		{"get", "discovery.k8s.io", "endpointslices", "default", false},
		{"list", "discovery.k8s.io", "endpointslices", "default", true},
		{"watch", "discovery.k8s.io", "endpointslices", "default", true},
		{"list", "discovery.k8s.io", "endpointslices", "kube-system", false},
		{"list", "discovery.k8s.io", "endpointslices", "", false},
		{"watch", "discovery.k8s.io", "endpointslices", "kube-public", false},
		{"create", "discovery.k8s.io", "endpointslices", "default", false},
		{"update", "discovery.k8s.io", "endpointslices", "default", false},
		{"delete", "discovery.k8s.io", "endpointslices", "default", false},
		{"list", "", "secrets", "default", false},
		{"list", "", "secrets", "kube-system", false},
		{"get", "", "secrets", "default", false},
		{"list", "", "endpoints", "default", false},
		{"list", "", "pods", "kube-system", false},
		{"create", "rbac.authorization.k8s.io", "rolebindings", "default", false},
	}
	for _, tt := range tests {
		attrs := &authorizationv1.ResourceAttributes{Verb: tt.verb, Group: tt.group, Resource: tt.resource, Namespace: tt.namespace}
		// The authorizer learns of new bindings through an informer, so
		// a grant may take a moment to show; a denial must hold at once
		// and still hold after the grants have shown.
		deadline := time.Now().Add(15 * time.Second)
		for {
			allowed, reason, err := subjectAccess(ctx, clientset, who, attrs)
			if err != nil {
				t.Fatalf("SubjectAccessReview: %v", err)
			}
			if allowed == tt.want {
				break
			}
			if !tt.want || time.Now().After(deadline) {
				t.Errorf("%s may %s %s.%s in %s: %v; want %v (%s)", who.user, tt.verb, tt.resource, tt.group, namespace(tt.namespace), allowed, tt.want, reason)
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// subjectAccess asks whether a subject may do attrs.
func subjectAccess(ctx context.Context, clientset kubernetes.Interface, who accessSubject, attrs *authorizationv1.ResourceAttributes) (bool, string, error) {
	review := &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User:               who.user,
			Groups:             who.groups,
			ResourceAttributes: attrs,
		},
	}
	got, err := clientset.AuthorizationV1().SubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
	if err != nil {
		return false, "", err
	}
	return got.Status.Allowed, got.Status.Reason, nil
}

// apply sends obj as a server-side apply with strict field validation, as
// a dry run or for real.
func apply(ctx context.Context, dyn dynamic.Interface, mapper meta.RESTMapper, obj *unstructured.Unstructured, dryRun bool) error {
	gvk := obj.GroupVersionKind()
	what := fmt.Sprintf("%s %s/%s", gvk.Kind, obj.GetNamespace(), obj.GetName())
	mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	var client dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		// Every namespaced object names its namespace, so the plain
		// manifest cannot land in whatever namespace kubectl defaults to.
		if obj.GetNamespace() == "" {
			return fmt.Errorf("%s: namespaced object without a namespace", what)
		}
		client = dyn.Resource(mapping.Resource).Namespace(obj.GetNamespace())
	}
	data, err := obj.MarshalJSON()
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	force := true
	opts := metav1.PatchOptions{FieldManager: "extractedprism-test", FieldValidation: "Strict", Force: &force}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	if _, err := client.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, opts); err != nil {
		return fmt.Errorf("apply %s (dry run %v): %w", what, dryRun, err)
	}
	return nil
}

// podMonitorCRD stands in for the Prometheus Operator's PodMonitor CRD,
// which this API server does not have. It declares the fields the chart
// sets, with the operator's names and types, and nothing else, so strict
// field validation rejects any other field.
const podMonitorCRD = `{
  "apiVersion": "apiextensions.k8s.io/v1",
  "kind": "CustomResourceDefinition",
  "metadata": {"name": "podmonitors.monitoring.coreos.com"},
  "spec": {
    "group": "monitoring.coreos.com",
    "scope": "Namespaced",
    "names": {"kind": "PodMonitor", "listKind": "PodMonitorList", "plural": "podmonitors", "singular": "podmonitor"},
    "versions": [{
      "name": "v1", "served": true, "storage": true,
      "schema": {"openAPIV3Schema": {
        "type": "object",
        "required": ["spec"],
        "properties": {
          "apiVersion": {"type": "string"},
          "kind": {"type": "string"},
          "metadata": {"type": "object"},
          "spec": {
            "type": "object",
            "required": ["selector"],
            "properties": {
              "jobLabel": {"type": "string"},
              "selector": {
                "type": "object",
                "properties": {
                  "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}
                }
              },
              "podMetricsEndpoints": {
                "type": "array",
                "items": {
                  "type": "object",
                  "properties": {
                    "port": {"type": "string"},
                    "path": {"type": "string"},
                    "interval": {"type": "string", "pattern": "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"},
                    "scrapeTimeout": {"type": "string", "pattern": "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"},
                    "relabelings": {
                      "type": "array",
                      "items": {
                        "type": "object",
                        "properties": {
                          "action": {"type": "string", "enum": ["replace", "Replace", "keep", "Keep", "drop", "Drop", "hashmod", "HashMod", "labelmap", "LabelMap", "labeldrop", "LabelDrop", "labelkeep", "LabelKeep", "lowercase", "Lowercase", "uppercase", "Uppercase", "keepequal", "KeepEqual", "dropequal", "DropEqual"]},
                          "sourceLabels": {"type": "array", "items": {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"}},
                          "targetLabel": {"type": "string"},
                          "replacement": {"type": "string"},
                          "regex": {"type": "string"}
                        }
                      }
                    },
                    "metricRelabelings": {
                      "type": "array",
                      "items": {
                        "type": "object",
                        "properties": {
                          "action": {"type": "string", "enum": ["replace", "Replace", "keep", "Keep", "drop", "Drop", "hashmod", "HashMod", "labelmap", "LabelMap", "labeldrop", "LabelDrop", "labelkeep", "LabelKeep", "lowercase", "Lowercase", "uppercase", "Uppercase", "keepequal", "KeepEqual", "dropequal", "DropEqual"]},
                          "sourceLabels": {"type": "array", "items": {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"}},
                          "targetLabel": {"type": "string"},
                          "replacement": {"type": "string"},
                          "regex": {"type": "string"}
                        }
                      }
                    }
                  }
                }
              }
            }
          }
        }
      }}
    }]
  }
}`

// createNamespaces creates every namespace the renders put objects in
// (namespaceOverride's among them), as a cluster would have them before
// the install: a dry run into a missing namespace fails.
func createNamespaces(ctx context.Context, t *testing.T, dyn dynamic.Interface, mapper meta.RESTMapper, renders map[string][]*unstructured.Unstructured) {
	t.Helper()
	done := map[string]bool{}
	for _, docs := range renders {
		for _, obj := range docs {
			name := obj.GetNamespace()
			if name == "" || done[name] {
				continue
			}
			done[name] = true
			ns := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": name},
			}}
			if err := apply(ctx, dyn, mapper, ns, false); err != nil {
				t.Fatalf("%v", err)
			}
		}
	}
}

// installPodMonitorCRD creates the stand-in CRD and waits until the API
// server serves PodMonitors.
func installPodMonitorCRD(ctx context.Context, t *testing.T, dyn dynamic.Interface, mapper *restmapper.DeferredDiscoveryRESTMapper) {
	t.Helper()
	crd := &unstructured.Unstructured{}
	if err := crd.UnmarshalJSON([]byte(podMonitorCRD)); err != nil {
		t.Fatalf("%v", err)
	}
	if err := apply(ctx, dyn, mapper, crd, false); err != nil {
		t.Fatalf("%v", err)
	}
	gvk := schema.GroupVersionKind{Group: "monitoring.coreos.com", Version: "v1", Kind: "PodMonitor"}
	waitFor(ctx, t, "PodMonitor to be served", func() error {
		mapper.Reset()
		_, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		return err
	})
}

// startControlPlane starts etcd and one kube-apiserver on loopback ports,
// waits until the API server is ready, and returns an admin client
// configuration. Both processes are killed when the test ends.
func startControlPlane(ctx context.Context, t *testing.T, apiserverBin, etcdBin string) *rest.Config {
	t.Helper()
	dir := t.TempDir()
	pki := writePKI(t, dir)

	etcdClient, etcdPeer, apiPort := freePort(t), freePort(t), freePort(t)
	clientURL := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(etcdClient))
	peerURL := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(etcdPeer))
	startProcess(t, dir, "etcd", etcdBin,
		"--name", "extractedprism-test",
		"--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", clientURL,
		"--advertise-client-urls", clientURL,
		"--listen-peer-urls", peerURL,
		"--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "extractedprism-test="+peerURL,
		"--unsafe-no-fsync",
		"--log-level", "warn",
	)
	apiserver := startProcess(t, dir, "kube-apiserver", apiserverBin,
		"--advertise-address", "127.0.0.1",
		"--bind-address", "127.0.0.1",
		"--secure-port", strconv.Itoa(apiPort),
		"--etcd-servers", clientURL,
		"--service-cluster-ip-range", "10.96.0.0/24",
		"--authorization-mode", "RBAC",
		"--client-ca-file", pki.ca,
		"--tls-cert-file", pki.servingCert,
		"--tls-private-key-file", pki.servingKey,
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", pki.saPublic,
		"--service-account-signing-key-file", pki.saKey,
		"--cert-dir", filepath.Join(dir, "apiserver-certs"),
		"--profiling=false",
		// The reconciler that writes the kubernetes Endpoints refuses a
		// loopback advertise address, and nothing here reads them.
		"--endpoint-reconciler-type", "none",
	)

	cfg := &rest.Config{
		Host: "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(apiPort)),
		TLSClientConfig: rest.TLSClientConfig{
			CAData:   pki.caPEM,
			CertData: pki.adminCertPEM,
			KeyData:  pki.adminKeyPEM,
		},
		QPS:     100,
		Burst:   200,
		Timeout: 30 * time.Second,
	}
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatalf("%v", err)
	}
	waitFor(ctx, t, "kube-apiserver /readyz", func() error {
		select {
		case <-apiserver.exited:
			t.Fatalf("kube-apiserver exited:\n%s", apiserver.log())
		default:
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, cfg.Host+"/readyz", nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	})
	return cfg
}

// process is a started child process and its log.
type process struct {
	logPath string
	exited  chan struct{} // closed when the process has exited
}

func (p *process) log() string {
	data, _ := os.ReadFile(p.logPath)
	return string(data)
}

// startProcess starts bin with args, its output in a log file in dir, and
// registers a cleanup that kills it, by its own PID, and waits for it. The
// log is printed when the test fails.
func startProcess(t *testing.T, dir, name, bin string, args ...string) *process {
	t.Helper()
	p := &process{logPath: filepath.Join(dir, name+".log"), exited: make(chan struct{})}
	logFile, err := os.Create(p.logPath)
	if err != nil {
		t.Fatalf("%v", err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		_ = cmd.Wait()
		logFile.Close()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			t.Errorf("%s (pid %d) did not exit after kill", name, cmd.Process.Pid)
		}
		if t.Failed() {
			t.Logf("%s log (last 4 KiB):\n%s", name, tail(p.log(), 4096))
		}
	})
	return p
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

// waitFor polls cond until it returns nil or ctx ends.
func waitFor(ctx context.Context, t *testing.T, what string, cond func() error) {
	t.Helper()
	var last error
	for {
		if last = cond(); last == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v (last error: %v)", what, ctx.Err(), last)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// freePort returns a loopback port that was free a moment ago. Another
// process may take it before the server binds; the test then fails at
// start-up with the server's log rather than misbehaving.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("%v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// testPKI is the files and PEM blocks of the test control plane's
// certificates.
type testPKI struct {
	ca, servingCert, servingKey, saKey, saPublic string
	caPEM, adminCertPEM, adminKeyPEM             []byte
}

// writePKI creates a CA, the API server's serving certificate for
// 127.0.0.1, an admin client certificate (group system:masters) and the
// service-account signing key, all ECDSA P-256, and writes them to dir.
func writePKI(t *testing.T, dir string) testPKI {
	t.Helper()
	now := time.Now()
	caKey := newKey(t)
	caTemplate := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "extractedprism-test-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatalf("%v", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatalf("%v", err)
	}
	issue := func(serial int64, subject pkix.Name, usage x509.ExtKeyUsage, ips []net.IP, names []string) (certOut, keyOut []byte) {
		key := newKey(t)
		template := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      subject,
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
			IPAddresses:  ips,
			DNSNames:     names,
		}
		der, err := x509.CreateCertificate(rand.Reader, template, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatalf("%v", err)
		}
		return pemBlock("CERTIFICATE", der), keyPEM(t, key)
	}
	servingCert, servingKey := issue(2, pkix.Name{CommonName: "kube-apiserver"}, x509.ExtKeyUsageServerAuth,
		[]net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, net.IPv4(10, 96, 0, 1)},
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"})
	adminCert, adminKey := issue(3, pkix.Name{CommonName: "extractedprism-test-admin", Organization: []string{"system:masters"}}, x509.ExtKeyUsageClientAuth, nil, nil)

	saKey := newKey(t)
	saPublicDER, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		t.Fatalf("%v", err)
	}

	p := testPKI{
		ca:           filepath.Join(dir, "ca.crt"),
		servingCert:  filepath.Join(dir, "apiserver.crt"),
		servingKey:   filepath.Join(dir, "apiserver.key"),
		saKey:        filepath.Join(dir, "sa.key"),
		saPublic:     filepath.Join(dir, "sa.pub"),
		caPEM:        pemBlock("CERTIFICATE", caDER),
		adminCertPEM: adminCert,
		adminKeyPEM:  adminKey,
	}
	for path, data := range map[string][]byte{
		p.ca:          p.caPEM,
		p.servingCert: servingCert,
		p.servingKey:  servingKey,
		p.saKey:       keyPEM(t, saKey),
		p.saPublic:    pemBlock("PUBLIC KEY", saPublicDER),
	} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatalf("%v", err)
		}
	}
	return p
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return key
}

func keyPEM(t *testing.T, key *ecdsa.PrivateKey) []byte {
	t.Helper()
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return pemBlock("EC PRIVATE KEY", der)
}

func pemBlock(kind string, der []byte) []byte {
	var b bytes.Buffer
	if err := pem.Encode(&b, &pem.Block{Type: kind, Bytes: der}); err != nil {
		panic(err) // writing to a bytes.Buffer cannot fail
	}
	return b.Bytes()
}
