package main

import (
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"
)

const ms = time.Millisecond

func samples(kv ...any) []*upstream {
	var s []*upstream
	for i := 0; i < len(kv); i += 2 {
		s = append(s, &upstream{addr: kv[i].(string), rtt: kv[i+1].(time.Duration), hasRTT: true})
	}
	return s
}

// tiersOf lists the addresses of each tier buildTiers finds, by average,
// and returns its map of addresses to tiers too.
func tiersOf(t testing.TB, measured []*upstream, prev map[string]int) ([][]string, map[string]int) {
	t.Helper()
	groups, n := buildTiers(measured, prev)
	if len(groups) != len(measured) {
		t.Errorf("tiers %v hold %d addresses; want the %d measured", groups, len(groups), len(measured))
	}
	var tiers [][]string
	for _, u := range slices.SortedFunc(slices.Values(measured), byRTT) {
		g := groups[u.addr]
		if g < 0 || g >= n {
			t.Fatalf("%s in tier %d of %d", u.addr, g, n)
		}
		for len(tiers) <= g {
			tiers = append(tiers, nil)
		}
		tiers[g] = append(tiers[g], u.addr)
	}
	if len(tiers) != n {
		t.Errorf("tiers %v; want %d", tiers, n)
	}
	return tiers, groups
}

func TestBuildTiers(t *testing.T) {
	tests := []struct {
		name    string
		samples []*upstream
		prev    map[string]int
		want    [][]string
	}{
		{"one upstream", samples("a", 5*ms), nil, [][]string{{"a"}}},
		{"sub-millisecond site is one tier", samples("a", 300*time.Microsecond, "b", 900*time.Microsecond, "c", 2*ms), nil,
			[][]string{{"a", "b", "c"}}},
		{"limit is 2x best: exactly 2x joins", samples("a", 10*ms, "b", 20*ms), nil, [][]string{{"a", "b"}}},
		{"limit is 2x best: just past it does not", samples("a", 10*ms, "b", 20*ms+1), nil, [][]string{{"a"}, {"b"}}},
		{"limit is best+2ms when that is larger", samples("a", 1*ms, "b", 3*ms), nil, [][]string{{"a", "b"}}},
		{"best+2ms: just past it does not join", samples("a", 1*ms, "b", 3*ms+1), nil, [][]string{{"a"}, {"b"}}},
		{"rule applied repeatedly", samples("e", 50*ms, "a", 1*ms, "c", 10*ms, "b", 2*ms, "d", 15*ms), nil,
			[][]string{{"a", "b"}, {"c", "d"}, {"e"}}},
		{"member stays up to +25% exactly", samples("a", 10*ms, "b", 25*ms), map[string]int{"a": 0, "b": 0},
			[][]string{{"a", "b"}}},
		{"member leaves past +25%", samples("a", 10*ms, "b", 25*ms+1), map[string]int{"a": 0, "b": 0},
			[][]string{{"a"}, {"b"}}},
		{"no stickiness without shared group", samples("a", 10*ms, "b", 22*ms), map[string]int{"a": 0, "b": 1},
			[][]string{{"a"}, {"b"}}},
		{"joining uses the plain limit", samples("a", 10*ms, "b", 19*ms), map[string]int{"a": 0, "b": 1},
			[][]string{{"a", "b"}}},
		{"tier appearing above keeps a group whole", samples("n", 1*ms, "a", 10*ms, "b", 22*ms),
			map[string]int{"a": 0, "b": 0}, [][]string{{"n"}, {"a", "b"}}},
		{"tier vanishing above keeps a group whole", samples("a", 10*ms, "b", 22*ms),
			map[string]int{"n": 0, "a": 1, "b": 1}, [][]string{{"a", "b"}}},
		{"group follows a merged core member", samples("a", 9*ms, "b", 10*ms, "c", 19*ms),
			map[string]int{"a": 0, "b": 1, "c": 1}, [][]string{{"a", "b", "c"}}},
		{"empty", nil, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _ := tiersOf(t, tt.samples, tt.prev)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %v; want %v", got, tt.want)
			}
		})
	}
}

func TestNextRTT(t *testing.T) {
	tests := []struct {
		name   string
		avg    time.Duration
		have   bool
		sample time.Duration
		want   time.Duration
	}{
		{"first sample taken as is", 0, false, 80 * ms, 80 * ms},
		{"smoothed", 10 * ms, true, 20 * ms, 13 * ms},
		{"capped at 4x the average", 10 * ms, true, 1000 * ms, 19 * ms},
		{"cap never below 2ms", 100 * time.Microsecond, true, 50 * ms, 670 * time.Microsecond},
		{"below a quarter replaces", 100 * ms, true, 20 * ms, 20 * ms},
		{"exactly a quarter is smoothed", 100 * ms, true, 25 * ms, 77500 * time.Microsecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := nextRTT(tt.avg, tt.have, tt.sample)
			if d := got - tt.want; d < -time.Microsecond || d > time.Microsecond {
				t.Errorf("got %v; want %v", got, tt.want)
			}
		})
	}
}

