package harness

import (
	"fmt"
	"syscall"
	"time"
)

// lbWatchLimit is the bound on watch gaps when the balancer
// restarts: every watcher receives events again within 2 s.
const lbWatchLimit = 2 * time.Second

// --- lb-restart

// actLBRestart is `systemctl restart` under socket activation: SIGTERM to
// the daemon, whose listening sockets the holder keeps; the holder starts
// the next one at once.
func actLBRestart(rr *rowRun) error {
	old := rr.d.Pid()
	if old == 0 {
		return fmt.Errorf("no daemon runs under the socket holder")
	}
	rr.fault = time.Now()
	rr.lateAfter = rr.fault
	if err := syscall.Kill(old, syscall.SIGTERM); err != nil {
		return fmt.Errorf("SIGTERM to the daemon: %w", err)
	}
	var pid int
	if !rr.waitFor(20*time.Second, func() bool {
		pid = rr.d.Pid()
		return pid != 0 && pid != old && processRunning(pid)
	}) {
		rr.fail("no new daemon within 20s of SIGTERM to the old one")
		return nil
	}
	rr.wl.pid = pid
	rr.note("next daemon started %s after SIGTERM; the old one exited", time.Since(rr.fault).Round(time.Millisecond))
	sleepCtx(rr.ctx, 20*time.Second)
	return nil
}

func checkLBRestart(rr *rowRun, m Measure) {
	rr.asserts(fmt.Sprintf("no failed short request, no failed write, every watcher's gap under %s", lbWatchLimit))
	if m.Shorts.Failed > 0 {
		rr.fail("%d of %d short requests failed: %s", m.Shorts.Failed, m.Shorts.Total, m.Shorts.FirstErr)
	}
	if m.Writes.Failed > 0 {
		rr.fail("%d of %d writes failed: %s", m.Writes.Failed, m.Writes.Total, m.Writes.FirstErr)
	}
	for _, w := range m.Watchers {
		if w.MaxGap >= lbWatchLimit {
			rr.fail("watcher %d (on %s) went %s without events; want < %s", w.ID, orUnknown(w.Upstream), w.MaxGap.Round(time.Millisecond), lbWatchLimit)
		}
	}
}
