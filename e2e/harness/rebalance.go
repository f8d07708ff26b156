package harness

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// The rebalance row: the API server of watcher 0 is killed while the
// workload runs through the daemon and restarted once the daemon excluded
// it. The long-lived connections that moved to the two survivors must find
// their way back: the rebalancer spreads them across all three again, not
// before its settle time, closing only connections with nothing in flight.
const (
	// rebalanceRowPeriod is the row's --rebalance-period: a sixth of the
	// default, so that a few periods fit in the row.
	rebalanceRowPeriod = 10 * time.Second
	// rebalanceSettle is the daemon's: nothing moves within it of an
	// upstream's recovery.
	rebalanceSettle = 2 * time.Minute
	// rebalanceGapLimit bounds the watch gaps after the restore: a
	// rebalancing close costs a watcher one reconnect, not a gap.
	rebalanceGapLimit = 2 * time.Second
	// rebalanceHold is how long the spread must then stay without another
	// close.
	rebalanceHold = 3 * rebalanceRowPeriod

	mClosed      = "extractedprism_connections_closed_total"
	rebalanceLog = "closing a long-lived connection to rebalance"
)

func actRebalance(rr *rowRun) error {
	c := rr.r.C
	v := rr.victim()
	rr.res.Victim = v
	rr.fault = time.Now()
	if err := c.KillAPIServer(v); err != nil {
		return err
	}
	rr.observeExclusion(v, 20*time.Second, nil)
	rr.noteLongLived("after the kill")
	if err := c.StartAPIServer(v); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(rr.ctx, 2*time.Minute)
	err := c.WaitAPIServers(ctx, []string{v})
	cancel()
	if err != nil {
		return fmt.Errorf("restart %s: %w", v, err)
	}
	restored := time.Now()
	rr.lateAfter = restored
	rr.note("%s restarted and ready %s after the kill", v, restored.Sub(rr.fault).Round(time.Second))
	rr.observeSpread(restored)
	rr.noteWatcherMoves(restored)
	return nil
}

// observeSpread waits, one sample a second, until the long-lived
// connections are spread over the three upstreams, and asserts on the
// closes that spread them: none within the settle time, a log line each,
// and none more while the spread holds.
func (rr *rowRun) observeSpread(restored time.Time) {
	limit := rebalanceSettle + 30*time.Second + 8*rebalanceRowPeriod
	rr.asserts(fmt.Sprintf("the long-lived connections are spread over all three upstreams within %s of the restore", limit))
	var first, spreadAt time.Time
	var counts map[string]int
	rr.waitFor(limit, func() bool {
		if first.IsZero() && rr.rebalanceCloses() > 0 {
			first = time.Now()
		}
		counts, _ = rr.d.longLived()
		if spread(counts) {
			spreadAt = time.Now()
			return true
		}
		return false
	})
	if spreadAt.IsZero() {
		rr.fail("long-lived connections %s %s after the restore; want every upstream within one of the others",
			formatCounts(counts), limit)
		return
	}
	closes := rr.rebalanceCloses()
	rr.note("spread %s after the restore, by %d rebalancing closes: %s", spreadAt.Sub(restored).Round(time.Second), int(closes), formatCounts(counts))
	rr.asserts(fmt.Sprintf("no rebalancing close within the settle time (%s) of the restore", rebalanceSettle))
	if !first.IsZero() {
		rr.note("first rebalancing close %s after the restore", first.Sub(restored).Round(time.Second))
		// The daemon's settle time runs from its own probe's success,
		// which WaitAPIServers' polling may see up to a second later.
		if first.Sub(restored) < rebalanceSettle-2*time.Second {
			rr.fail("a rebalancing close %s after the restore; want none within %s", first.Sub(restored).Round(time.Second), rebalanceSettle)
		}
	}
	rr.asserts("a log line for each rebalancing close")
	if n := rr.d.CountLog(rebalanceLog); n != int(closes) {
		rr.fail("%d %q log lines for %d closes", n, rebalanceLog, int(closes))
	}
	rr.asserts(fmt.Sprintf("no further close while spread (%s)", rebalanceHold))
	sleepCtx(rr.ctx, rebalanceHold)
	if after := rr.rebalanceCloses(); after > closes {
		counts, _ = rr.d.longLived()
		rr.fail("%d more rebalancing closes after the spread (now %s)", int(after-closes), formatCounts(counts))
	}
}

// noteWatcherMoves notes which watchers' streams ended after the restore:
// those the rebalancer moved.
func (rr *rowRun) noteWatcherMoves(restored time.Time) {
	var moved []string
	for _, w := range rr.wl.Watchers() {
		n := 0
		for _, t := range w.StreamEnds() {
			if t.After(restored) {
				n++
			}
		}
		if n > 0 {
			moved = append(moved, fmt.Sprintf("watcher %d: %d", w.ID, n))
		}
	}
	rr.note("watch streams ended after the restore: %s", orUnknown(strings.Join(moved, ", ")))
}

// rebalanceCloses is the daemon's count of rebalancing closes, over all
// upstreams; -1 if the scrape failed.
func (rr *rowRun) rebalanceCloses() float64 {
	s, err := rr.d.Metrics()
	if err != nil {
		return -1
	}
	return s.Sum(mClosed, "reason", "rebalance")
}

func (rr *rowRun) noteLongLived(when string) {
	counts, err := rr.d.longLived()
	if err != nil {
		rr.note("long-lived connections %s: %v", when, err)
		return
	}
	rr.note("long-lived connections %s: %s", when, formatCounts(counts))
}

// spread reports whether each control-plane node's API server holds at
// least one long-lived connection and none more than one above another:
// where the rebalancer stops.
func spread(counts map[string]int) bool {
	least, most := -1, 0
	for _, n := range CPNames {
		c, ok := counts[APIAddr(n)]
		if !ok {
			return false
		}
		if least < 0 || c < least {
			least = c
		}
		most = max(most, c)
	}
	return least >= 1 && most <= least+1
}

// formatCounts shows the counts in node order, such as "cp1 2, cp2 2, cp3 1".
func formatCounts(counts map[string]int) string {
	var parts []string
	for _, n := range CPNames {
		parts = append(parts, fmt.Sprintf("%s %d", n, counts[APIAddr(n)]))
	}
	return strings.Join(parts, ", ")
}

// longLived reads each upstream's long_lived_connections from /upstreams.
func (d *Daemon) longLived() (map[string]int, error) {
	us, err := d.upstreams()
	if err != nil {
		return nil, err
	}
	counts := map[string]int{}
	for _, u := range us {
		counts[u.Address] = u.LongLived
	}
	return counts, nil
}

func checkRebalance(rr *rowRun, m Measure) {
	rr.note("over the whole row, the kill's included: %d of %d short requests and %d of %d writes failed",
		m.Shorts.Failed, m.Shorts.Total, m.Writes.Failed, m.Writes.Total)
	rr.asserts("after the restore: no failed short request, no failed write, no watch gap of 2 s or more")
	if m.Shorts.FailedLate > 0 {
		rr.fail("%d short requests started after the restore failed (first: %s)", m.Shorts.FailedLate, m.Shorts.LateErr)
	}
	if m.Writes.FailedLate > 0 {
		rr.fail("%d writes started after the restore failed (first: %s)", m.Writes.FailedLate, m.Writes.FirstErr)
	}
	if g := m.LateGap(); g >= rebalanceGapLimit {
		rr.fail("watch gap %s after the restore; want < %s", g.Round(time.Millisecond), rebalanceGapLimit)
	}
}
