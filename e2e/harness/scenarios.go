package harness

import (
	"context"
	"fmt"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// Metric names used by the assertions.
const (
	mUpstreamsTotal = "extractedprism_upstreams_total"
	mDiscovery      = "extractedprism_discovery_updates_total"
	mHealth         = "extractedprism_health_check_status"
	mReady          = "extractedprism_upstream_ready"
)

// watchGapLimit is the bound on watch gaps in kill and black hole
// with readyz.
const watchGapLimit = 30 * time.Second

// The chart-defaults rows' bounds, from the issue that made readyz the
// chart's default: a black-holed API server costs a watch under 4 s, and a
// node whose etcd member lost quorum is recovered from within 10 s.
// chartKillGrace lets the kill land: the signal's delivery and the resets
// reaching the clients (a write sent 37 ms after the signal, on the
// writer's connection to the killed server, was reset in a CI run).
const (
	chartBlackHoleGap = 4 * time.Second
	chartQuorumLimit  = 10 * time.Second
	chartKillGrace    = time.Second
)

var scenarios = map[string]scenario{
	"steady":     {static: func() []string { return []string{APIAddr("cp1")} }, act: actSteady, check: checkSteady},
	"compaction": {act: actCompaction, check: checkNoShortFailures},
	"membership": {act: actMembership, check: checkNoShortFailures},
	"kill":       {act: actKill, check: checkKill},
	"blackhole":  {act: actBlackHole, check: checkBlackHole},
	"quorum":     {act: actQuorum, check: checkQuorum},
	"restart":    {act: actRestart, check: checkRestart},
	"rotation":   {act: actRotation, check: checkRotation, nodeCertValidity: rotationCertValidity},
	"forbidden":  {act: actForbidden, check: checkForbidden},
	"lb-restart": {act: actLBRestart, check: checkLBRestart, activated: true},
	"lb-upgrade": {act: actLBUpgrade, check: checkLBRestart, handover: true},
	"rebalance":  {act: actRebalance, check: checkRebalance, rebalancePeriod: rebalanceRowPeriod},
}

// ScenarioDescriptions explain each scenario for the report.
var ScenarioDescriptions = map[string]string{
	"steady": "No fault. The daemon starts with only cp1 as a static endpoint, so reaching three upstreams " +
		"proves discovery learned cp2 and cp3 from the EndpointSlice. After 20 s on the established watch, an " +
		"extra EndpointSlice adds an upstream (a relay in w1 to cp2) and is deleted again; the daemon must " +
		"follow each change within a second.",
	"compaction": "etcd is compacted to its current revision and the daemon's own discovery connection is cut " +
		"(`ss -K`); its watch resumes from a compacted revision (EndpointSlice watch cache off), gets 410 Gone " +
		"and re-lists. Then an extra EndpointSlice adds an upstream (a relay in w1 to cp2) and is deleted again.",
	"membership": "A fourth API server (cp4, 192.0.2.14) starts and joins the EndpointSlice; a watcher is " +
		"placed on it; then it gets SIGTERM (it leaves the slice at once but serves for 20 s more) and must " +
		"drain within --drain-timeout.",
	"kill":      "SIGKILL to the API server that watcher 0 is connected to.",
	"blackhole": "The veth of the control-plane node that watcher 0 is connected to goes down (peers have permanent neighbour entries, so packets vanish).",
	"quorum": "nftables in the node of watcher 0 drops etcd peer traffic (port 2380); its etcd member loses " +
		"quorum while its API server stays reachable.",
	"restart": "The API servers on cp1 and cp2 are killed; once the daemon excluded them it is restarted, so " +
		"it starts with two dead static endpoints out of three.",
	"rotation": "The node's client certificate, which lives 45 s, is rotated (a new key pair, the symlink the " +
		"kubeconfig names swapped as the kubelet does); after the old one expired, discovery's connection is cut " +
		"(`ss -K`), so it must authenticate afresh; then cp4 joins and must be discovered.",
	"lb-restart": "The daemon runs under socket activation (systemd-socket-activate holds its listening sockets " +
		"and starts it again whenever it exits, as systemd with extractedprism.socket does); it gets SIGTERM, " +
		"as from `systemctl restart`.",
	"lb-upgrade": "The daemon runs with --handover-socket; a second instance is started beside it, as a " +
		"DaemonSet rolling with maxSurge 1 does, takes its listening sockets over, and the first then gets " +
		"SIGTERM and closes its connections spread over 10 s.",
	"rebalance": "SIGKILL to the API server that watcher 0 is connected to; once the daemon excluded it, it is " +
		"restarted. With --rebalance-period 10s, the long-lived connections (three watchers, the writer's and " +
		"discovery's) that moved to the two survivors must be spread over all three again, not within the " +
		"daemon's 2 min settle time, with nothing failing after the restore.",
	"forbidden": "The RoleBinding of deploy/node-discovery-rbac.yaml is deleted and the daemon restarted with only " +
		"cp1 static and the endpoint cache of its first run; the API servers refuse its discovery with 403. After 15 s " +
		"the RoleBinding returns.",
}

// failoverGrace is how long after a fault short requests may still fail:
// two probe intervals plus one probe timeout and a second of slack, the
// time the two-failure threshold needs to exclude the upstream.
func (rr *rowRun) failoverGrace() time.Duration {
	s := rr.settings()
	return 2*s.HealthInterval + s.HealthTimeout + time.Second
}

// --- steady

func actSteady(rr *rowRun) error {
	s, err := rr.d.Metrics()
	if err != nil {
		return err
	}
	rr.asserts("discovery learned cp2 and cp3: 3 upstreams with only cp1 static")
	if v := s.Value(mDiscovery, "provider", "kubernetes"); v < 1 {
		rr.fail("%s{provider=kubernetes} = %v; want >= 1", mDiscovery, v)
	}
	for _, n := range CPNames {
		if _, ok := s.Get(mHealth, "upstream", APIAddr(n)); !ok {
			rr.fail("no %s series for %s", mHealth, APIAddr(n))
		}
	}
	if !rr.d.LogContains("kubernetes endpoints changed", APIAddr("cp2"), APIAddr("cp3")) {
		rr.fail("the daemon log has no \"kubernetes endpoints changed\" line naming cp2 and cp3")
	}
	sleepCtx(rr.ctx, 20*time.Second)
	s, err = rr.d.Metrics()
	if err != nil {
		return err
	}
	for _, n := range CPNames {
		if v, _ := s.Get(mHealth, "upstream", APIAddr(n)); v != 1 {
			rr.fail("%s{upstream=%s} = %v after 20 s; want 1", mHealth, APIAddr(n), v)
		}
	}
	return rr.followExtraSlice(time.Second)
}

func checkSteady(rr *rowRun, m Measure) {
	rr.asserts("no failed request, write or watch gap over 5 s")
	if m.Shorts.Failed > 0 {
		rr.fail("%d of %d short requests failed: %s", m.Shorts.Failed, m.Shorts.Total, m.Shorts.FirstErr)
	}
	if m.Writes.Failed > 0 {
		rr.fail("%d of %d writes failed: %s", m.Writes.Failed, m.Writes.Total, m.Writes.FirstErr)
	}
	if g := m.MaxGap(); g > 5*time.Second {
		rr.fail("watch gap %s; want <= 5s without a fault", g.Round(time.Millisecond))
	}
}

func checkNoShortFailures(rr *rowRun, m Measure) {
	rr.asserts("no failed short request")
	if m.Shorts.Failed > 0 {
		rr.fail("%d of %d short requests failed: %s", m.Shorts.Failed, m.Shorts.Total, m.Shorts.FirstErr)
	}
}

// --- compaction

func actCompaction(rr *rowRun) error {
	c := rr.r.C
	ctx := rr.ctx
	if len(rr.discoveryPorts) == 0 {
		return fmt.Errorf("the daemon's discovery connection could not be told apart at start-up")
	}
	rr.note("discovery connection on %s", rr.discoveryRemote)
	relisted := func() int { return rr.d.CountLog("endpointslice resource version expired") }
	before := relisted()

	// Writes during the warm-up moved the revision past the one the
	// discovery watch holds; compact up to now.
	rev, err := c.EtcdRevision(ctx, "cp1")
	if err != nil {
		return err
	}
	if err := c.EtcdCompact(ctx, "cp1", rev); err != nil {
		return err
	}
	rr.fault = time.Now()
	rr.note("compacted etcd at revision %d", rev)
	if err := rr.cutDiscovery(); err != nil {
		return err
	}
	rr.asserts("the discovery watch gets 410 Gone after compaction and re-lists")
	if rr.waitFor(30*time.Second, func() bool { return relisted() > before }) {
		rr.note("410 Gone and re-list after %s", time.Since(rr.fault).Round(100*time.Millisecond))
	} else {
		rr.fail("no \"resource version expired, re-listing\" in the daemon log within 30s of compaction")
	}

	rr.asserts("after the re-list, an extra EndpointSlice adds an upstream and deleting it removes it")
	return rr.followExtraSlice(0) // the re-watch waits out the backoff
}

// followExtraSlice publishes a relay in w1 through an extra EndpointSlice
// of the kubernetes service, times how long the daemon takes to list it
// and, after the slice is deleted, to stop listing it, and waits for its
// removal. A bound above zero is asserted on both times: discovery must
// follow a change on an established watch within it.
func (rr *rowRun) followExtraSlice(bound time.Duration) error {
	c := rr.r.C
	ctx := rr.ctx
	if out, err := c.ExecW1(ctx, "ip", "addr", "replace", extraAddr+"/32", "dev", "lo"); err != nil {
		return fmt.Errorf("add %s in w1: %v: %s", extraAddr, err, out)
	}
	extra := extraAddr + ":6443"
	rl, err := startRelay(c, extra, APIAddr("cp2"))
	if err != nil {
		return err
	}
	defer rl.Close()
	cs, err := c.DirectClient()
	if err != nil {
		return err
	}
	eps := cs.DiscoveryV1().EndpointSlices("default")
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, err = eps.Create(cctx, extraSlice(), metav1.CreateOptions{})
	cancel()
	if err != nil {
		return fmt.Errorf("create the extra EndpointSlice: %w", err)
	}
	rr.timeFollow("added", bound, time.Now(), func(st upstreamState) bool { return st.known && !st.draining && st.fromKube })
	sleepCtx(ctx, 2*rr.settings().HealthInterval) // let it take some connections
	cctx, cancel = context.WithTimeout(ctx, 10*time.Second)
	err = eps.Delete(cctx, extraSlice().Name, metav1.DeleteOptions{})
	cancel()
	if err != nil {
		return fmt.Errorf("delete the extra EndpointSlice: %w", err)
	}
	removed := time.Now()
	rr.timeFollow("dropped", bound, removed, func(st upstreamState) bool { return !st.known || st.draining })
	rr.waitExtraGone(extra, removed)
	rr.note("relay accepted %d connections", rl.accepted.Load())
	return nil
}

// extraSlice is the EndpointSlice of the kubernetes service that
// followExtraSlice creates: one ready endpoint, the relay in w1.
func extraSlice() *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:      "e2e-extra",
			Namespace: "default",
			Labels:    map[string]string{discoveryv1.LabelServiceName: "kubernetes"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{extraAddr},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
		}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To[int32](6443)}},
	}
}

