package main

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"time"
)

// selector is the policy that orders upstreams for new connections.
type selector interface {
	// order groups candidates by preference. A new connection picks at
	// random in the first group; a retried or hedged dial takes the next
	// untried upstream, moving down the groups. all is every upstream in the
	// pool, candidates or not. order is called with pool.mu held.
	order(all, candidates []*upstream) [][]*upstream
}

// snapshot is an immutable view of the pool that the accept path reads
// without locking. The pool publishes a new one on every state change.
type snapshot struct {
	groups     [][]*upstream // pickable, by preference (see selector)
	fallback   []*upstream   // not draining, most recently healthy first: the last resort
	healthy    int           // healthy, not draining upstreams
	hedgeDelay time.Duration // how long a dial may take before a second one starts
}

// pick returns a pickable upstream that is not in tried, or nil: the one a
// rebalancing close steers to, else a random one of the most preferred
// group that has an untried member.
func (p *pool) pick(tried []*upstream) *upstream {
	groups := p.snap.Load().groups
	if u := p.steered(groups, tried); u != nil {
		return u
	}
	for _, g := range groups {
		if u := pickRandom(g, tried); u != nil {
			return u
		}
	}
	return nil
}

// lastResort returns the most recently healthy non-draining upstream that is
// not in tried, for use when nothing is pickable.
func (p *pool) lastResort(tried []*upstream) *upstream {
	for _, u := range p.snap.Load().fallback {
		if !slices.Contains(tried, u) {
			return u
		}
	}
	return nil
}

// readyFirstLocked narrows the healthy candidates to the ready ones while
// any is ready, and among those to the ones without a failed probe or
// connect since their last passed probe, nor a probe slower than
// slowProbe under way, while any is; with none ready, every healthy one stays,
// so losing quorum everywhere degrades to tcp. It updates the evictions.
func (p *pool) readyFirstLocked(all, candidates []*upstream) []*upstream {
	ready := slices.DeleteFunc(slices.Clone(candidates), func(u *upstream) bool { return !u.h.ready() })
	p.updateEvictionsLocked(all, len(ready))
	if settled := slices.DeleteFunc(slices.Clone(ready), func(u *upstream) bool { return u.h.state != upReady || u.h.slow }); len(settled) > 0 {
		return settled
	}
	if len(ready) > 0 {
		return ready
	}
	return candidates
}

// randomSelector treats every candidate alike.
type randomSelector struct{}

func (randomSelector) order(_, candidates []*upstream) [][]*upstream {
	if len(candidates) == 0 {
		return nil
	}
	return [][]*upstream{candidates}
}

// latencySelector prefers the lowest latency tier that has a candidate; see
// buildTiers. Upstreams without a sample yet join that tier.
type latencySelector struct {
	m *metrics
	// groups is each upstream's group in the previous build, for the
	// hysteresis of buildTiers. Guarded by pool.mu, like every order call.
	groups map[string]int
}

func newLatencySelector(m *metrics) *latencySelector {
	return &latencySelector{m: m, groups: map[string]int{}}
}

func (s *latencySelector) order(all, candidates []*upstream) [][]*upstream {
	// Unhealthy and draining upstreams keep their tier, so losing part of a
	// tier does not let a farther tier in.
	measured := slices.DeleteFunc(slices.Clone(all), func(u *upstream) bool { return !u.hasRTT })
	groups, n := buildTiers(measured, s.groups)
	s.groups = groups
	for _, u := range measured {
		u.tier, u.hasTier = groups[u.addr], true
		s.m.upstreamRTT.WithLabelValues(u.addr).Set(u.rtt.Seconds())
		s.m.upstreamTier.WithLabelValues(u.addr).Set(float64(u.tier))
	}
	byTier := make([][]*upstream, n)
	var fresh []*upstream
	for _, u := range candidates {
		if u.hasRTT {
			byTier[u.tier] = append(byTier[u.tier], u)
		} else {
			fresh = append(fresh, u)
		}
	}
	out := slices.DeleteFunc(byTier, func(g []*upstream) bool { return len(g) == 0 })
	// A new upstream takes picks before its first check, but only a share
	// of the best tier's, not of every upstream's.
	switch {
	case len(out) > 0:
		out[0] = append(out[0], fresh...)
	case len(fresh) > 0:
		out = [][]*upstream{fresh}
	}
	return out
}

