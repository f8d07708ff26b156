package test

import (
	"bufio"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"
)

var (
	talosPatchPath  = filepath.Join(repoRoot, "examples", "talos", "extractedprism-patch.yaml")
	sniDir          = filepath.Join(repoRoot, "examples", "sni")
	chartReadmePath = filepath.Join(chartDir, "README.md")
	chartValuesPath = filepath.Join(chartDir, "values.yaml")
)

// flagCalls parses the pinned release's config.go and returns its
// fs.XxxVar calls, the flag definitions, by flag name, with the parsed
// file.
func flagCalls(t *testing.T) (*ast.File, map[string]*ast.CallExpr) {
	t.Helper()
	daemonConfigPath := daemonSource(t, "config.go")
	file, err := parser.ParseFile(token.NewFileSet(), daemonConfigPath, nil, 0)
	if err != nil {
		t.Fatalf("%v", err)
	}
	calls := map[string]*ast.CallExpr{}
	ast.Inspect(file, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) < 3 {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok || !strings.HasSuffix(sel.Sel.Name, "Var") {
			return true
		}
		if recv, ok := sel.X.(*ast.Ident); !ok || recv.Name != "fs" {
			return true
		}
		if name, ok := stringLiteral(call.Args[1]); ok {
			calls[name] = call
		}
		return true
	})
	if len(calls) < 10 {
		t.Fatalf("found only %d flags in %s; has the flag set moved?", len(calls), daemonConfigPath)
	}
	return file, calls
}

