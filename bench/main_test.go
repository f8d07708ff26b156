package main

import (
	"slices"
	"strings"
	"testing"
)

func TestParseFlagsSystems(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want []string
		alt  map[string]string
	}{
		{"default", nil, []string{sysDirect, sysHAProxy, sysNginx, sysEP, sysGoCopy}, map[string]string{}},
		{"baseline runs after extractedprism", []string{"-ep-alt", "baseline=/b"},
			[]string{sysDirect, sysHAProxy, sysNginx, sysEP, sysBaseline, sysGoCopy}, map[string]string{"baseline": "/b"}},
		{"repeated and listed, in order", []string{"-ep-alt", "baseline=/b", "-ep-alt", "x=/x,y=/y"},
			[]string{sysDirect, sysHAProxy, sysNginx, sysEP, sysBaseline, "x", "y", sysGoCopy}, map[string]string{"baseline": "/b", "x": "/x", "y": "/y"}},
		{"-systems decides", []string{"-ep-alt", "baseline=/b", "-systems", "baseline,extractedprism"},
			[]string{sysBaseline, sysEP}, map[string]string{"baseline": "/b"}},
		{"without extractedprism, at the end", []string{"-ep-alt", "baseline=/b", "-systems", "haproxy"},
			[]string{sysHAProxy}, map[string]string{"baseline": "/b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseFlags(append([]string{"-ep", "/ep"}, tt.args...))
			if err != nil {
				t.Fatalf("parseFlags: %v", err)
			}
			if !slices.Equal(c.systems, tt.want) {
				t.Errorf("systems: got %v; want %v", c.systems, tt.want)
			}
			if len(c.alt) != len(tt.alt) {
				t.Errorf("alt: got %v; want %v", c.alt, tt.alt)
			}
			for k, v := range tt.alt {
				if c.alt[k] != v {
					t.Errorf("alt: got %v; want %v", c.alt, tt.alt)
				}
			}
		})
	}
}

func TestWithAltsWithoutExtractedprism(t *testing.T) {
	got := withAlts([]string{sysHAProxy, sysNginx}, []string{sysBaseline})
	if want := []string{sysHAProxy, sysNginx, sysBaseline}; !slices.Equal(got, want) {
		t.Errorf("got %v; want %v", got, want)
	}
}

func TestParseFlagsRefuses(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string // in the error
	}{
		{"no -ep", []string{"-systems", "haproxy"}, "-ep is required"},
		{"unknown system", []string{"-ep", "/ep", "-systems", "haproxy,baseline"}, `"baseline" is neither`},
		{"-ep-alt without a path", []string{"-ep", "/ep", "-ep-alt", "baseline"}, "want NAME=PATH"},
		{"-ep-alt named like a built-in system", []string{"-ep", "/ep", "-ep-alt", "haproxy=/h"}, "built-in system"},
		{"kill after the end", []string{"-ep", "/ep", "-failover-kill-at", "20s"}, "-failover-kill-at"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseFlags(tt.args)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v; want an error with %q", err, tt.want)
			}
		})
	}
}
