package harness

import (
	"os"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/extractedprism/extractedprism/e2e/pki"
)

// TestChartSettings holds the chart-defaults rows to the chart: if
// values.yaml changes a default, the rows must follow.
func TestChartSettings(t *testing.T) {
	b, err := os.ReadFile("../../charts/extractedprism/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		HealthInterval    string `json:"healthInterval"`
		HealthTimeout     string `json:"healthTimeout"`
		DrainTimeout      string `json:"drainTimeout"`
		RebalancePeriod   string `json:"rebalancePeriod"`
		HealthCheck       string `json:"healthCheck"`
		UpstreamSelection string `json:"upstreamSelection"`
		Readyz            struct {
			ServerName  string `json:"serverName"`
			Credentials string `json:"credentials"`
		} `json:"readyz"`
	}
	if err := yaml.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	dur := func(s string) time.Duration {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("values.yaml: %v", err)
		}
		return d
	}
	got := Settings{HealthInterval: dur(v.HealthInterval), HealthTimeout: dur(v.HealthTimeout), DrainTimeout: dur(v.DrainTimeout),
		RebalancePeriod: dur(v.RebalancePeriod)}
	if got != ChartSettings {
		t.Errorf("values.yaml timing %+v; ChartSettings %+v", got, ChartSettings)
	}
	if v.HealthCheck != chartDefaults.HealthCheck || v.UpstreamSelection != chartDefaults.Selection {
		t.Errorf("values.yaml healthCheck %q, upstreamSelection %q; chartDefaults %+v", v.HealthCheck, v.UpstreamSelection, chartDefaults)
	}
	if v.Readyz.ServerName != pki.ServiceName || v.Readyz.Credentials != "serviceAccountToken" {
		t.Errorf("values.yaml readyz %+v; the rows use server name %s and a service-account token", v.Readyz, pki.ServiceName)
	}
}
