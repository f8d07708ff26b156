package main

import "testing"

func TestMetricValue(t *testing.T) {
	const exposition = `# HELP extractedprism_connection_limit Most client connections proxied at once.
# TYPE extractedprism_connection_limit gauge
extractedprism_connection_limit_other 7
extractedprism_connection_limit 3290
extractedprism_upstream_connections{upstream="127.0.0.1:1"} 0
`
	tests := []struct {
		name string
		want float64
		ok   bool
	}{
		{"extractedprism_connection_limit", 3290, true},
		{"extractedprism_connection", 0, false},
		{"extractedprism_upstream_connections", 0, false}, // labelled: not a bare series
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := metricValue([]byte(exposition), tt.name)
			if (err == nil) != tt.ok || got != tt.want {
				t.Errorf("got %v, %v; want %v, ok %v", got, err, tt.want, tt.ok)
			}
		})
	}
}
