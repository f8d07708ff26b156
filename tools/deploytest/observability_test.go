package test

// The alerting rules in deploy/prometheus/alerts.yaml. The daemon's module
// checks that their expressions name real metrics; this one checks their
// shape as a PrometheusRule, and lets a real API server judge the object
// against a stand-in for the Prometheus Operator's CRD.

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"text/template"
	"time"
	"unicode"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"
)

var alertsPath = filepath.Join(repoRoot, "deploy", "prometheus", "alerts.yaml")

// ruleFile is the part of a PrometheusRule the tests read.
type ruleFile struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Spec struct {
		Groups []struct {
			Name  string      `json:"name"`
			Rules []alertRule `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}

type alertRule struct {
	Alert  string `json:"alert"`
	Expr   string `json:"expr"`
	For    string `json:"for"`
	Labels struct {
		Severity string `json:"severity"`
	} `json:"labels"`
	Annotations struct {
		Summary     string `json:"summary"`
		Description string `json:"description"`
		RunbookURL  string `json:"runbook_url"`
	} `json:"annotations"`
}

func readAlerts(t *testing.T) (ruleFile, []byte) {
	t.Helper()
	data, err := os.ReadFile(alertsPath)
	if err != nil {
		t.Fatalf("%v", err)
	}
	var rf ruleFile
	if err := yaml.Unmarshal(data, &rf); err != nil {
		t.Fatalf("%s: %v", alertsPath, err)
	}
	return rf, data
}

// promDuration is the duration syntax of Prometheus (and of the operator's
// CRD): units from largest to smallest, each at most once, integers only.
var promDuration = regexp.MustCompile(`^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$`)

// promDurationUnits are the units of promDuration's groups, in order.
var promDurationUnits = []time.Duration{
	365 * 24 * time.Hour, 7 * 24 * time.Hour, 24 * time.Hour,
	time.Hour, time.Minute, time.Second, time.Millisecond,
}

// parsePromDuration parses s the way Prometheus does, "0" included.
func parsePromDuration(s string) (time.Duration, error) {
	if s == "0" {
		return 0, nil
	}
	m := promDuration.FindStringSubmatch(s)
	if s == "" || m == nil {
		return 0, fmt.Errorf("%q is not a Prometheus duration", s)
	}
	var d time.Duration
	for i, unit := range promDurationUnits {
		if m[i+1] == "" {
			continue
		}
		n, err := strconv.ParseInt(m[i+1], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%q: %w", s, err)
		}
		d += time.Duration(n) * unit
	}
	return d, nil
}

func TestObservabilityPromDuration(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration // -1: invalid
	}{
		{"1m", time.Minute},
		{"90s", 90 * time.Second},
		{"1h30m", 90 * time.Minute},
		{"1d", 24 * time.Hour},
		{"500ms", 500 * time.Millisecond},
		{"0", 0},
		{"", -1},
		{"1.5m", -1},
		{"1m1h", -1}, // units out of order
		{"5 m", -1},
		{"10M", -1},
		{"-1m", -1},
	}
	for _, tt := range tests {
		got, err := parsePromDuration(tt.in)
		switch {
		case tt.want < 0 && err == nil:
			t.Errorf("parsePromDuration(%q) = %v; want an error", tt.in, got)
		case tt.want >= 0 && (err != nil || got != tt.want):
			t.Errorf("parsePromDuration(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

// wantAlerts are the alerts asked for, with the severity and pending time
// each was given.
var wantAlerts = map[string]struct {
	severity string
	pending  time.Duration
}{
	"ExtractedprismNoUsableUpstream":              {"critical", time.Minute},
	"ExtractedprismClientsRefused":                {"warning", 5 * time.Minute},
	"ExtractedprismNoUpstreamReady":               {"warning", 10 * time.Minute},
	"ExtractedprismAPIServerUnreachable":          {"warning", 10 * time.Minute},
	"ExtractedprismAPIServerUnreachableFromNode":  {"info", 30 * time.Minute},
	"ExtractedprismAPIServerNotReady":             {"warning", 5 * time.Minute},
	"ExtractedprismAPIServerFlapping":             {"warning", 5 * time.Minute},
	"ExtractedprismNearConnectionLimit":           {"warning", 5 * time.Minute},
	"ExtractedprismDiscoveryFailing":              {"warning", 10 * time.Minute},
	"ExtractedprismDiscoveryNotRunning":           {"warning", 5 * time.Minute},
	"ExtractedprismHealthServerAtConnectionLimit": {"warning", 10 * time.Minute},
	"ExtractedprismScrapeFailing":                 {"warning", 5 * time.Minute},
}

// alertTemplateFuncs stand in for the Prometheus template functions an
// annotation may call, so a template that parses here parses there. Add
// one here before using it in alerts.yaml.
var alertTemplateFuncs = template.FuncMap{
	"humanize":           func(v any) string { return fmt.Sprint(v) },
	"humanizeDuration":   func(v any) string { return fmt.Sprint(v) },
	"humanizePercentage": func(v any) string { return fmt.Sprint(v) },
	"toUpper":            strings.ToUpper,
	"toLower":            strings.ToLower,
}

// checkAlertTemplate parses and runs text as Prometheus runs annotation
// templates: with $labels and $value defined in front of it. It runs it
// twice, with and without the node label, which a scrape without the
// chart's PodMonitor lacks.
func checkAlertTemplate(text string) error {
	const defs = "{{$labels := .Labels}}{{$externalLabels := .ExternalLabels}}{{$value := .Value}}"
	tmpl, err := template.New("annotation").Funcs(alertTemplateFuncs).Parse(defs + text)
	if err != nil {
		return err
	}
	for _, node := range []string{"w1", ""} {
		data := struct {
			Labels, ExternalLabels map[string]string
			Value                  float64
		}{
			Labels: map[string]string{"instance": "192.0.2.21:7446", "job": "extractedprism", "upstream": "192.0.2.11:6443"},
			Value:  5,
		}
		if node != "" {
			data.Labels["node"] = node
		}
		if err := tmpl.Execute(io.Discard, data); err != nil {
			return err
		}
	}
	return nil
}

func TestObservabilityAlertRules(t *testing.T) {
	rf, _ := readAlerts(t)
	if rf.APIVersion != "monitoring.coreos.com/v1" || rf.Kind != "PrometheusRule" || rf.Metadata.Name != "extractedprism" {
		t.Errorf("got %s %s %q; want monitoring.coreos.com/v1 PrometheusRule \"extractedprism\"", rf.APIVersion, rf.Kind, rf.Metadata.Name)
	}
	if len(rf.Spec.Groups) == 0 {
		t.Fatal("spec.groups is empty")
	}
	anchors := runbookAnchors(t)
	groups := map[string]bool{}
	seen := map[string]bool{}
	for _, g := range rf.Spec.Groups {
		if g.Name == "" || groups[g.Name] {
			t.Errorf("group name %q empty or repeated", g.Name)
		}
		groups[g.Name] = true
		if len(g.Rules) == 0 {
			t.Errorf("group %s has no rules", g.Name)
		}
		for i, r := range g.Rules {
			where := fmt.Sprintf("group %s, rule %d (%s)", g.Name, i, r.Alert)
			if r.Alert == "" || seen[r.Alert] {
				t.Errorf("%s: alert name empty or repeated", where)
			}
			seen[r.Alert] = true
			if strings.TrimSpace(r.Expr) == "" {
				t.Errorf("%s: no expr", where)
			}
			pending, err := parsePromDuration(r.For)
			if err != nil || pending <= 0 {
				t.Errorf("%s: for %q: %v; want a positive Prometheus duration", where, r.For, err)
			}
			if !slices.Contains([]string{"critical", "warning", "info"}, r.Labels.Severity) {
				t.Errorf("%s: severity %q; want critical, warning or info", where, r.Labels.Severity)
			}
			if strings.TrimSpace(r.Annotations.Summary) == "" {
				t.Errorf("%s: no summary", where)
			}
			// A runbook in place: what the alert means, then what to check.
			if !strings.Contains(r.Annotations.Description, "What to check:") {
				t.Errorf("%s: description lacks a \"What to check:\" list", where)
			}
			if err := checkRunbookURL(r.Alert, r.Annotations.RunbookURL, anchors); err != nil {
				t.Errorf("%s: runbook_url: %v", where, err)
			}
			for name, text := range map[string]string{"summary": r.Annotations.Summary, "description": r.Annotations.Description} {
				if err := checkAlertTemplate(text); err != nil {
					t.Errorf("%s: %s template: %v", where, name, err)
				}
			}
			if want, ok := wantAlerts[r.Alert]; ok && (r.Labels.Severity != want.severity || pending != want.pending) {
				t.Errorf("%s: severity %s, for %v; want %s, %v", where, r.Labels.Severity, pending, want.severity, want.pending)
			}
		}
	}
	for name := range wantAlerts {
		if !seen[name] {
			t.Errorf("alert %s is missing", name)
		}
	}
}

// TestObservabilityAlertTemplateCheck shows that checkAlertTemplate fails
// the template mistakes it is there to catch.
func TestObservabilityAlertTemplateCheck(t *testing.T) {
	for _, tt := range []struct {
		text string
		ok   bool
	}{
		{`{{ $labels.upstream }} on {{ $labels.instance }}: {{ printf "%.0f" $value }}`, true},
		{`{{ or $labels.node $labels.instance }}: {{ $value | humanizePercentage }}`, true},
		// Without the node label, $labels.node is an invalid value, as in
		// Prometheus's expander (default missingkey): a function fails on it.
		{`{{ $labels.node | toUpper }}`, false},
		{`{{ $labels.upstream }`, false},
		{`{{ $lables.upstream }}`, false},
		{`{{ $value | humanise }}`, false},
	} {
		if err := checkAlertTemplate(tt.text); (err == nil) != tt.ok {
			t.Errorf("checkAlertTemplate(%q) = %v; want ok %v", tt.text, err, tt.ok)
		}
	}
}

// troubleshootingPath is the operator's page the alerts' runbook_url
// annotations lead to, one section per alert.
var troubleshootingPath = filepath.Join(repoRoot, "docs", "troubleshooting.md")

// runbookPrefix is where that page is published; an anchor follows.
const runbookPrefix = "https://github.com/extractedprism/extractedprism/blob/main/docs/troubleshooting.md#"

// githubAnchor returns the anchor GitHub gives a Markdown heading: lower
// case, each space a hyphen, every other character but letters, digits,
// hyphens and underscores dropped. (A repeated heading gets -1, -2...;
// runbookAnchors refuses those instead.)
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// markdownHeading matches an ATX heading line and captures its text.
var markdownHeading = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)

// markdownAnchors returns the anchors of the headings of a Markdown text,
// skipping fenced code blocks, and the anchors that occur twice.
func markdownAnchors(text string) (anchors map[string]bool, repeated []string) {
	anchors = map[string]bool{}
	fenced := false
	for line := range strings.SplitSeq(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		m := markdownHeading.FindStringSubmatch(line)
		if fenced || m == nil {
			continue
		}
		a := githubAnchor(m[1])
		if anchors[a] {
			repeated = append(repeated, a)
		}
		anchors[a] = true
	}
	return anchors, repeated
}

// runbookAnchors returns the anchors of troubleshooting.md's headings.
func runbookAnchors(t *testing.T) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(troubleshootingPath)
	if err != nil {
		t.Fatalf("%v", err)
	}
	anchors, repeated := markdownAnchors(string(data))
	if len(repeated) > 0 {
		t.Errorf("%s: headings repeated, so GitHub numbers their anchors: %q", troubleshootingPath, repeated)
	}
	return anchors
}

// checkRunbookURL says what is wrong with an alert's runbook_url: it must
// lead to the alert's own section, whose heading is the alert's name.
func checkRunbookURL(alert, url string, anchors map[string]bool) error {
	anchor, ok := strings.CutPrefix(url, runbookPrefix)
	switch {
	case !ok:
		return fmt.Errorf("%q does not start with %s", url, runbookPrefix)
	case anchor != githubAnchor(alert):
		return fmt.Errorf("anchor %q; want %q, the section headed %s", anchor, githubAnchor(alert), alert)
	case !anchors[anchor]:
		return fmt.Errorf("no heading of %s has the anchor %q", troubleshootingPath, anchor)
	}
	return nil
}

func TestObservabilityRunbookAnchors(t *testing.T) {
	for _, tt := range []struct{ heading, want string }{
		{"ExtractedprismNoUsableUpstream", "extractedprismnousableupstream"},
		{"Wrong CA: readyz fails, TCP passes", "wrong-ca-readyz-fails-tcp-passes"},
		{"Port clash (`bind: address already in use`)", "port-clash-bind-address-already-in-use"},
		{"open_files limit -- few connections", "open_files-limit----few-connections"},
	} {
		if got := githubAnchor(tt.heading); got != tt.want {
			t.Errorf("githubAnchor(%q) = %q; want %q", tt.heading, got, tt.want)
		}
	}

	const doc = "# Title\n\n## ExtractedprismA\n\n```sh\n# not a heading\n```\n### Twice ##\n## twice\n"
	anchors, repeated := markdownAnchors(doc)
	if want := []string{"twice"}; !slices.Equal(repeated, want) {
		t.Errorf("repeated anchors %q; want %q", repeated, want)
	}
	if anchors["not-a-heading"] {
		t.Error("a comment inside a code block was taken for a heading")
	}
	for _, tt := range []struct {
		alert, url string
		ok         bool
	}{
		{"ExtractedprismA", runbookPrefix + "extractedprisma", true},
		{"ExtractedprismA", "", false},
		{"ExtractedprismA", "https://example.com/troubleshooting.md#extractedprisma", false},
		{"ExtractedprismB", runbookPrefix + "extractedprismb", false}, // no such section
		{"ExtractedprismA", runbookPrefix + "title", false},           // another alert's, or none
	} {
		if err := checkRunbookURL(tt.alert, tt.url, anchors); (err == nil) != tt.ok {
			t.Errorf("checkRunbookURL(%q, %q) = %v; want ok %v", tt.alert, tt.url, err, tt.ok)
		}
	}
}

// prometheusRuleCRD stands in for the Prometheus Operator's PrometheusRule
// CRD. It declares the fields alerts.yaml sets, with the operator's names,
// types and duration pattern, and nothing else, so strict field validation
// rejects any other field. As in the operator's CRD, groups are a map keyed
// by name, so a repeated group name is rejected too.
const prometheusRuleCRD = `{
  "apiVersion": "apiextensions.k8s.io/v1",
  "kind": "CustomResourceDefinition",
  "metadata": {"name": "prometheusrules.monitoring.coreos.com"},
  "spec": {
    "group": "monitoring.coreos.com",
    "scope": "Namespaced",
    "names": {"kind": "PrometheusRule", "listKind": "PrometheusRuleList", "plural": "prometheusrules", "singular": "prometheusrule"},
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
            "properties": {
              "groups": {
                "type": "array",
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
                "items": {
                  "type": "object",
                  "required": ["name"],
                  "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "rules": {
                      "type": "array",
                      "items": {
                        "type": "object",
                        "required": ["expr"],
                        "properties": {
                          "alert": {"type": "string"},
                          "expr": {"x-kubernetes-int-or-string": true, "anyOf": [{"type": "integer"}, {"type": "string"}]},
                          "for": {"type": "string", "pattern": "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"},
                          "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                          "annotations": {"type": "object", "additionalProperties": {"type": "string"}}
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

// TestObservabilityAlertsAPIServer sends alerts.yaml, and the chart's
// PrometheusRule and dashboard ConfigMap, to a real kube-apiserver as a
// server-side apply dry run with strict field validation, against the
// stand-in CRD. Broken copies must be refused, so
// the stand-in is known to judge.
func TestObservabilityAlertsAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and kube-apiserver; skipped with -short")
	}
	apiserverBin, etcdBin := e2eBinaries(t)

	_, data := readAlerts(t)
	jsonData, err := yaml.YAMLToJSON(data)
	if err != nil {
		t.Fatalf("%s: %v", alertsPath, err)
	}
	rule := &unstructured.Unstructured{}
	if err := rule.UnmarshalJSON(jsonData); err != nil {
		t.Fatalf("%s: %v", alertsPath, err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg := startControlPlane(ctx, t, apiserverBin, etcdBin)
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("%v", err)
	}
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatalf("%v", err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disco))

	crd := &unstructured.Unstructured{}
	if err := crd.UnmarshalJSON([]byte(prometheusRuleCRD)); err != nil {
		t.Fatalf("%v", err)
	}
	if err := apply(ctx, dyn, mapper, crd, false); err != nil {
		t.Fatalf("%v", err)
	}
	gvk := schema.GroupVersionKind{Group: "monitoring.coreos.com", Version: "v1", Kind: "PrometheusRule"}
	waitFor(ctx, t, "PrometheusRule to be served", func() error {
		mapper.Reset()
		_, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		return err
	})

	if err := apply(ctx, dyn, mapper, rule, true); err != nil {
		t.Errorf("%s: %v", alertsPath, err)
	}
	// The chart's PrometheusRule and dashboard ConfigMap, made of the same
	// files.
	chart := renderObjects(t, monitoringValues(map[string]any{"fullnameOverride": "node-apiproxy"}))
	for _, kind := range []string{"PrometheusRule", "ConfigMap"} {
		if err := apply(ctx, dyn, mapper, chart[kind], true); err != nil {
			t.Errorf("the chart's %s: %v", kind, err)
		}
	}

	// Each change breaks spec.groups; firstRule is its first group's first rule.
	firstRule := func(groups []any) map[string]any {
		return groups[0].(map[string]any)["rules"].([]any)[0].(map[string]any)
	}
	broken := []struct {
		name    string
		change  func(groups []any) []any
		wantErr string // in the API server's answer
	}{
		{"for in words", func(g []any) []any { firstRule(g)["for"] = "1 minute"; return g }, "rules[0].for"},
		{"misspelt field", func(g []any) []any { firstRule(g)["annotation"] = map[string]any{"summary": "x"}; return g }, "annotation: field not declared"},
		{"no expr", func(g []any) []any { delete(firstRule(g), "expr"); return g }, "rules[0].expr: Required value"},
		{"repeated group name", func(g []any) []any { return append(g, g[0]) }, "duplicate entries"},
	}
	for _, tt := range broken {
		t.Run("refuses "+tt.name, func(t *testing.T) {
			obj := rule.DeepCopy()
			groups, _, err := unstructured.NestedSlice(obj.Object, "spec", "groups")
			if err != nil || len(groups) == 0 {
				t.Fatalf("spec.groups: %v", err)
			}
			groups = tt.change(groups)
			if err := unstructured.SetNestedSlice(obj.Object, groups, "spec", "groups"); err != nil {
				t.Fatalf("%v", err)
			}
			err = apply(ctx, dyn, mapper, obj, true)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("PrometheusRule with %s: got %v; want an error containing %q", tt.name, err, tt.wantErr)
			}
		})
	}
}
