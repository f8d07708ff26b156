package test

// One set of recommended settings: the chart's defaults. The node-level
// examples (kubeadm and Talos static pods, the systemd unit) and the SNI
// example run the same, or say in recommendedExceptions why not; the
// figures their comments quote come from the daemon's own constants.

import (
	"fmt"
	"go/ast"
	"go/constant"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
)

// recommendedVariables are the daemon settings of the chart's defaults
// that every example must run: the checks, their timing, the drain, the
// rebalancing, the liveness heartbeat, selection, discovery, the log level
// and the addresses. The files a setting names (CA, credential, cache,
// socket) differ by distribution and are checked per example elsewhere.
var recommendedVariables = []string{
	"EP_HEALTH_CHECK", "EP_HEALTH_INTERVAL", "EP_HEALTH_TIMEOUT", "EP_DRAIN_TIMEOUT",
	"EP_REBALANCE_PERIOD", "EP_LIVENESS_INTERVAL", "EP_LIVENESS_THRESHOLD",
	"EP_UPSTREAM_SELECTION", "EP_ENABLE_DISCOVERY", "EP_LOG_LEVEL",
	"EP_BIND_ADDRESS", "EP_BIND_PORT", "EP_HEALTH_PORT",
}

// recommendedExceptions are the settings an example runs differently from
// the chart, each with the reason its files give too. Anything else that
// differs fails TestExamplesRunRecommendedSettings.
var recommendedExceptions = map[string]map[string]string{
	"sni": {
		"EP_ENABLE_DISCOVERY": "discovery would add the API servers' own addresses, behind the shared endpoint",
	},
}

// exampleSettings is what an example runs: its variables, and for a static
// pod its container (probes and resources).
type exampleSettings struct {
	env       map[string]string
	container *corev1.Container
}

// examplesSettings reads every example's settings.
func examplesSettings(t *testing.T) map[string]exampleSettings {
	t.Helper()
	kubeadm := &kubeadmPod(t).Spec.Containers[0]
	talos := talosPatch(t).Machine.Pods
	if len(talos) != 1 {
		t.Fatalf("%d static pods in %s; want 1", len(talos), talosPatchPath)
	}
	return map[string]exampleSettings{
		"kubeadm": {envValues(t, kubeadm), kubeadm},
		"talos":   {envValues(t, &talos[0].Spec.Containers[0]), &talos[0].Spec.Containers[0]},
		"systemd": {envFile(t, filepath.Join(systemdDir, "extractedprism.env")), nil},
		"sni":     {envFile(t, filepath.Join(sniDir, "extractedprism.env")), nil},
	}
}

// daemonDefaults returns the default of every EP_* variable, as the daemon
// of the pinned release prints them in its usage.
func daemonDefaults(t *testing.T) map[string]string {
	t.Helper()
	out, err := exec.Command(daemonBinary(t), "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("extractedprism --help: %v\n%s", err, out)
	}
	defaults := map[string]string{}
	line := regexp.MustCompile(`\((EP_[A-Z_]+)\) .*\(default ([^):]+)\)$`)
	for l := range strings.SplitSeq(string(out), "\n") {
		if m := line.FindStringSubmatch(strings.TrimSpace(l)); m != nil {
			defaults[m[1]] = m[2]
		}
	}
	if defaults["EP_HEALTH_INTERVAL"] == "" {
		t.Fatalf("no default of EP_HEALTH_INTERVAL in the usage:\n%s", out)
	}
	return defaults
}

// sameSetting compares two values of a variable; durations by their
// length, so that 1m and 60s agree.
func sameSetting(a, b string) bool {
	da, errA := time.ParseDuration(a)
	db, errB := time.ParseDuration(b)
	if errA == nil && errB == nil {
		return da == db
	}
	return a == b
}

// TestExamplesRunRecommendedSettings holds every example to the chart's
// default render: each recommended variable, the example's value or, left
// out, the daemon's default, and a static pod's probe timing and resources.
func TestExamplesRunRecommendedSettings(t *testing.T) {
	chart := container(t, render(t, withEndpoints(nil)))
	want := envValues(t, chart)
	defaults := daemonDefaults(t)
	for name, ex := range examplesSettings(t) {
		for _, v := range recommendedVariables {
			got, ok := ex.env[v]
			if !ok {
				got = defaults[v]
			}
			_, excepted := recommendedExceptions[name][v]
			if same := sameSetting(got, want[v]); same == excepted {
				t.Errorf("%s runs %s=%q, the chart %q; want the chart's value, or an exception with its reason in recommendedExceptions, and none where they agree", name, v, got, want[v])
			}
		}
		if ex.container != nil {
			checkRecommendedContainer(t, name, ex.container, chart)
		}
	}
}

// checkRecommendedContainer holds a static pod's probe timing and
// resources to the chart's.
func checkRecommendedContainer(t *testing.T, name string, c, chart *corev1.Container) {
	t.Helper()
	for _, p := range []struct {
		probe string
		got   *corev1.Probe
		want  *corev1.Probe
	}{{"liveness", c.LivenessProbe, chart.LivenessProbe}, {"readiness", c.ReadinessProbe, chart.ReadinessProbe}} {
		if p.got == nil || p.got.PeriodSeconds != p.want.PeriodSeconds || p.got.TimeoutSeconds != p.want.TimeoutSeconds || p.got.FailureThreshold != p.want.FailureThreshold {
			t.Errorf("%s: %s probe %+v; want the chart's period %d, timeout %d, threshold %d", name, p.probe, p.got, p.want.PeriodSeconds, p.want.TimeoutSeconds, p.want.FailureThreshold)
		}
	}
	if !equality.Semantic.DeepEqual(c.Resources, chart.Resources) {
		t.Errorf("%s: requests %s, limits %s; want the chart's %s and %s", name,
			quantities(c.Resources.Requests), quantities(c.Resources.Limits), quantities(chart.Resources.Requests), quantities(chart.Resources.Limits))
	}
}

