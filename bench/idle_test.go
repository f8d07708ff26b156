package main

import "testing"

func TestIdleCount(t *testing.T) {
	all := []string{sysHAProxy, sysNginx, sysEP, sysBaseline}
	tests := []struct {
		name    string
		want    int
		nofile  int
		systems []string
		probes  []idleProbe
		got     int
		why     string // "" when nothing is below want
	}{
		{"fits", 2000, 20000, all, []idleProbe{{sysEP, 3290, 6}, {sysBaseline, 4936, 2}}, 2000, ""},
		{"this process", 10000, 20000, []string{sysGoCopy}, nil, 9900,
			"this process holds both ends of each connection under an open-files limit of 20,000"},
		// efbac2d: counts 4 per connection, holds 2.
		{"today's build's limit", 10000, 20000, all, []idleProbe{{sysBaseline, 4936, 2}}, 4886,
			"baseline's connection limit of 4,936"},
		// io.Copy: 2 sockets and 2 pipes (4 ends), counted as such.
		{"six descriptors counted", 10000, 20000, all, []idleProbe{{sysEP, 3290, 6}, {sysBaseline, 4936, 2}}, 3240,
			"extractedprism's connection limit of 3,290"},
		// A build that counts 4 but holds 6 would run out of descriptors
		// before its limit: the measured descriptors decide.
		{"six held, four counted", 10000, 20000, all, []idleProbe{{sysEP, 4936, 6}}, 3240,
			"extractedprism holds 6.00 descriptors per idle connection under an open-files limit of 20,000"},
		{"no connection_limit metric", 10000, 20000, []string{sysBaseline}, []idleProbe{{sysBaseline, 0, 6}}, 3240,
			"baseline holds 6.00 descriptors per idle connection under an open-files limit of 20,000"},
		{"HAProxy's maxconn", 200000, 1 << 20, []string{sysHAProxy}, nil, 100000, "HAProxy's maxconn"},
		{"nginx's worker_connections", 50000, 1 << 20, []string{sysNginx}, nil, 32768,
			"nginx's worker_connections, two a proxied connection"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bd := tightest(tt.want, idleBounds(tt.nofile, tt.systems, tt.probes))
			if bd.n != tt.got || bd.why != tt.why {
				t.Errorf("got %d (%q); want %d (%q)", bd.n, bd.why, tt.got, tt.why)
			}
		})
	}
}

func TestIdleCountFitsTheDescriptors(t *testing.T) {
	// Whatever a build holds per idle connection, what the run opens must
	// fit under the open-files limit with the build's reserve to spare.
	for _, fdsPer := range []float64{2, 4, 6, 8, 10} {
		const nofile = 20000
		bd := tightest(1<<20, idleBounds(nofile, []string{sysEP}, []idleProbe{{sysEP, 0, fdsPer}}))
		if used := float64(bd.n) * fdsPer; used > nofile-epReserve {
			t.Errorf("%.0f descriptors per connection: %d connections use %.0f descriptors; want at most %d", fdsPer, bd.n, used, nofile-epReserve)
		}
	}
}
