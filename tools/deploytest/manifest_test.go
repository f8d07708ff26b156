package test

import (
	"flag"
	"os"
	"strconv"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite deploy/extractedprism.yaml from the chart instead of comparing")

// manifestHeader opens deploy/extractedprism.yaml; the rest of the file is
// exactly what helm template --no-hooks prints.
const manifestHeader = `# extractedprism as plain manifests: the Helm chart in charts/extractedprism
# rendered with its default values, release "extractedprism" in kube-system,
# and the example endpoints below (documentation addresses), without the
# chart's pre-install check (a Helm hook). Replace EP_ENDPOINTS with your
# API servers, check them as the daemon reads them, then apply:
#
#   extractedprism check --endpoints 10.0.0.1:6443,10.0.0.2:6443
#   kubectl apply -f deploy/extractedprism.yaml
#
# Generated; do not edit. A test renders the chart and compares; after a
# chart change, regenerate with:
#
#   cd tools/deploytest && go test -run TestPlainManifestInSync -update .
`

// plainManifest renders the chart the way deploy/extractedprism.yaml is
// made: without the check hook, a Job that kubectl apply could not update
// (a Job's pod template is immutable) and that would run beside the
// DaemonSet rather than before it.
func plainManifest(t *testing.T) string {
	t.Helper()
	out, err := renderYAML(t, map[string]any{"endpoints": exampleEndpoints}, "--no-hooks")
	if err != nil {
		t.Fatalf("%v", err)
	}
	return manifestHeader + out
}

func TestPlainManifestInSync(t *testing.T) {
	want := plainManifest(t)
	if *update {
		if err := os.WriteFile(manifestPath, []byte(want), 0o644); err != nil {
			t.Fatalf("%v", err)
		}
		return
	}
	got, err := os.ReadFile(manifestPath)
	if err != nil {
		t.Fatalf("%v", err)
	}
	if string(got) != want {
		t.Errorf("%s differs from the chart rendered with default values:\n%s\nregenerate with: cd tools/deploytest && go test -run TestPlainManifestInSync -update .",
			manifestPath, firstDifference(string(got), want))
	}
	// The file must also pass every check a chart render does, so an
	// edit that keeps it in sync cannot weaken it unnoticed.
	m := decodeManifest(t, string(got))
	checkInvariants(t, m)
	checkDiscoveryRBAC(t, m)
	checkNodeCritical(t, m.DaemonSet.Spec.Template.Spec)
	if m.CheckJob != nil {
		t.Errorf("%s carries the check hook's Job", manifestPath)
	}
}

// firstDifference describes the first line where got and want differ.
func firstDifference(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := 0; i < len(g) || i < len(w); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return "line " + strconv.Itoa(i+1) + ":\n  file:  " + gl + "\n  chart: " + wl
		}
	}
	return "(no line differs; line endings?)"
}