// quantities prints a resource list as name=quantity pairs.
func quantities(list corev1.ResourceList) string {
	var out []string
	for name, q := range list {
		out = append(out, string(name)+"="+q.String())
	}
	slices.Sort(out)
	return "[" + strings.Join(out, " ") + "]"
}

// limitsConst returns an integer constant of the daemon's limits.go, which
// type-checks on its own (it imports nothing).
func limitsConst(t *testing.T, pkg *types.Package, name string) int64 {
	t.Helper()
	c, ok := pkg.Scope().Lookup(name).(*types.Const)
	if !ok {
		t.Fatalf("limits.go has no constant %s", name)
	}
	v, exact := constant.Int64Val(c.Val())
	if !exact {
		t.Fatalf("limits.go: %s = %s is not an int64", name, c.Val())
	}
	return v
}

// TestSizingFiguresMatchTheDaemon holds the connection bounds that the
// systemd unit, its README and the chart's values.yaml quote to what the
// pinned release's limits.go computes from the unit's LimitNOFILE= and
// MemoryMax= and the chart's memory limit.
func TestSizingFiguresMatchTheDaemon(t *testing.T) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, daemonSource(t, "limits.go"), nil, 0)
	if err != nil {
		t.Fatalf("%v", err)
	}
	pkg, err := (&types.Config{}).Check("main", fset, []*ast.File{f}, nil)
	if err != nil {
		t.Fatalf("type-check limits.go alone: %v", err)
	}
	fds, fdReserve := limitsConst(t, pkg, "fdsPerConn"), limitsConst(t, pkg, "fdReserve")
	perConn, memReserve := limitsConst(t, pkg, "memPerConn"), limitsConst(t, pkg, "memReserve")
	unit := unitSettings(t)
	nofile, err := strconv.ParseInt(unit["LimitNOFILE"], 10, 64)
	if err != nil {
		t.Fatalf("LimitNOFILE=%q: %v", unit["LimitNOFILE"], err)
	}
	memMax, err := resource.ParseQuantity(strings.TrimSuffix(unit["MemoryMax"], "M") + "Mi")
	if err != nil {
		t.Fatalf("MemoryMax=%q: %v", unit["MemoryMax"], err)
	}
	mib := func(n int64) string { return strconv.FormatFloat(float64(n)/(1<<20), 'f', -1, 64) }
	perConnMiB := fmt.Sprintf("%.2f MiB", float64(perConn)/(1<<20))
	byFiles, byMemory := (nofile-fdReserve)/fds, (memMax.Value()-memReserve)/perConn
	quotes := map[string][]string{
		filepath.Join(systemdDir, "extractedprism.service"): {
			fmt.Sprintf("%d descriptors", fds),
			fmt.Sprintf("(%d - %d) / %d = %s connections", nofile, fdReserve, fds, commas(byFiles)),
			fmt.Sprintf("%s MiB reserve: (%s MiB - %s MiB) / %s = %d connections", mib(memReserve), mib(memMax.Value()), mib(memReserve), perConnMiB, byMemory),
		},
		filepath.Join(systemdDir, "README.md"): {fmt.Sprintf("allow %s and %d connections", commas(byFiles), byMemory)},
		chartValuesPath:                        {fmt.Sprintf("(%d at 128Mi: %s each", (128<<20-memReserve)/perConn, perConnMiB)},
	}
	for path, want := range quotes {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v", err)
		}
		// Comment markers and line breaks aside.
		text := strings.Join(strings.Fields(strings.ReplaceAll(string(data), "\n#", "\n")), " ")
		for _, w := range want {
			if !strings.Contains(text, w) {
				t.Errorf("%s does not say %q, what limits.go computes", path, w)
			}
		}
	}
}

// commas writes n with thousands separators, as the documents do.
func commas(n int64) string {
	s := strconv.FormatInt(n, 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// TestTroubleshootingListsEveryEndReason holds the troubleshooting page's
// list of the end reasons of "connection closed" to the daemon's
// endNames (connlog.go), the reason label's values.
func TestTroubleshootingListsEveryEndReason(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(repoRoot, "connlog.go"), nil, 0)
	if err != nil {
		t.Fatalf("%v", err)
	}
	var names []string
	ast.Inspect(f, func(n ast.Node) bool {
		fn, ok := n.(*ast.FuncDecl)
		if !ok || fn.Name.Name != "endNames" {
			return true
		}
		ast.Inspect(fn.Body, func(n ast.Node) bool {
			if s, ok := n.(*ast.BasicLit); ok {
				if name, ok := stringLiteral(s); ok && name != "" {
					names = append(names, name)
				}
			}
			return true
		})
		return false
	})
	if len(names) < 5 {
		t.Fatalf("found %d end reasons in connlog.go's endNames; has it moved?", len(names))
	}
	page, err := os.ReadFile(filepath.Join(repoRoot, "docs", "troubleshooting.md"))
	if err != nil {
		t.Fatalf("%v", err)
	}
	text := strings.Join(strings.Fields(string(page)), " ")
	start := strings.Index(text, "and `end`, the reason: one of")
	end := strings.Index(text[max(start, 0):], ")")
	if start < 0 || end < 0 {
		t.Fatal("docs/troubleshooting.md no longer lists the end reasons after \"and `end`, the reason: one of\"")
	}
	list := text[start : start+end]
	for _, name := range names {
		if !strings.Contains(list, "`"+name+"`") {
			t.Errorf("docs/troubleshooting.md's list of end reasons lacks `%s`: %s", name, list)
		}
	}
}