// timeFollow polls the daemon's /upstreams every 10 ms until cond holds for
// the extra upstream, and reports (and, with a bound, asserts) how long
// after since that took.
func (rr *rowRun) timeFollow(what string, bound time.Duration, since time.Time, cond func(upstreamState) bool) {
	if bound > 0 {
		rr.asserts(fmt.Sprintf("an EndpointSlice change on an established watch is followed within %s (%s)", bound, what))
	}
	deadline := since.Add(20 * time.Second)
	for time.Now().Before(deadline) && rr.ctx.Err() == nil {
		st, err := rr.d.upstream(extraAddr + ":6443")
		if err == nil && cond(st) {
			took := time.Since(since)
			rr.note("extra upstream %s %s after the slice change", what, took.Round(time.Millisecond))
			if bound > 0 && took > bound {
				rr.fail("extra upstream %s %s after the slice change; want <= %s", what, took.Round(time.Millisecond), bound)
			}
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	rr.fail("extra upstream not %s within 20s of the slice change", what)
}

// waitExtraGone waits until the removed extra upstream has drained and
// every per-upstream series of it is deleted.
func (rr *rowRun) waitExtraGone(extra string, removed time.Time) {
	limit := rr.settings().DrainTimeout + 10*time.Second
	rr.asserts("every per-upstream series of a removed upstream is deleted")
	var last Samples
	if rr.waitFor(limit, func() bool {
		s, err := rr.d.Metrics()
		last = s
		return err == nil && s.Value(mUpstreamsTotal) == 3 && len(s.SeriesFor(extra)) == 0
	}) {
		rr.note("extra upstream gone %s after the slice was deleted", time.Since(removed).Round(100*time.Millisecond))
	} else {
		rr.fail("extra upstream %s still known %s after its slice was deleted (upstreams_total %v, series %v)",
			extra, limit, last.Value(mUpstreamsTotal), last.SeriesFor(extra))
	}
}

// --- membership

func actMembership(rr *rowRun) error {
	c := rr.r.C
	cp4 := APIAddr("cp4")
	rr.fault = time.Now()
	if err := c.AddCP4(); err != nil {
		return err
	}
	rr.asserts("cp4 is discovered without a restart")
	var last Samples
	if !rr.waitFor(120*time.Second, func() bool {
		s, err := rr.d.Metrics()
		last = s
		_, ok := s.Get(mHealth, "upstream", cp4)
		return err == nil && ok && s.Value(mUpstreamsTotal) == 4
	}) {
		rr.fail("cp4 not discovered within 120s (upstreams_total %v)", last.Value(mUpstreamsTotal))
		return nil
	}
	rr.note("cp4 discovered %s after its start", time.Since(rr.fault).Round(100*time.Millisecond))

	// Place a watcher on cp4: open watchers until one lands there.
	var onCP4 *Watcher
	var others []*Watcher
	for i := 0; i < 16 && onCP4 == nil; i++ {
		w, err := rr.wl.StartWatcher(rr.ctx, 100+i)
		if err != nil {
			return err
		}
		if w.Upstream == cp4 {
			onCP4 = w
		} else {
			others = append(others, w)
		}
	}
	for _, w := range others {
		w.Stop()
	}
	if onCP4 == nil {
		rr.note("no watcher landed on cp4 in 16 tries; its drain is not timed")
	} else {
		defer onCP4.Stop()
	}

	stopped := time.Now()
	exited, err := c.StopAPIServer("cp4")
	if err != nil {
		return err
	}
	rr.lateAfter = stopped.Add(time.Second)
	rr.asserts("cp4 is removed after SIGTERM and drains within --drain-timeout")
	limit := rr.settings().DrainTimeout + 15*time.Second
	rr.asserts("every per-upstream series of cp4 is deleted once it has drained")
	if rr.waitFor(limit, func() bool {
		s, err := rr.d.Metrics()
		last = s
		return err == nil && len(s.SeriesFor(cp4)) == 0 && s.Value(mUpstreamsTotal) == 3
	}) {
		rr.note("cp4 gone from the daemon %s after SIGTERM", time.Since(stopped).Round(100*time.Millisecond))
	} else {
		rr.fail("cp4 still known %s after SIGTERM (upstreams_total %v, series %v)", limit, last.Value(mUpstreamsTotal), last.SeriesFor(cp4))
	}
	if onCP4 != nil {
		rr.checkDrainedWatcher(onCP4, stopped)
	}
	select {
	case <-exited:
	case <-time.After(60 * time.Second):
		rr.note("cp4's API server still running 60s after SIGTERM")
	}
	return nil
}

// checkDrainedWatcher checks that the watcher on cp4 lost its stream by the
// daemon's drain: not before --drain-timeout, and before the API server's
// own shutdown 20 s after SIGTERM.
func (rr *rowRun) checkDrainedWatcher(w *Watcher, stopped time.Time) {
	drain := rr.settings().DrainTimeout
	var end time.Time
	rr.waitFor(drain+15*time.Second, func() bool {
		for _, t := range w.StreamEnds() {
			if t.After(stopped) {
				end = t
				return true
			}
		}
		return false
	})
	if end.IsZero() {
		rr.fail("the watcher on cp4 still had its stream %s after SIGTERM", drain+15*time.Second)
		return
	}
	after := end.Sub(stopped)
	rr.note("the watcher on cp4 lost its stream %s after SIGTERM", after.Round(100*time.Millisecond))
	if after < drain-2*time.Second || after > drain+6*time.Second {
		rr.fail("the watcher on cp4 lost its stream %s after SIGTERM; want about --drain-timeout (%s)", after.Round(100*time.Millisecond), drain)
	}
}

// --- kill and black hole

func actKill(rr *rowRun) error {
	v := rr.victim()
	rr.res.Victim = v
	rr.fault = time.Now()
	rr.lateAfter = rr.fault.Add(rr.failoverGrace())
	if rr.row.Mode.Chart {
		// A killed API server refuses connections: only what was in
		// flight to it as the kill landed may fail.
		rr.lateAfter = rr.fault.Add(chartKillGrace)
	}
	if err := rr.r.C.KillAPIServer(v); err != nil {
		return err
	}
	rr.observeExclusion(v, 40*time.Second, nil)
	return nil
}

func actBlackHole(rr *rowRun) error {
	v := rr.victim()
	rr.res.Victim = v
	rr.fault = time.Now()
	rr.lateAfter = rr.fault.Add(rr.failoverGrace())
	if err := rr.r.C.BlackHole(v, true); err != nil {
		return err
	}
	rr.observeExclusion(v, 50*time.Second, nil)
	return nil
}

// observeExclusion samples the daemon's view of the victim for d and notes
// when it was excluded (health 0) and, with readyz, marked not ready. each,
// when not nil, runs after every sample.
func (rr *rowRun) observeExclusion(victim string, d time.Duration, each func(now time.Time)) {
	addr := APIAddr(victim)
	var excluded, unready time.Time
	rr.sample(d, func(now time.Time, s Samples) {
		if v, ok := s.Get(mHealth, "upstream", addr); ok && v == 0 && excluded.IsZero() {
			excluded = now
		}
		if v, ok := s.Get(mReady, "upstream", addr); ok && v == 0 && unready.IsZero() {
			unready = now
		}
		if each != nil {
			each(now)
		}
	})
	if !excluded.IsZero() {
		rr.note("%s excluded (health 0) %s after the fault", victim, excluded.Sub(rr.fault).Round(time.Second))
	}
	if !unready.IsZero() {
		rr.note("%s not ready %s after the fault", victim, unready.Sub(rr.fault).Round(time.Second))
	}
}

func checkFailover(rr *rowRun, m Measure) {
	grace := rr.lateAfter.Sub(rr.fault)
	rr.asserts(fmt.Sprintf("no short request started more than %s after the fault fails", grace))
	if m.Shorts.FailedLate > 0 {
		rr.fail("%d short requests failed more than %s after the fault (first: %s)", m.Shorts.FailedLate, grace, m.Shorts.LateErr)
	}
	if rr.row.Mode.HealthCheck == "readyz" {
		rr.asserts(fmt.Sprintf("watch gaps under %s", watchGapLimit))
		if g := m.MaxGap(); g >= watchGapLimit {
			rr.fail("watch gap %s; want < %s", g.Round(time.Millisecond), watchGapLimit)
		}
	}
}

// checkKill with the chart's defaults allows only chartKillGrace, for
// writes too: every request started after it finds another upstream.
// A request in flight to the killed server is reset with it, as behind any
// TCP balancer.
func checkKill(rr *rowRun, m Measure) {
	checkFailover(rr, m)
	if !rr.row.Mode.Chart {
		return
	}
	rr.asserts(fmt.Sprintf("no write started more than %s after the fault fails", chartKillGrace))
	if m.Writes.FailedLate > 0 {
		rr.fail("%d writes started more than %s after the fault failed (first: %s)", m.Writes.FailedLate, chartKillGrace, m.Writes.FirstErr)
	}
}

func checkBlackHole(rr *rowRun, m Measure) {
	checkFailover(rr, m)
	if !rr.row.Mode.Chart {
		return
	}
	rr.asserts(fmt.Sprintf("watch gaps under %s", chartBlackHoleGap))
	if g := m.MaxGap(); g >= chartBlackHoleGap {
		rr.fail("watch gap %s; want < %s", g.Round(time.Millisecond), chartBlackHoleGap)
	}
}

// --- quorum loss

func actQuorum(rr *rowRun) error {
	c := rr.r.C
	v := rr.victim()
	rr.res.Victim = v
	rr.fault = time.Now()
	if rr.row.Mode.Chart {
		rr.lateAfter = rr.fault.Add(chartQuorumLimit)
	}
	wctx, stopWatch := context.WithCancel(rr.ctx)
	defer stopWatch()
	lastConn, err := rr.watchLastConn(wctx, APIAddr(v))
	if err != nil {
		return err
	}
	if err := c.Partition(rr.ctx, v, true); err != nil {
		return err
	}
	// The scenario is one member in the minority and two keeping quorum.
	// If the two lose their leader too, the row says nothing about
	// extractedprism: report it as an environment error.
	var majorityErr error
	checked := false
	checkMajority := func(now time.Time) {
		if checked || now.Sub(rr.fault) < 15*time.Second {
			return
		}
		checked = true
		for _, n := range CPNames {
			if n == v {
				continue
			}
			ctx, cancel := context.WithTimeout(rr.ctx, 3*time.Second)
			st, err := c.EtcdMemberStatus(ctx, n)
			cancel()
			if err != nil || st.Leader == "" || st.Leader == "0" {
				majorityErr = fmt.Errorf("environment: etcd on %s had no leader 15 s after %s was partitioned (%v)", n, v, err)
			}
		}
	}
	s := rr.settings()
	rr.observeExclusion(v, s.DrainTimeout+2*s.HealthInterval+20*time.Second, checkMajority)
	stopWatch()
	rr.reportLastConn(v, lastConn())
	return majorityErr
}

// quorumLimit is how soon the watchers on a node without quorum must be
// moved: --drain-timeout plus two probe intervals, plus 10 s for the API
// server's own /readyz to notice (its etcd check times out) and for the
// client to reconnect.
func (rr *rowRun) quorumLimit() time.Duration {
	s := rr.settings()
	return s.DrainTimeout + 2*s.HealthInterval + 10*time.Second
}

func checkQuorum(rr *rowRun, m Measure) {
	victim := APIAddr(rr.res.Victim)
	var onVictim int
	for _, w := range m.Watchers {
		if w.Upstream == victim {
			onVictim++
		}
	}
	rr.note("%d watchers were on the partitioned node", onVictim)
	if rr.row.Mode.HealthCheck != "readyz" {
		return // tcp mode promises nothing here: the API server still accepts connections
	}
	if rr.row.Mode.Chart {
		checkQuorumRecovered(rr, m)
		return
	}
	limit := rr.quorumLimit()
	rr.asserts(fmt.Sprintf("watchers on the partitioned node move within drain + 2 intervals + 10 s (%s)", limit))
	for _, w := range m.Watchers {
		if w.MaxGap > limit {
			rr.fail("watcher %d (on %s) went %s without events; want <= %s", w.ID, orUnknown(w.Upstream), w.MaxGap.Round(time.Millisecond), limit)
		}
	}
}

// --- restart

func actRestart(rr *rowRun) error {
	c := rr.r.C
	for _, n := range []string{"cp1", "cp2"} {
		if err := c.KillAPIServer(n); err != nil {
			return err
		}
	}
	rr.res.Victim = "cp1+cp2"
	// Let the running daemon exclude them, as it would have long before a
	// real restart.
	sleepCtx(rr.ctx, rr.failoverGrace())
	rr.fault = time.Now()
	if err := rr.d.Stop(); err != nil {
		rr.fail("daemon shutdown: %v", err)
	}
	rr.d = nil
	d, err := c.StartDaemon(rr.ctx, DaemonConfig{
		Binary: rr.r.Binary, Mode: rr.row.Mode, Settings: rr.settings(), Endpoints: threeEndpoints(), LogPath: rr.logPath,
	})
	if err != nil {
		return fmt.Errorf("restart the daemon: %w", err)
	}
	rr.d = d
	listening := time.Now()
	rr.lateAfter = listening.Add(time.Second)
	rr.wl.pid = d.Pid()
	rr.note("daemon down for %s", listening.Sub(rr.fault).Round(100*time.Millisecond))
	ready := rr.waitFor(30*time.Second, func() bool {
		code, _, err := d.Get("/readyz")
		return err == nil && code == 200
	})
	if !ready {
		rr.fail("restarted daemon not ready within 30s")
	} else {
		rr.note("restarted daemon ready %s after it listened", time.Since(listening).Round(100*time.Millisecond))
	}
	sleepCtx(rr.ctx, 20*time.Second)
	return nil
}

func checkRestart(rr *rowRun, m Measure) {
	rr.asserts("no short request started more than 1 s after the restarted daemon listens fails")
	if m.Shorts.FailedLate > 0 {
		rr.fail("%d short requests failed after the restarted daemon was listening (first: %s)", m.Shorts.FailedLate, m.Shorts.LateErr)
	}
	if rr.row.Mode.HealthCheck == "readyz" {
		rr.asserts(fmt.Sprintf("watch gaps under %s", watchGapLimit))
		if g := m.MaxGap(); g >= watchGapLimit {
			rr.fail("watch gap %s; want < %s", g.Round(time.Millisecond), watchGapLimit)
		}
	}
}

// checkQuorumRecovered is the chart's bound: the node's clients are back
// within chartQuorumLimit. Every watcher goes at most that long without an
// object the cluster wrote (the time it lags behind the majority), and no
// short request, quorum read or write started after it fails.
// Measure.Recovery, which also counts the majority's own leader election,
// is reported beside it.
func checkQuorumRecovered(rr *rowRun, m Measure) {
	rr.asserts(fmt.Sprintf("every watcher's gap at most %s, and no short request, quorum read or write started %s after the fault fails",
		chartQuorumLimit, chartQuorumLimit))
	for _, w := range m.Watchers {
		if w.MaxGap > chartQuorumLimit {
			rr.fail("watcher %d (on %s) went %s without events; want <= %s", w.ID, orUnknown(w.Upstream), w.MaxGap.Round(time.Millisecond), chartQuorumLimit)
		}
	}
	if m.Shorts.FailedLate > 0 || m.Quorum.FailedLate > 0 || m.Writes.FailedLate > 0 {
		rr.fail("%d short requests, %d quorum reads and %d writes started more than %s after the fault failed (first short: %s; first quorum read: %s)",
			m.Shorts.FailedLate, m.Quorum.FailedLate, m.Writes.FailedLate, chartQuorumLimit, m.Shorts.LateErr, m.Quorum.LateErr)
	}
}
