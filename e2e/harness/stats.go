package harness

import (
	"slices"
	"time"
)

// lateDelivery is how late a watch event may arrive before the watcher
// counts as not yet recovered.
const lateDelivery = 2 * time.Second

// Measure is what the clients saw in one scenario.
type Measure struct {
	Shorts ShortStats // GET /version
	// Quorum is the quorum reads (see Workload.quorums), counted as Shorts.
	Quorum   ShortStats
	Writes   WriteStats
	Watchers []WatchStats
	// Recovery is the time from the fault until the end of the last
	// failure (a failed short request, quorum read or write, or a watch
	// event more than lateDelivery late); 0 when nothing failed after the
	// fault, -1 when the scenario has no fault.
	Recovery time.Duration
}

// ShortStats summarises the short requests.
type ShortStats struct {
	Total, Failed int
	// FailedLate counts failures of requests started after the grace
	// period the scenario allows (see Workload.Measure).
	FailedLate    int
	P50, P99, Max time.Duration // over successful requests
	FirstErr      string
	LateErr       string // the first late failure, if any
}

// WriteStats summarises the writer.
type WriteStats struct {
	Total, Failed int
	FailedLate    int // of writes started after the grace, as for ShortStats
	FirstErr      string
}

// WatchStats summarises one watcher.
type WatchStats struct {
	ID       int
	Upstream string
	// MaxGap is the longest a successfully written object waited before
	// the watcher received it (or the scenario ended): the time the
	// watcher went without events while the writer was succeeding.
	MaxGap time.Duration
	// LateGap is MaxGap over the writes done after the scenario's
	// lateAfter (zero without one).
	LateGap    time.Duration
	Missing    int // successful writes never received
	Reconnects int
	Relists    int
}

// Measure computes the statistics. fault is when the fault was injected
// (zero for none); short-request failures that started after lateAfter
// (when not zero) count as late, and so do failed writes.
func (w *Workload) Measure(fault, lateAfter, end time.Time) Measure {
	shorts, quorums, writes := w.Snapshot()
	m := Measure{Recovery: -1}
	lastBad := fault
	var bad time.Time
	m.Shorts, bad = shortStats(shorts, fault, lateAfter)
	lastBad = maxTime(lastBad, bad)
	m.Quorum, bad = shortStats(quorums, fault, lateAfter)
	lastBad = maxTime(lastBad, bad)

	var ok []WriteResult
	for _, wr := range writes {
		m.Writes.Total++
		if wr.Err == "" {
			ok = append(ok, wr)
			continue
		}
		m.Writes.Failed++
		if m.Writes.FirstErr == "" {
			m.Writes.FirstErr = wr.Err
		}
		if !lateAfter.IsZero() && wr.Start.After(lateAfter) {
			m.Writes.FailedLate++
		}
		if !fault.IsZero() && wr.Done.After(fault) {
			lastBad = maxTime(lastBad, wr.Done)
		}
	}

	for _, wt := range w.watchers {
		ws, bad := wt.stats(ok, fault, lateAfter, end)
		lastBad = maxTime(lastBad, bad)
		m.Watchers = append(m.Watchers, ws)
	}
	if !fault.IsZero() {
		m.Recovery = lastBad.Sub(fault)
	}
	return m
}

// stats measures what wt received of the successful writes ok, and
// returns the end of its last delivery more than lateDelivery late after
// the fault (zero if none).
func (wt *Watcher) stats(ok []WriteResult, fault, lateAfter, end time.Time) (WatchStats, time.Time) {
	ws := WatchStats{ID: wt.ID, Upstream: wt.Upstream}
	var lastBad time.Time
	wt.mu.Lock()
	defer wt.mu.Unlock()
	ws.Reconnects, ws.Relists = wt.reconnects, max(wt.relists-1, 0) // the first list is not a relist
	for _, wr := range ok {
		seen, got := wt.seen[wr.Name]
		if !got {
			ws.Missing++
			seen = end
		}
		gap := max(seen.Sub(wr.Done), 0)
		ws.MaxGap = max(ws.MaxGap, gap)
		if !lateAfter.IsZero() && wr.Done.After(lateAfter) {
			ws.LateGap = max(ws.LateGap, gap)
		}
		if !fault.IsZero() && wr.Done.After(fault) && gap > lateDelivery {
			lastBad = maxTime(lastBad, seen)
		}
	}
	return ws, lastBad
}

// LateGap is the longest late gap over all watchers.
func (m Measure) LateGap() time.Duration {
	var g time.Duration
	for _, w := range m.Watchers {
		g = max(g, w.LateGap)
	}
	return g
}

// MaxGap is the longest gap over all watchers.
func (m Measure) MaxGap() time.Duration {
	var g time.Duration
	for _, w := range m.Watchers {
		g = max(g, w.MaxGap)
	}
	return g
}

// shortStats summarises short requests sorted by start, and returns the
// end of the last one that failed after the fault (zero if none).
func shortStats(rs []ShortResult, fault, lateAfter time.Time) (ShortStats, time.Time) {
	var st ShortStats
	var lastBad time.Time
	var durs []time.Duration
	for _, s := range rs {
		st.Total++
		if s.Err == "" {
			durs = append(durs, s.Dur)
			continue
		}
		st.Failed++
		if st.FirstErr == "" {
			st.FirstErr = s.Err
		}
		if !lateAfter.IsZero() && s.Start.After(lateAfter) {
			st.FailedLate++
			if st.LateErr == "" {
				st.LateErr = s.Start.Format("15:04:05.000") + " " + s.Err
			}
		}
		if !fault.IsZero() && s.Start.After(fault) {
			lastBad = maxTime(lastBad, s.Start.Add(s.Dur))
		}
	}
	slices.Sort(durs)
	st.P50 = percentile(durs, 0.50)
	st.P99 = percentile(durs, 0.99)
	if len(durs) > 0 {
		st.Max = durs[len(durs)-1]
	}
	return st, lastBad
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1)*p + 0.5)
	return sorted[i]
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
