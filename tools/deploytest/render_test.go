// Package test checks the deployment artefacts of extractedprism: the Helm
// chart in charts/extractedprism, the plain manifest rendered from it in
// deploy/extractedprism.yaml, the examples, and the Containerfile's static
// build. It is a module of its own so that nothing it needs enters the
// daemon's go.mod.
//
// The artefacts are judged by the daemon they run, which is a release, not
// this tree: the chart's appVersion and every example's image tag or
// download name one version X.Y.Z, and the tests build the daemon from
// the release commit of vX.Y.Z and run it as the artefacts do (the check
// hook, the init container, the static pods' check, the systemd units).
// The flags and variables the chart and the examples may set are read from
// that commit's source too. Release vX.Y.Z is the commit that adds the
// heading "## [X.Y.Z]" to CHANGELOG.md, tagged vX.Y.Z; the tests find it
// from the history alone (a clone may lack the tags, but not the history:
// a shallow clone fails), check the tag where there is one, and hold every
// released section from 0.2.0 on to the text its release commit wrote. So
// a chart or example that needs what main has and the release lacks fails
// here until a release brings it and the pins move to that release.
//
// Run it through ci.sh, which builds the pinned helm and passes it in
// $HELM. The API-server test runs when the kube-apiserver and etcd
// binaries exist (see apiserver_test.go) and skips otherwise.
package test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

const (
	// releaseName and releaseNamespace are what the plain manifest is
	// rendered with, and what every test renders with.
	releaseName      = "extractedprism"
	releaseNamespace = "kube-system"

	// helmVersion is the helm ci.sh builds; findHelm looks for it in the
	// same cache when $HELM is not set.
	helmVersion = "v3.22.0"
)

// Paths relative to this package's directory, where go test runs.
var (
	repoRoot     = filepath.Join("..", "..")
	chartDir     = filepath.Join(repoRoot, "charts", "extractedprism")
	manifestPath = filepath.Join(repoRoot, "deploy", "extractedprism.yaml")
)

// exampleEndpoints are documentation addresses (RFC 5737), used wherever a
// render needs endpoints and for the plain manifest.
var exampleEndpoints = []string{"192.0.2.11:6443", "192.0.2.12:6443", "192.0.2.13:6443"}

// findHelm returns the helm binary: $HELM, else the one ci.sh caches, else
// helm on $PATH.
func findHelm(t *testing.T) string {
	t.Helper()
	if h := os.Getenv("HELM"); h != "" {
		return h
	}
	if home, err := os.UserHomeDir(); err == nil {
		cached := filepath.Join(home, ".cache", "extractedprism-tools", "helm-"+helmVersion, "helm")
		if _, err := os.Stat(cached); err == nil {
			return cached
		}
	}
	if h, err := exec.LookPath("helm"); err == nil {
		return h
	}
	t.Fatalf("no helm: run tools/deploytest/ci.sh, which builds helm %s, or set HELM to a helm binary", helmVersion)
	return ""
}

// binDir holds the binaries this run builds; TestMain makes it and removes
// it when the run ends.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "deploytest-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "deploytest:", err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// buildDaemon builds the daemon of the pinned release (pinned_test.go),
// once per run, for the first test that runs it.
var buildDaemon = sync.OnceValues(func() (string, error) {
	rel, err := pinnedRelease()
	if err != nil {
		return "", err
	}
	out := filepath.Join(binDir, "extractedprism")
	if err := buildRelease(rel, out); err != nil {
		return "", err
	}
	return out, nil
})

// daemonBinary returns the daemon of the pinned release.
func daemonBinary(t *testing.T) string {
	t.Helper()
	path, err := buildDaemon()
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// daemonSource returns the path of name, a file of the daemon's source, in
// the pinned release's tree: what the artefacts are judged against.
func daemonSource(t *testing.T, name string) string {
	t.Helper()
	rel, err := pinnedRelease()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(rel.src, name)
}

// runHelm runs helm with args and returns its standard output, or an error
// carrying its standard error. Helm's own directories point into a
// temporary directory so the tests never read or write the user's helm
// configuration.
func runHelm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	home := t.TempDir()
	cmd := exec.Command(findHelm(t), args...)
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
	)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %w\n%s%s", strings.Join(args, " "), err, stderr.String(), stdout.String())
	}
	return stdout.String(), nil
}

// valuesFile writes values as a YAML values file and returns its path.
// Values files rather than --set keep IPv6 brackets and commas literal.
func valuesFile(t *testing.T, values map[string]any) string {
	t.Helper()
	data, err := yaml.Marshal(values)
	if err != nil {
		t.Fatalf("marshal values: %v", err)
	}
	path := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatalf("write values: %v", err)
	}
	return path
}

// templateArgs is the helm template command line for values plus any
// extra arguments.
func templateArgs(t *testing.T, values map[string]any, extra ...string) []string {
	t.Helper()
	args := []string{"template", releaseName, chartDir, "--namespace", releaseNamespace}
	if values != nil {
		args = append(args, "--values", valuesFile(t, values))
	}
	return append(args, extra...)
}

// renderYAML runs helm template and returns the manifest text.
func renderYAML(t *testing.T, values map[string]any, extra ...string) (string, error) {
	t.Helper()
	return runHelm(t, templateArgs(t, values, extra...)...)
}

