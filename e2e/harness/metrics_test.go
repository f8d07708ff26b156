package harness

import (
	"testing"
	"time"
)

func TestParseMetrics(t *testing.T) {
	text := `# HELP extractedprism_upstreams_total Total known upstreams.
# TYPE extractedprism_upstreams_total gauge
extractedprism_upstreams_total 3
extractedprism_discovery_updates_total{provider="kubernetes"} 2
extractedprism_health_check_status{upstream="192.0.2.11:6443"} 1
odd{a="x\"y",b="z"} 1.5e+00
broken{a="x" 1
`
	s := ParseMetrics(text)
	tests := []struct {
		name   string
		labels []string
		want   float64
		ok     bool
	}{
		{"extractedprism_upstreams_total", nil, 3, true},
		{"extractedprism_discovery_updates_total", []string{"provider", "kubernetes"}, 2, true},
		{"extractedprism_discovery_updates_total", []string{"provider", "static"}, 0, false},
		{"extractedprism_health_check_status", []string{"upstream", "192.0.2.11:6443"}, 1, true},
		{"odd", []string{"a", `x"y`, "b", "z"}, 1.5, true},
		{"broken", nil, 0, false},
	}
	for _, tt := range tests {
		got, ok := s.Get(tt.name, tt.labels...)
		if got != tt.want || ok != tt.ok {
			t.Errorf("Get(%s, %v) = %v, %v; want %v, %v", tt.name, tt.labels, got, ok, tt.want, tt.ok)
		}
	}
}

func TestSum(t *testing.T) {
	s := ParseMetrics(`extractedprism_upstream_ready{upstream="192.0.2.11:6443"} 1
extractedprism_upstream_ready{upstream="192.0.2.12:6443"} 0
extractedprism_upstream_ready{upstream="192.0.2.13:6443"} 1
extractedprism_upstreams_total 3
`)
	if got := s.Sum("extractedprism_upstream_ready"); got != 2 {
		t.Errorf("Sum = %v; want 2", got)
	}
	if got := s.Sum("missing"); got != 0 {
		t.Errorf("Sum of a missing metric = %v; want 0", got)
	}
	closed := ParseMetrics(`extractedprism_connections_closed_total{reason="rebalance",upstream="192.0.2.11:6443"} 2
extractedprism_connections_closed_total{reason="drain",upstream="192.0.2.11:6443"} 5
extractedprism_connections_closed_total{reason="rebalance",upstream="192.0.2.12:6443"} 3
`)
	if got := closed.Sum("extractedprism_connections_closed_total", "reason", "rebalance"); got != 5 {
		t.Errorf("Sum with reason=rebalance = %v; want 5", got)
	}
}

func TestHexAddr(t *testing.T) {
	ip, port, ok := hexAddr("0B0200C0:192B")
	if !ok || ip != "192.0.2.11" || port != 6443 {
		t.Errorf("hexAddr = %s, %d, %v; want 192.0.2.11, 6443, true", ip, port, ok)
	}
}

func TestMeasureGapsAndRecovery(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	w := &Workload{
		shorts: []ShortResult{
			{Start: at(1), Dur: 10 * time.Millisecond},
			{Start: at(2), Dur: 20 * time.Millisecond},
			{Start: at(11), Dur: 2 * time.Second, Err: "boom"},
			{Start: at(20), Dur: 30 * time.Millisecond},
		},
		writes: []WriteResult{
			{Name: "a", Done: at(1)},
			{Name: "b", Done: at(12)},
			{Name: "c", Start: at(8), Done: at(13), Err: "timeout"},
			{Name: "d", Done: at(14)},
			{Name: "e", Start: at(16), Done: at(16.1), Err: "reset"},
		},
		watchers: []*Watcher{{ID: 0, seen: map[string]time.Time{"a": at(1.1), "b": at(22), "d": at(22)}}},
	}
	m := w.Measure(at(10), at(15), at(30))
	if m.Quorum.Total != 0 {
		t.Errorf("quorum reads = %+v; want none", m.Quorum)
	}
	if m.Shorts.Total != 4 || m.Shorts.Failed != 1 || m.Shorts.FailedLate != 0 {
		t.Errorf("shorts = %+v; want 4 total, 1 failed, 0 late", m.Shorts)
	}
	if m.Shorts.Max != 30*time.Millisecond {
		t.Errorf("max latency %s; want 30ms (failed requests excluded)", m.Shorts.Max)
	}
	if m.Writes.Failed != 2 || m.Writes.FailedLate != 1 {
		t.Errorf("writes = %+v; want 2 failed, 1 late (started after 15 s)", m.Writes)
	}
	if g := m.Watchers[0].MaxGap; g != 10*time.Second {
		t.Errorf("gap %s; want 10s (b written at 12 s, seen at 22 s)", g)
	}
	if m.Recovery != 12*time.Second {
		t.Errorf("recovery %s; want 12s (the late delivery at 22 s)", m.Recovery)
	}
	// A quorum read that hung until its timeout ends the recovery later;
	// one that failed before the fault does not count.
	w.quorums = []ShortResult{
		{Start: at(9), Dur: 100 * time.Millisecond, Err: "status 500"},
		{Start: at(16), Dur: 10 * time.Second, Err: "timeout"},
		{Start: at(17), Dur: 40 * time.Millisecond},
	}
	m = w.Measure(at(10), at(15), at(30))
	if m.Quorum.Total != 3 || m.Quorum.Failed != 2 || m.Quorum.FailedLate != 1 || m.Quorum.Max != 40*time.Millisecond {
		t.Errorf("quorum reads = %+v; want 3 total, 2 failed, 1 late, max 40ms", m.Quorum)
	}
	if m.Shorts.Total != 4 || m.Shorts.Failed != 1 {
		t.Errorf("shorts = %+v; want them apart from the quorum reads (4 total, 1 failed)", m.Shorts)
	}
	if m.Recovery != 16*time.Second {
		t.Errorf("recovery %s; want 16s (the quorum read that ended at 26 s)", m.Recovery)
	}
	if m := w.Measure(time.Time{}, time.Time{}, at(30)); m.Recovery != -1 {
		t.Errorf("recovery without a fault %s; want -1", m.Recovery)
	}
}