// stringLiteral returns the value of a string literal.
func stringLiteral(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

// daemonVariables returns the EP_* variable of every flag the pinned
// release's config.go defines: the flag name of each fs.XxxVar call,
// upper-cased, dashes to underscores. --version has none.
func daemonVariables(t *testing.T) map[string]bool {
	t.Helper()
	_, calls := flagCalls(t)
	vars := map[string]bool{}
	for name := range calls {
		vars["EP_"+strings.ToUpper(strings.ReplaceAll(name, "-", "_"))] = true
	}
	return vars
}

// TestChartCoversEveryFlag checks that the chart can set every daemon
// variable (the template matrix, taken together, sets each one) and sets
// nothing the daemon does not read.
func TestChartCoversEveryFlag(t *testing.T) {
	want := daemonVariables(t)
	got := map[string]bool{}
	for _, tc := range templateCases(chartAppVersion(t)) {
		m := render(t, tc.values)
		for _, e := range container(t, m).Env {
			got[e.Name] = true
		}
	}
	for name := range got {
		if !want[name] {
			t.Errorf("the chart sets %s, which the daemon does not read", name)
		}
	}
	for name := range want {
		if !got[name] {
			t.Errorf("no value of the chart sets %s", name)
		}
	}
}

// TestValuesDocumented checks that every value in values.yaml is named in
// the chart's README. (values.schema.json has every value too: helm checks
// the defaults against it, with unknown keys refused, on every render.)
func TestValuesDocumented(t *testing.T) {
	data, err := os.ReadFile(chartValuesPath)
	if err != nil {
		t.Fatalf("%v", err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(data, &values); err != nil {
		t.Fatalf("%v", err)
	}
	readme, err := os.ReadFile(chartReadmePath)
	if err != nil {
		t.Fatalf("%v", err)
	}
	for _, key := range valueKeys("", values) {
		// Documented as `key`, or as part of a `parent.a`, `.b` group.
		last := key[strings.LastIndex(key, ".")+1:]
		if !strings.Contains(string(readme), "`"+key+"`") && !strings.Contains(string(readme), "`."+last+"`") {
			t.Errorf("%s does not document value %s", chartReadmePath, key)
		}
	}
}

// valueKeys lists the dotted paths of the leaves of values; maps that are
// empty by default (free-form maps like podAnnotations) count as leaves.
func valueKeys(prefix string, values map[string]any) []string {
	var keys []string
	for _, k := range slices.Sorted(maps.Keys(values)) {
		path := k
		if prefix != "" {
			path = prefix + "." + k
		}
		if sub, ok := values[k].(map[string]any); ok && len(sub) > 0 && !freeForm[path] {
			keys = append(keys, valueKeys(path, sub)...)
			continue
		}
		keys = append(keys, path)
	}
	return keys
}

// freeForm values are Kubernetes objects passed through as they are.
var freeForm = map[string]bool{"resources": true, "nodeSelector": true}

// TestTalosExample checks the Talos machine-config patch: KubePrism off,
// the node's clients pointed at 127.0.0.1:7445, and a static pod that is a
// node-level instance (checkNodeLevelPod) running discovery with Talos's
// kubelet kubeconfig.
func TestTalosExample(t *testing.T) {
	patch := talosPatch(t)
	if patch.Machine.Features.KubePrism.Enabled == nil || *patch.Machine.Features.KubePrism.Enabled {
		t.Error("machine.features.kubePrism.enabled is not false")
	}
	if got, want := patch.Cluster.ControlPlane.Endpoint, "https://127.0.0.1:7445"; got != want {
		t.Errorf("cluster.controlPlane.endpoint = %q; want %q", got, want)
	}
	if !slices.Contains(patch.Cluster.APIServer.CertSANs, "127.0.0.1") {
		t.Errorf("cluster.apiServer.certSANs = %v; want 127.0.0.1 among them", patch.Cluster.APIServer.CertSANs)
	}
	if len(patch.Machine.Pods) != 1 {
		t.Fatalf("%d static pods; want 1", len(patch.Machine.Pods))
	}
	checkNodeLevelPod(t, patch.Machine.Pods[0].Spec, "/etc/kubernetes/kubeconfig-kubelet")
}

// talosPatchDoc is the part of a Talos v1alpha1 machine config the patch
// sets. Decoding is strict: a field this type lacks is a misspelling.
type talosPatchDoc struct {
	Machine struct {
		Features struct {
			KubePrism struct {
				Enabled *bool `json:"enabled"`
			} `json:"kubePrism"`
		} `json:"features"`
		Pods []corev1.Pod `json:"pods"`
	} `json:"machine"`
	Cluster struct {
		ControlPlane struct {
			Endpoint string `json:"endpoint"`
		} `json:"controlPlane"`
		APIServer struct {
			CertSANs []string `json:"certSANs"`
		} `json:"apiServer"`
	} `json:"cluster"`
}

func talosPatch(t *testing.T) *talosPatchDoc {
	t.Helper()
	data, err := os.ReadFile(talosPatchPath)
	if err != nil {
		t.Fatalf("%v", err)
	}
	patch := &talosPatchDoc{}
	if err := yaml.UnmarshalStrict(data, patch); err != nil {
		t.Fatalf("%s: %v", talosPatchPath, err)
	}
	return patch
}

// TestSNIExample checks that the SNI example's files agree: the kubelet's
// kubeconfig sends the cluster's name as SNI to the local extractedprism,
// and the daemon's settings probe the API servers under that same name
// with discovery off (the API servers' own addresses are behind the shared
// endpoint) and nothing set that only discovery reads.
func TestSNIExample(t *testing.T) {
	kubeconfig, err := clientcmd.LoadFromFile(filepath.Join(sniDir, "kubelet-kubeconfig.yaml"))
	if err != nil {
		t.Fatalf("%v", err)
	}
	if err := clientcmd.Validate(*kubeconfig); err != nil {
		// Validate checks that the referenced files exist, which they do
		// only on a node; anything else is a real error.
		if !strings.Contains(err.Error(), "no such file") && !strings.Contains(err.Error(), "unable to read") {
			t.Errorf("kubeconfig: %v", err)
		}
	}
	ctx := kubeconfig.Contexts[kubeconfig.CurrentContext]
	if ctx == nil {
		t.Fatalf("kubeconfig has no current context %q", kubeconfig.CurrentContext)
	}
	cluster := kubeconfig.Clusters[ctx.Cluster]
	if cluster == nil {
		t.Fatalf("kubeconfig has no cluster %q", ctx.Cluster)
	}
	if cluster.Server != "https://127.0.0.1:7445" {
		t.Errorf("server = %q; want the local extractedprism", cluster.Server)
	}
	sni := cluster.TLSServerName
	if sni == "" {
		t.Fatal("kubeconfig has no tls-server-name")
	}

	env := envFile(t, filepath.Join(sniDir, "extractedprism.env"))
	known := daemonVariables(t)
	for name := range env {
		if !known[name] {
			t.Errorf("extractedprism.env sets %s, which the daemon does not read", name)
		}
	}
	for name, want := range map[string]string{
		"EP_ENABLE_DISCOVERY":         "false",
		"EP_HEALTH_CHECK":             "readyz",
		"EP_HEALTH_CHECK_SERVER_NAME": sni,
	} {
		if env[name] != want {
			t.Errorf("extractedprism.env: %s = %q; want %q", name, env[name], want)
		}
	}

	for _, name := range []string{"EP_KUBECONFIG", "EP_ENDPOINT_CACHE_FILE"} {
		if _, ok := env[name]; ok {
			t.Errorf("extractedprism.env sets %s, which only discovery reads", name)
		}
	}
}

// envFile reads NAME=value lines, skipping blanks and comments.
func envFile(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("%v", err)
	}
	defer f.Close()
	env := map[string]string{}
	scanner := bufio.NewScanner(f)
	for scanner.Scan() {
		line := strings.TrimSpace(scanner.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, value, ok := strings.Cut(line, "=")
		if !ok {
			t.Errorf("%s: not NAME=value: %q", path, line)
			continue
		}
		env[name] = value
	}
	if err := scanner.Err(); err != nil {
		t.Fatalf("%v", err)
	}
	return env
}

// sniInstance is the extractedprism instance a node of the SNI example
// runs, and where it listens.
type sniInstance struct {
	name     string // for messages
	settings string // the example file that configures it

	bindHost   string
	bindPort   int
	healthHost string
	healthPort int
}

func (in *sniInstance) proxy() string {
	return net.JoinHostPort(in.bindHost, strconv.Itoa(in.bindPort))
}

func (in *sniInstance) health() string {
	return net.JoinHostPort(in.healthHost, strconv.Itoa(in.healthPort))
}

// sniNodeInstance is the node's one instance: extractedprism.env under
// systemd or in a static pod, with the daemon's defaults for what the file
// leaves unset.
func sniNodeInstance(t *testing.T) *sniInstance {
	t.Helper()
	env := envFile(t, filepath.Join(sniDir, "extractedprism.env"))
	setting := func(variable, flag string) string {
		if v, ok := env[variable]; ok {
			return v
		}
		return daemonDefault(t, flag)
	}
	in := &sniInstance{
		name:     "node-level instance",
		settings: "extractedprism.env",
		bindHost: setting("EP_BIND_ADDRESS", "bind-address"),
		bindPort: atoi(t, "extractedprism.env: EP_BIND_PORT", setting("EP_BIND_PORT", "bind-port")),
	}
	in.healthPort = atoi(t, "extractedprism.env: EP_HEALTH_PORT", setting("EP_HEALTH_PORT", "health-port"))
	// Empty means the bind address, as in config.go.
	if in.healthHost = setting("EP_HEALTH_BIND_ADDRESS", "health-bind-address"); in.healthHost == "" {
		in.healthHost = in.bindHost
	}
	return in
}

func atoi(t *testing.T, what, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return n
}

// daemonDefault returns the default of a flag as the pinned release's
// config.go writes it: the literal default of an fs.XxxVar call, or, for
// fs.Var, the literal last assigned to the field the flag writes.
func daemonDefault(t *testing.T, flag string) string {
	t.Helper()
	daemonConfigPath := daemonSource(t, "config.go")
	file, calls := flagCalls(t)
	call, ok := calls[flag]
	if !ok {
		t.Fatalf("no --%s in %s", flag, daemonConfigPath)
	}
	literal := func(e ast.Expr) (string, bool) {
		if s, ok := stringLiteral(e); ok {
			return s, true
		}
		lit, ok := e.(*ast.BasicLit)
		if !ok {
			return "", false
		}
		return lit.Value, true
	}
	if call.Fun.(*ast.SelectorExpr).Sel.Name != "Var" {
		if v, ok := literal(call.Args[2]); ok {
			return v
		}
		t.Fatalf("--%s has no literal default in %s", flag, daemonConfigPath)
	}
	// fs.Var((*portNumber)(&cfg.BindPort), ...): the default is what
	// cfg.BindPort holds before parsing, the literal last assigned to it.
	var field string
	ast.Inspect(call.Args[0], func(n ast.Node) bool {
		if s, ok := n.(*ast.SelectorExpr); ok {
			field = s.Sel.Name
			return false
		}
		return true
	})
	var value string
	found := false
	ast.Inspect(file, func(n ast.Node) bool {
		assign, ok := n.(*ast.AssignStmt)
		if !ok || len(assign.Lhs) != len(assign.Rhs) {
			return true
		}
		for i, lhs := range assign.Lhs {
			if s, ok := lhs.(*ast.SelectorExpr); ok && s.Sel.Name == field {
				if v, ok := literal(assign.Rhs[i]); ok {
					value, found = v, true
				}
			}
		}
		return true
	})
	if !found {
		t.Fatalf("no literal default for --%s in %s; has the flag set moved?", flag, daemonConfigPath)
	}
	return value
}

// TestSNIExamplePorts checks that the SNI example runs one instance per
// node, serving the kubelet, kube-proxy and the CNI agent: the README's
// table has that one instance, on the listeners extractedprism.env gives
// it, and the kubelet's kubeconfig uses it.
func TestSNIExamplePorts(t *testing.T) {
	node := sniNodeInstance(t)
	if matches, err := filepath.Glob(filepath.Join(sniDir, "values*.yaml")); err != nil || len(matches) != 0 {
		t.Errorf("chart values in %s (%v, %v): the example runs one node-level instance, no chart", sniDir, matches, err)
	}

	readmePath := filepath.Join(sniDir, "README.md")
	data, err := os.ReadFile(readmePath)
	if err != nil {
		t.Fatalf("%v", err)
	}
	lines := strings.Split(string(data), "\n")
	checkPortTable(t, readmePath, lines, []*sniInstance{node})
	rows := 0
	for _, line := range lines {
		if strings.HasPrefix(line, "| ") && !strings.HasPrefix(line, "| Instance") {
			rows++
		}
	}
	if rows != 1 {
		t.Errorf("%s: the port table has %d instances; want 1", readmePath, rows)
	}

	// The kubelet's kubeconfig must name that instance's proxy.
	kubeconfig, err := os.ReadFile(filepath.Join(sniDir, "kubelet-kubeconfig.yaml"))
	if err != nil {
		t.Fatalf("%v", err)
	}
	if want := "server: https://" + node.proxy(); !strings.Contains(string(kubeconfig), want) {
		t.Errorf("kubelet-kubeconfig.yaml has no %q: the kubelet must use the node-level instance", want)
	}
}

// checkPortTable checks the README's table of the instances' listeners: a
// row per instance, found by its settings file, whose Proxy and Health
// columns are where that instance listens.
func checkPortTable(t *testing.T, path string, lines []string, instances []*sniInstance) {
	t.Helper()
	proxyCol, healthCol := -1, -1
	rows := map[*sniInstance][]string{}
	for _, line := range lines {
		if !strings.HasPrefix(line, "|") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cells {
			cells[i] = strings.Trim(strings.TrimSpace(cells[i]), "`")
		}
		if proxyCol < 0 {
			proxyCol, healthCol = slices.Index(cells, "Proxy"), slices.Index(cells, "Health")
			continue
		}
		for _, in := range instances {
			if slices.Contains(cells, in.settings) {
				rows[in] = cells
			}
		}
	}
	if proxyCol < 0 || healthCol < 0 {
		t.Errorf("%s has no table with Proxy and Health columns", path)
		return
	}
	for _, in := range instances {
		row := rows[in]
		if row == nil || len(row) <= max(proxyCol, healthCol) {
			t.Errorf("%s: the port table has no row for the %s (%s)", path, in.name, in.settings)
			continue
		}
		if row[proxyCol] != in.proxy() || row[healthCol] != in.health() {
			t.Errorf("%s: the port table has the %s on %s and %s; %s sets %s and %s", path, in.name, row[proxyCol], row[healthCol], in.settings, in.proxy(), in.health())
		}
	}
}

// nodeFilesNotHere are the warnings check gives for the node's files,
// which are not here: a kubeconfig and a readyz CA under /etc/kubernetes.
var nodeFilesNotHere = []string{
	"warning: --kubeconfig (EP_KUBECONFIG) has no effect: it does not load here",
	"warning: a start here would stop: --health-check-ca-file (EP_HEALTH_CHECK_CA_FILE): readyz: read CA: open /etc/kubernetes/",
}

// TestExamplesPassCheck runs every example's settings, the static pods'
// arguments and variables as the kubelet gives them and the env files as
// systemd does, through check of the pinned release: it must accept them
// with no warning but that the node's files are not here.
func TestExamplesPassCheck(t *testing.T) {
	for name, ex := range examplesSettings(t) {
		args := []string{"check"}
		if ex.container != nil {
			if len(ex.container.Command) != 0 {
				t.Errorf("%s: command %v; want the image's entrypoint, the daemon", name, ex.container.Command)
			}
			args = append(args, ex.container.Args...)
		}
		var env []string
		for _, k := range slices.Sorted(maps.Keys(ex.env)) {
			env = append(env, k+"="+ex.env[k])
		}
		r := runDaemon(t, args, env)
		if r.exitCode != 0 || !strings.Contains(r.stdout, "extractedprism check: configuration is valid") {
			t.Errorf("%s: extractedprism %s: exit %d, stdout %q, stderr %q; want exit 0 and the configuration valid", name, strings.Join(args, " "), r.exitCode, r.stdout, r.stderr)
			continue
		}
		for line := range strings.SplitSeq(r.stdout, "\n") {
			if strings.HasPrefix(line, "warning:") && !slices.ContainsFunc(nodeFilesNotHere, func(p string) bool { return strings.HasPrefix(line, p) }) {
				t.Errorf("%s: extractedprism check warns: %s", name, line)
			}
		}
	}
}
