package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
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

// --- lb-upgrade

// handoverSocket names the daemon's hand-over socket, with a path short
// enough for a unix socket, in a directory the daemon makes 0700 inside one
// of the row's own: the daemon refuses a directory in a parent that others
// can write, such as /tmp.
func (rr *rowRun) handoverSocket() error {
	parent, err := os.MkdirTemp("", "ep-handover-")
	if err != nil {
		return fmt.Errorf("hand-over socket directory: %w", err)
	}
	rr.handover = filepath.Join(parent, "h", "handover.sock")
	return nil
}

// actLBUpgrade is a DaemonSet rolling with maxSurge 1: a second daemon
// starts beside the running one and takes its listening sockets over; once
// it serves, the first gets SIGTERM and stops gracefully.
func actLBUpgrade(rr *rowRun) error {
	defer os.RemoveAll(filepath.Dir(filepath.Dir(rr.handover)))
	old := rr.d
	static := threeEndpoints()
	if rr.row.Mode.Node {
		static = []string{APIAddr("cp1")}
	}
	next, err := rr.r.C.StartDaemon(rr.ctx, DaemonConfig{
		Binary: rr.r.Binary, Mode: rr.row.Mode, Settings: rr.settings(), Endpoints: static,
		LogPath: strings.TrimSuffix(rr.logPath, ".log") + "-successor.log", Handover: rr.handover,
	})
	if err != nil {
		return fmt.Errorf("start the second daemon: %w", err)
	}
	started := time.Now()
	if !rr.waitFor(20*time.Second, func() bool {
		return next.LogContains("took over the listening sockets from the running instance") &&
			old.LogContains("handed the listening sockets to a new instance")
	}) {
		rr.fail("the second daemon did not take the sockets over within 20s:\n%s", next.proc.Tail(2000))
		return next.Stop()
	}
	rr.note("second daemon took the sockets over %s after its start", time.Since(started).Round(time.Millisecond))
	rr.d, rr.wl.pid = next, next.Pid()
	sleepCtx(rr.ctx, 5*time.Second) // both serve
	rr.fault = time.Now()
	rr.lateAfter = rr.fault
	if err := old.Stop(); err != nil {
		rr.fail("the first daemon's stop: %v", err)
	}
	rr.note("first daemon exited %s after SIGTERM", time.Since(rr.fault).Round(time.Millisecond))
	sleepCtx(rr.ctx, 20*time.Second)
	return nil
}
