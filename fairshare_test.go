package main

import (
	"slices"
	"testing"
	"time"
)

// TestShareVictim: the rule of fairshare.go on owners given by hand.
func TestShareVictim(t *testing.T) {
	type conn struct {
		owner string
		quiet time.Duration
		spoke bool
	}
	spoken := func(owner string, quiet time.Duration) conn { return conn{owner, quiet, true} }
	tests := []struct {
		name  string
		conns []conn
		want  int // index of the victim, -1 for none
	}{
		{"one slot each: all keep theirs", []conn{spoken("uid 1000", time.Hour), spoken("uid 1001", 0), spoken("10.0.0.5", 0)}, -1},
		{"root is never asked", []conn{spoken(rootOwner, time.Hour), spoken(rootOwner, time.Hour), spoken("uid 1000", 0)}, -1},
		{"the most slots gives its quietest", []conn{spoken("uid 65534", time.Second), spoken("uid 65534", 2*time.Second), spoken("uid 1000", time.Hour), spoken("uid 1000", time.Hour), spoken("uid 65534", 0)}, 1},
		{"a never-spoken one before a quieter spoken one", []conn{spoken("uid 65534", time.Hour), {"uid 65534", time.Second, false}}, 1},
		{"a tie: the order of idle.go decides", []conn{spoken("uid 1000", time.Second), spoken("uid 1000", time.Second), spoken("uid 1001", time.Minute), spoken("uid 1001", 0)}, 2},
		{"an address owns what it holds", []conn{spoken("10.0.0.5", time.Second), spoken("10.0.0.5", 0), spoken(rootOwner, time.Hour)}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// shareVictim takes them in the order they give way, as
			// candidates returns them; at[j] is the index in tt.conns of
			// cands[j].
			at := make([]int, len(tt.conns))
			cands := make([]idleCandidate, len(tt.conns))
			for i, c := range tt.conns {
				at[i], cands[i] = i, idleCandidate{&proxyConn{}, connLook{quiet: c.quiet, spoke: c.spoke}}
			}
			slices.SortStableFunc(at, func(a, b int) int { return giveWay(cands[a], cands[b]) })
			slices.SortStableFunc(cands, giveWay)
			owners := make([]string, len(at))
			for j, i := range at {
				owners[j] = tt.conns[i].owner
			}
			victim, _, _ := shareVictim(cands, owners)
			got := -1
			for j := range cands {
				if victim == &cands[j] {
					got = at[j]
				}
			}
			if got != tt.want {
				t.Errorf("victim: got %d; want %d", got, tt.want)
			}
		})
	}
	if victim, _, _ := shareVictim([]idleCandidate{{}, {}}, nil); victim != nil {
		t.Errorf("owners not known: got a victim; want none")
	}
}
