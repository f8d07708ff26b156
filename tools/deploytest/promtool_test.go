package test

// promtool, Prometheus's own checker, judges alerts.yaml: `check rules`
// parses every expression and template as Prometheus would, and `test
// rules` runs the cases in deploy/prometheus/alerts_test.yaml, which show
// each alert firing in the case it is for and silent beside it. Both skip
// where promtool is not installed, unless EP_PROMTOOL_REQUIRE=1 (as CI
// sets) makes that a failure.

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

var alertCasesPath = filepath.Join(repoRoot, "deploy", "prometheus", "alerts_test.yaml")

// promtoolRuleFile is the rule file alerts_test.yaml names; the tests write
// it beside their copy of that file.
const promtoolRuleFile = "extractedprism.rules.yaml"

// requirePromtool returns the path of promtool, skipping t when it is
// missing unless EP_PROMTOOL_REQUIRE=1.
func requirePromtool(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("EP_PROMTOOL_REQUIRE") == "1" {
			t.Fatalf("promtool is required (EP_PROMTOOL_REQUIRE=1): %v", err)
		}
		t.Skipf("promtool not installed (Debian and Ubuntu: the prometheus package), so alerts.yaml is not checked by Prometheus; EP_PROMTOOL_REQUIRE=1 makes this a failure: %v", err)
	}
	return path
}

