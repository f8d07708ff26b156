package test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// renderNotes returns the chart's NOTES.txt as helm install would print it
// for values. helm template does not render notes, so the test renders a
// copy of the chart with one more template: a ConfigMap whose data is the
// notes passed through tpl, in the chart's own context.
func renderNotes(t *testing.T, values map[string]any) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "extractedprism")
	if err := os.CopyFS(dir, os.DirFS(chartDir)); err != nil {
		t.Fatalf("copy chart: %v", err)
	}
	notes, err := os.ReadFile(filepath.Join(chartDir, "templates", "NOTES.txt"))
	if err != nil {
		t.Fatalf("read notes: %v", err)
	}
	const wrapper = `apiVersion: v1
kind: ConfigMap
metadata:
  name: notes-under-test
data:
  notes: {{ tpl (.Files.Get "notes-under-test.txt") . | quote }}
`
	writeFile(t, filepath.Join(dir, "notes-under-test.txt"), notes)
	writeFile(t, filepath.Join(dir, "templates", "notes-under-test.yaml"), []byte(wrapper))
	args := []string{"template", releaseName, dir, "--namespace", releaseNamespace,
		"--values", valuesFile(t, values), "--show-only", "templates/notes-under-test.yaml"}
	out, err := runHelm(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal([]byte(out), &cm); err != nil {
		t.Fatalf("decode rendered notes: %v\n%s", err, out)
	}
	return cm.Data["notes"]
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestNotesAddresses checks the addresses the install notes tell the
// operator to use: a wildcard listener is reached on loopback, and IPv6
// addresses are bracketed wherever a port follows.
func TestNotesAddresses(t *testing.T) {
	cases := []struct {
		name   string
		values map[string]any
		want   []string
	}{
		{"default", nil, []string{
			"listening on 127.0.0.1:7445.",
			"at\nhttps://127.0.0.1:7445 with",
			"curl -s http://127.0.0.1:7446/metrics   (on the node)",
		}},
		{"IPv4 wildcard", map[string]any{"bindAddress": "0.0.0.0"}, []string{
			"listening on 0.0.0.0:7445.",
			"at\nhttps://127.0.0.1:7445 with",
			"curl -s http://127.0.0.1:7446/metrics",
		}},
		{"IPv6 wildcard", map[string]any{"bindAddress": "::"}, []string{
			"listening on [::]:7445.",
			"at\nhttps://[::1]:7445 with",
			"curl -s http://[::1]:7446/metrics",
		}},
		{"IPv6 loopback and health elsewhere", map[string]any{"bindAddress": "::1", "bindPort": 6443, "healthBindAddress": "0.0.0.0", "healthPort": 9000}, []string{
			"listening on [::1]:6443.",
			"at\nhttps://[::1]:6443 with",
			"curl -s http://127.0.0.1:9000/metrics",
		}},
		{"metrics exposed", map[string]any{"bindAddress": "::", "healthBindAddress": "", "metrics": map[string]any{"expose": true}, "handover": map[string]any{"surge": false}}, []string{
			"at\nhttps://[::1]:7445 with",
			"curl -s http://<node-ip>:7446/metrics\n",
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			notes := renderNotes(t, withEndpoints(tc.values))
			for _, w := range tc.want {
				if !strings.Contains(notes, w) {
					t.Errorf("notes lack %q:\n%s", w, notes)
				}
			}
			if strings.Contains(notes, "[::]:7445 with") || strings.Contains(notes, "https://0.0.0.0") {
				t.Errorf("notes send clients to a wildcard address:\n%s", notes)
			}
		})
	}
}
