package main

import (
	"math/rand/v2"
	"slices"
)

// selector is the policy that picks an upstream for a new connection.
type selector interface {
	// pick returns an upstream from s that new connections may use and that
	// is not in tried, or nil when there is none. It must not block.
	pick(s *snapshot, tried []*upstream) *upstream
}

// randomSelector picks uniformly among the pickable upstreams.
type randomSelector struct{}

func (randomSelector) pick(s *snapshot, tried []*upstream) *upstream {
	return pickRandom(s.pickable, tried)
}

// pickRandom returns a uniformly random member of candidates that is not in
// tried, without allocating.
func pickRandom(candidates, tried []*upstream) *upstream {
	n := 0
	for _, u := range candidates {
		if !slices.Contains(tried, u) {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	k := rand.IntN(n)
	for _, u := range candidates {
		if slices.Contains(tried, u) {
			continue
		}
		if k == 0 {
			return u
		}
		k--
	}
	return nil // unreachable: k < n
}