// podMonitor is the part of a monitoring.coreos.com/v1 PodMonitor the chart
// writes. Decoding is strict, so a field the chart misspells fails the test.
type podMonitor struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string            `json:"name"`
		Namespace string            `json:"namespace"`
		Labels    map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		JobLabel string `json:"jobLabel"`
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		PodMetricsEndpoints []struct {
			Port              string       `json:"port"`
			Path              string       `json:"path"`
			Interval          string       `json:"interval"`
			ScrapeTimeout     string       `json:"scrapeTimeout"`
			Relabelings       []relabeling `json:"relabelings"`
			MetricRelabelings []relabeling `json:"metricRelabelings"`
		} `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

// relabeling is one of a PodMetricsEndpoint's relabelings: a Prometheus
// relabel_config with the operator's field names.
type relabeling struct {
	Action       string   `json:"action"`
	SourceLabels []string `json:"sourceLabels"`
	TargetLabel  string   `json:"targetLabel"`
	Replacement  *string  `json:"replacement"`
	Regex        string   `json:"regex"`
}

// manifest is one render, decoded. Every document must be of a kind the
// chart is meant to produce, and decodes strictly into its API type.
type manifest struct {
	Docs []*unstructured.Unstructured // every document, in order

	DaemonSet       *appsv1.DaemonSet
	CheckJob        *batchv1.Job // the check hook, with configCheck.enabled
	ServiceAccount  *corev1.ServiceAccount
	Roles           []*rbacv1.Role
	RoleBindings    []*rbacv1.RoleBinding
	PodMonitor      *podMonitor
	OtherKinds      []string // kinds the chart should never render
	UnexpectedTwice []string // kinds rendered more than once where one is expected
}

// splitDocuments decodes a multi-document YAML stream into objects,
// dropping empty documents.
func splitDocuments(text string) ([]*unstructured.Unstructured, error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(text)))
	var docs []*unstructured.Unstructured
	for {
		raw, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read document: %w", err)
		}
		obj := map[string]any{}
		if err := yaml.Unmarshal(raw, &obj); err != nil {
			return nil, fmt.Errorf("decode document: %w\n%s", err, raw)
		}
		if len(obj) == 0 {
			continue
		}
		docs = append(docs, &unstructured.Unstructured{Object: obj})
	}
}

// decodeManifest decodes rendered text into a manifest.
func decodeManifest(t *testing.T, text string) *manifest {
	t.Helper()
	docs, err := splitDocuments(text)
	if err != nil {
		t.Fatalf("%v", err)
	}
	m := &manifest{Docs: docs}
	for _, doc := range docs {
		raw, err := doc.MarshalJSON()
		if err != nil {
			t.Fatalf("re-encode %s: %v", doc.GetKind(), err)
		}
		gvk := doc.GroupVersionKind()
		switch gvk.GroupVersion().String() + "/" + gvk.Kind {
		case "apps/v1/DaemonSet":
			if m.DaemonSet != nil {
				m.UnexpectedTwice = append(m.UnexpectedTwice, gvk.Kind)
			}
			m.DaemonSet = &appsv1.DaemonSet{}
			strictDecode(t, raw, m.DaemonSet)
		case "batch/v1/Job":
			if m.CheckJob != nil {
				m.UnexpectedTwice = append(m.UnexpectedTwice, gvk.Kind)
			}
			m.CheckJob = &batchv1.Job{}
			strictDecode(t, raw, m.CheckJob)
		case "v1/ServiceAccount":
			if m.ServiceAccount != nil {
				m.UnexpectedTwice = append(m.UnexpectedTwice, gvk.Kind)
			}
			m.ServiceAccount = &corev1.ServiceAccount{}
			strictDecode(t, raw, m.ServiceAccount)
		case "rbac.authorization.k8s.io/v1/Role":
			role := &rbacv1.Role{}
			strictDecode(t, raw, role)
			m.Roles = append(m.Roles, role)
		case "rbac.authorization.k8s.io/v1/RoleBinding":
			binding := &rbacv1.RoleBinding{}
			strictDecode(t, raw, binding)
			m.RoleBindings = append(m.RoleBindings, binding)
		case "monitoring.coreos.com/v1/PodMonitor":
			if m.PodMonitor != nil {
				m.UnexpectedTwice = append(m.UnexpectedTwice, gvk.Kind)
			}
			m.PodMonitor = &podMonitor{}
			strictDecode(t, raw, m.PodMonitor)
		default:
			m.OtherKinds = append(m.OtherKinds, gvk.String())
		}
	}
	return m
}

// strictDecode decodes JSON into out, failing on fields out does not have.
func strictDecode(t *testing.T, raw []byte, out any) {
	t.Helper()
	if err := yaml.UnmarshalStrict(raw, out); err != nil {
		t.Fatalf("decode %T strictly: %v\n%s", out, err, raw)
	}
}

// render runs helm template with values and decodes the result; the render
// must succeed.
func render(t *testing.T, values map[string]any, extra ...string) *manifest {
	t.Helper()
	text, err := renderYAML(t, values, extra...)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return decodeManifest(t, text)
}