// pickRandom returns a uniformly random member of candidates that is not in
// tried, or nil, without allocating: each untried one replaces the choice
// with probability 1/n, n counting the untried ones seen so far.
func pickRandom(candidates, tried []*upstream) (pick *upstream) {
	n := 0
	for _, u := range candidates {
		if !slices.Contains(tried, u) {
			if n++; rand.IntN(n) == 0 { //nolint:gosec // load spreading needs no unpredictability
				pick = u
			}
		}
	}
	return pick
}

const (
	// tierSlack and tierFactor set a tier's limit: max(best+slack, factor*best).
	tierSlack  = 2 * time.Millisecond
	tierFactor = 2
	// tierStay lets a member stay in its group up to 25 % past the limit, so
	// an upstream near the boundary does not flap between tiers.
	tierStay = 1.25
	// rttAlpha is the EWMA weight of a new sample. With samples capped at
	// four times the average, one slow check moves the average by at most
	// 1.9x, while a lasting increase shows within a handful of checks.
	rttAlpha = 0.3
	// rttCapFactor and rttCapFloor bound one sample: min(sample, max(4*avg, 2ms)).
	rttCapFactor = 4
	rttCapFloor  = 2 * time.Millisecond
)

// nextRTT folds a successful check's connect time into the smoothed average.
// A first sample is taken as is; a sample below a quarter of the average
// replaces it, so a slow first check is undone by the next normal one.
func nextRTT(avg time.Duration, have bool, sample time.Duration) time.Duration {
	if !have || sample < avg/rttCapFactor {
		return sample
	}
	sample = min(sample, max(rttCapFactor*avg, rttCapFloor))
	return time.Duration(rttAlpha*float64(sample) + (1-rttAlpha)*float64(avg))
}

// tierLimit is the highest average that joins a tier whose best is best.
func tierLimit(best time.Duration) time.Duration {
	return max(best+tierSlack, tierFactor*best)
}

// buildTiers groups the measured upstreams by their smoothed connect time,
// rtt. Tier 0 holds every upstream whose average is at most
// tierLimit(best), best being the lowest average; tier 1 applies the same
// rule to the rest, and so on. prev maps an address to its group in the
// previous build: an upstream stays in the group of a member of the new
// tier's core up to tierStay times the limit. Because stickiness is about
// groups, not tier numbers, a tier appearing or vanishing above a group
// does not split it. The result maps each address to its tier, and counts
// the tiers.
func buildTiers(measured []*upstream, prev map[string]int) (tiers map[string]int, n int) {
	rest := slices.SortedFunc(slices.Values(measured), byRTT)
	tiers = make(map[string]int, len(measured))
	for ; len(rest) > 0; n++ {
		rest = takeTier(rest, prev, tiers, n)
	}
	return tiers, n
}

// byRTT orders upstreams by their average, then by address.
func byRTT(a, b *upstream) int { return cmp.Or(cmp.Compare(a.rtt, b.rtt), cmp.Compare(a.addr, b.addr)) }

// takeTier puts the next tier, n, of rest, which is sorted by average,
// into tiers and returns what is left.
func takeTier(rest []*upstream, prev, tiers map[string]int, n int) (left []*upstream) {
	limit := tierLimit(rest[0].rtt)
	stay := time.Duration(tierStay * float64(limit))
	coreGroups := map[int]bool{}
	for _, u := range rest {
		if u.rtt > limit {
			break
		}
		if g, ok := prev[u.addr]; ok {
			coreGroups[g] = true
		}
	}
	for _, u := range rest {
		g, had := prev[u.addr]
		if u.rtt <= limit || (u.rtt <= stay && had && coreGroups[g]) {
			tiers[u.addr] = n
		} else {
			left = append(left, u)
		}
	}
	return left
}