func TestNextRTTFollowsLastingIncrease(t *testing.T) {
	// An upstream at 1ms that moves to 100ms must leave tier 0 (stay limit
	// 1.25 * 3ms) within a few checks, and a single slow check must not.
	stay := time.Duration(tierStay * float64(tierLimit(1*ms)))
	if once := nextRTT(1*ms, true, 1000*ms); once > stay {
		t.Errorf("one slow check: average %v; want at most the stay limit %v", once, stay)
	}
	avg, checks := 1*ms, 0
	for avg <= stay {
		avg = nextRTT(avg, true, 100*ms)
		checks++
	}
	if checks > 3 {
		t.Errorf("checks until a lasting 1ms -> 100ms increase leaves tier 0: got %d; want <= 3", checks)
	}
	for range 12 {
		avg = nextRTT(avg, true, 100*ms)
	}
	if avg < 90*ms {
		t.Errorf("average after 15 checks at 100ms: got %v; want >= 90ms", avg)
	}
}

func TestPickTakesFirstGroupWithAnUntriedMember(t *testing.T) {
	a, b, c := &upstream{addr: "a"}, &upstream{addr: "b"}, &upstream{addr: "c"}
	pickIn := func(groups [][]*upstream, tried []*upstream) *upstream {
		p := &pool{}
		p.snap.Store(&snapshot{groups: groups})
		return p.pick(tried)
	}
	groups := [][]*upstream{{a, b}, {c}}
	tests := []struct {
		name  string
		tried []*upstream
		want  []*upstream // any of these
	}{
		{"nothing tried: the first group", nil, []*upstream{a, b}},
		{"one tried: the other of its group", []*upstream{a}, []*upstream{b}},
		{"first group tried: the next group", []*upstream{b, a}, []*upstream{c}},
		{"all tried", []*upstream{a, b, c}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for range 100 {
				got := pickIn(groups, tt.tried)
				if (got == nil) != (tt.want == nil) || got != nil && !slices.Contains(tt.want, got) {
					t.Fatalf("got %s; want one of %s", addrsOf(got), addrsOf(tt.want...))
				}
			}
		})
	}
	if got := pickIn(nil, nil); got != nil {
		t.Errorf("pick from no groups: got %s; want nil", addrsOf(got))
	}
}

// addrsOf names upstreams for a test message, nil as "nil".
func addrsOf(us ...*upstream) []string {
	names := []string{}
	for _, u := range us {
		if u == nil {
			names = append(names, "nil")
		} else {
			names = append(names, u.addr)
		}
	}
	return names
}

// pickRandom samples a reservoir of one: each untried candidate must end up
// picked with the same chance wherever it stands, tried ones never, and
// with nothing allocated, since every new connection calls it.
func TestPickRandomIsUniformAmongUntried(t *testing.T) {
	ups := make([]*upstream, 6)
	for i := range ups {
		ups[i] = &upstream{addr: fmt.Sprint(i)}
	}
	// Tried at both ends and in the middle, and one not a candidate at all.
	tried := []*upstream{ups[0], ups[3], ups[5], {addr: "elsewhere"}}
	untried := []*upstream{ups[1], ups[2], ups[4]}
	const n = 30000
	got := map[*upstream]int{}
	for range n {
		got[pickRandom(ups, tried)]++
	}
	// n/3 each, with a standard deviation of about 82: 500 off is six of
	// them, while a skewed pick is thousands off.
	for _, u := range untried {
		if c := got[u]; c < n/3-500 || c > n/3+500 {
			t.Errorf("picks of untried %s: got %d of %d; want %d ± 500", u.addr, c, n, n/3)
		}
	}
	for _, u := range tried {
		if c := got[u]; c != 0 {
			t.Errorf("picks of tried %s: got %d; want 0", u.addr, c)
		}
	}
	if c := got[nil]; c != 0 {
		t.Errorf("nil picks with untried candidates: got %d; want 0", c)
	}
	if u := pickRandom(ups, ups); u != nil {
		t.Errorf("pick with every candidate tried: got %s; want nil", u.addr)
	}
	if u := pickRandom(nil, nil); u != nil {
		t.Errorf("pick from no candidates: got %s; want nil", u.addr)
	}
	if allocs := testing.AllocsPerRun(1000, func() { _ = pickRandom(ups, tried) }); allocs != 0 {
		t.Errorf("allocations per pick: got %v; want 0", allocs)
	}
}