// ruleGroups returns alerts.yaml's spec.groups, which are a plain
// Prometheus rule file's groups.
func ruleGroups(t *testing.T) []any {
	t.Helper()
	_, data := readAlerts(t)
	var obj struct {
		Spec struct {
			Groups []any `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(data, &obj); err != nil {
		t.Fatalf("%s: %v", alertsPath, err)
	}
	if len(obj.Spec.Groups) == 0 {
		t.Fatalf("%s: no spec.groups", alertsPath)
	}
	return obj.Spec.Groups
}

// eachRule calls f with every rule of groups, as a map to read or change.
func eachRule(t *testing.T, groups []any, f func(rule map[string]any)) {
	t.Helper()
	for _, g := range groups {
		group, ok := g.(map[string]any)
		if !ok {
			t.Fatalf("%s: group %v is not a mapping", alertsPath, g)
		}
		rules, _ := group["rules"].([]any)
		for _, r := range rules {
			rule, ok := r.(map[string]any)
			if !ok {
				t.Fatalf("%s: rule %v is not a mapping", alertsPath, r)
			}
			f(rule)
		}
	}
}

// writeRuleFile writes groups as a Prometheus rule file in dir.
func writeRuleFile(t *testing.T, dir string, groups []any) string {
	t.Helper()
	data, err := yaml.Marshal(map[string]any{"groups": groups})
	if err != nil {
		t.Fatalf("%v", err)
	}
	path := filepath.Join(dir, promtoolRuleFile)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatalf("%v", err)
	}
	return path
}

// runPromtool runs promtool with args in dir and returns its output and
// whether it succeeded.
func runPromtool(t *testing.T, promtool, dir string, args ...string) (string, bool) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), promtool, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("promtool %s: %v", strings.Join(args, " "), err)
	}
	return string(out), err == nil
}

// TestObservabilityPromtoolCheckRules runs promtool check rules over
// spec.groups, and shows it refuses an expression Prometheus cannot parse.
func TestObservabilityPromtoolCheckRules(t *testing.T) {
	promtool := requirePromtool(t)
	dir := t.TempDir()
	path := writeRuleFile(t, dir, ruleGroups(t))
	if out, ok := runPromtool(t, promtool, dir, "check", "rules", path); !ok {
		t.Errorf("promtool check rules %s:\n%s", alertsPath, out)
	}

	broken := ruleGroups(t)
	eachRule(t, broken, func(rule map[string]any) { rule["expr"] = "sum by (upstream (extractedprism_upstreams_active)" })
	path = writeRuleFile(t, dir, broken)
	if out, ok := runPromtool(t, promtool, dir, "check", "rules", path); ok {
		t.Errorf("promtool check rules passed unbalanced parentheses; want a failure:\n%s", out)
	}
}

// casesDir writes groups, reduced to what the cases compare, and a copy of
// alerts_test.yaml to a new directory, and returns it.
func casesDir(t *testing.T, groups []any) string {
	t.Helper()
	// The cases compare labels and summaries; the descriptions and runbook
	// links are prose, which the cases would otherwise have to repeat.
	eachRule(t, groups, func(rule map[string]any) {
		if annotations, ok := rule["annotations"].(map[string]any); ok {
			rule["annotations"] = map[string]any{"summary": annotations["summary"]}
		}
	})
	dir := t.TempDir()
	writeRuleFile(t, dir, groups)
	data, err := os.ReadFile(alertCasesPath)
	if err != nil {
		t.Fatalf("%v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, filepath.Base(alertCasesPath)), data, 0o600); err != nil {
		t.Fatalf("%v", err)
	}
	return dir
}

// TestObservabilityPromtoolTestRules runs alerts_test.yaml's cases against
// the rules, and shows that a rule which stops firing fails them.
func TestObservabilityPromtoolTestRules(t *testing.T) {
	promtool := requirePromtool(t)
	cases := filepath.Base(alertCasesPath)
	if out, ok := runPromtool(t, promtool, casesDir(t, ruleGroups(t)), "test", "rules", cases); !ok {
		t.Errorf("promtool test rules %s:\n%s", alertCasesPath, out)
	}

	silenced := ruleGroups(t)
	eachRule(t, silenced, func(rule map[string]any) {
		if rule["alert"] == "ExtractedprismNoUpstreamReady" {
			rule["expr"] = "vector(0) > 1"
		}
	})
	if out, ok := runPromtool(t, promtool, casesDir(t, silenced), "test", "rules", cases); ok {
		t.Errorf("promtool test rules passed with ExtractedprismNoUpstreamReady never firing; want a failure:\n%s", out)
	}
}

// alertCases is the part of a promtool test file the coverage test reads.
type alertCases struct {
	RuleFiles []string `json:"rule_files"`
	Tests     []struct {
		AlertRuleTest []struct {
			EvalTime  string `json:"eval_time"`
			Alertname string `json:"alertname"`
			ExpAlerts []any  `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

// TestObservabilityAlertCasesCoverEveryAlert needs no promtool: every alert
// of alerts.yaml has a case in which it fires, and every case names an
// alert that exists. promtool passes a case that expects nothing of an
// alert that is not there, so a renamed alert would leave its silent cases
// passing without a word.
func TestObservabilityAlertCasesCoverEveryAlert(t *testing.T) {
	data, err := os.ReadFile(alertCasesPath)
	if err != nil {
		t.Fatalf("%v", err)
	}
	var cases alertCases
	if err := yaml.Unmarshal(data, &cases); err != nil {
		t.Fatalf("%s: %v", alertCasesPath, err)
	}
	if !slices.Equal(cases.RuleFiles, []string{promtoolRuleFile}) {
		t.Errorf("%s: rule_files %q; want [%s], the file the tests write", alertCasesPath, cases.RuleFiles, promtoolRuleFile)
	}
	var alerts []string
	eachRule(t, ruleGroups(t), func(rule map[string]any) {
		if name, ok := rule["alert"].(string); ok {
			alerts = append(alerts, name)
		}
	})
	fires := map[string]bool{}
	for _, tc := range cases.Tests {
		for _, art := range tc.AlertRuleTest {
			if !slices.Contains(alerts, art.Alertname) {
				t.Errorf("%s: a case at %s names %q, which is not an alert of %s", alertCasesPath, art.EvalTime, art.Alertname, alertsPath)
			}
			fires[art.Alertname] = fires[art.Alertname] || len(art.ExpAlerts) > 0
		}
	}
	for _, name := range alerts {
		if !fires[name] {
			t.Errorf("%s: no case in which %s fires", alertCasesPath, name)
		}
	}
}
