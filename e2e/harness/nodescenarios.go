package harness

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// Metrics of the kubernetes discovery provider.
const (
	mDiscoveryRunning = "extractedprism_discovery_running"
	mDiscoveryErrors  = "extractedprism_discovery_errors_total"
)

// rotationCertValidity is how long the rotation row's first node
// certificate lives: long enough for the daemon to start and the workload
// to warm up, short enough to expire within the row.
const rotationCertValidity = 45 * time.Second

// refusedHint is in the daemon's error line for a 401.
const refusedHint = "does not accept these credentials"

// --- rotation

// actRotation rotates the node certificate (a new key pair in the file the
// kubeconfig names), lets the old one expire, then cuts discovery's
// connection so that the next one must authenticate afresh; cp4 then
// joins and must be discovered on that new connection.
func actRotation(rr *rowRun) error {
	c := rr.r.C
	if len(rr.discoveryPorts) == 0 {
		return fmt.Errorf("the daemon's discovery connection could not be told apart at start-up")
	}
	if time.Now().After(rr.nodeCertExpiry) {
		return fmt.Errorf("the first node certificate expired before the rotation: start-up took too long")
	}
	rr.fault = time.Now()
	if err := c.RotateNodeCert(time.Now().Add(nodeCertValidity)); err != nil {
		return err
	}
	rr.note("node certificate rotated %s before the old one expired", time.Until(rr.nodeCertExpiry).Round(time.Second))
	sleepCtx(rr.ctx, time.Until(rr.nodeCertExpiry)+2*time.Second)

	cut := time.Now()
	if err := rr.cutDiscovery(); err != nil {
		return err
	}
	rr.note("discovery connection to %s cut %s after the old certificate expired", rr.discoveryRemote, cut.Sub(rr.nodeCertExpiry).Round(time.Second))
	rr.asserts("after the rotation and the old certificate's expiry, cp4 joins and is discovered within 60 s, on discovery's new connection")
	return rr.awaitCP4(cut)
}

// awaitCP4 starts cp4 and waits until the daemon lists it from discovery
// (and, with readyz, finds it ready: its probe presents the rotated
// certificate to a server it never reached before).
func (rr *rowRun) awaitCP4(since time.Time) error {
	if err := rr.r.C.AddCP4(); err != nil {
		return err
	}
	cp4 := APIAddr("cp4")
	var last upstreamState
	var ready float64
	if rr.waitFor(60*time.Second, func() bool {
		st, err := rr.d.upstream(cp4)
		last = st
		if err != nil || !st.fromKube {
			return false
		}
		if rr.row.Mode.HealthCheck != "readyz" {
			return true
		}
		s, err := rr.d.Metrics()
		ready, _ = s.Get(mReady, "upstream", cp4)
		return err == nil && ready == 1
	}) {
		rr.note("cp4 discovered (and ready) %s after the cut", time.Since(since).Round(100*time.Millisecond))
	} else {
		rr.fail("cp4 not discovered and ready within 60s (discovered %v, ready %v)", last.fromKube, ready)
	}
	return nil
}

func checkRotation(rr *rowRun, m Measure) {
	checkNoShortFailures(rr, m)
	rr.asserts("no discovery call refused as unauthorized, and discovery_running 1 at the end")
	if n := rr.d.CountLog(refusedHint); n > 0 {
		rr.fail("%d discovery calls refused as unauthorized", n)
	}
	if s, err := rr.d.Metrics(); err != nil || s.Value(mDiscoveryRunning, "provider", "kubernetes") != 1 {
		rr.fail("discovery_running{provider=kubernetes} is not 1 at the end (%v)", err)
	}
}

// --- forbidden

// actForbidden restarts the daemon without the RoleBinding, so that the
// API servers refuse its discovery with 403, and checks it says so and
// serves on its static endpoint and the cache its first run wrote; then
// the RoleBinding returns and discovery must resume.
func actForbidden(rr *rowRun) error {
	c := rr.r.C
	if !rr.waitFor(10*time.Second, func() bool { return cacheLists(c.nodeCachePath(), threeEndpoints()) }) {
		return fmt.Errorf("the endpoint cache %s does not list the three API servers", c.nodeCachePath())
	}
	if err := c.NodeRBAC(rr.ctx, false); err != nil {
		return err
	}
	if err := c.WaitNodeAccess(rr.ctx, false); err != nil {
		return err
	}
	defer func() {
		if err := c.NodeRBAC(context.WithoutCancel(rr.ctx), true); err != nil {
			rr.fail("restore the RoleBinding: %v", err)
		}
	}()
	rr.fault = time.Now()
	if err := rr.restartDaemon([]string{APIAddr("cp1")}); err != nil {
		return err
	}
	if err := rr.checkRefused(); err != nil {
		return err
	}
	sleepCtx(rr.ctx, 15*time.Second) // the workload runs on static and cached endpoints
	if s, err := rr.d.Metrics(); err != nil || s.Value(mDiscoveryRunning, "provider", "kubernetes") != 0 || s.Value(mUpstreamsTotal) != 3 {
		rr.fail("15 s later: discovery_running %v, upstreams %v; want 0 and 3 (%v)",
			s.Value(mDiscoveryRunning, "provider", "kubernetes"), s.Value(mUpstreamsTotal), err)
	}
	if err := c.NodeRBAC(rr.ctx, true); err != nil {
		return err
	}
	restored := time.Now()
	rr.asserts("with the RoleBinding back, discovery runs again within 45 s (its backoff is at most 30 s and a quarter)")
	if rr.waitFor(45*time.Second, func() bool {
		s, err := rr.d.Metrics()
		st, err2 := rr.d.upstream(APIAddr("cp2"))
		return err == nil && err2 == nil && s.Value(mDiscoveryRunning, "provider", "kubernetes") == 1 && st.fromKube
	}) {
		rr.note("discovery running again %s after the RoleBinding returned", time.Since(restored).Round(100*time.Millisecond))
	} else {
		rr.fail("discovery not running within 45s of the RoleBinding's return")
	}
	return nil
}

// restartDaemon stops the row's daemon and starts it again with static
// endpoints, the workload following it.
func (rr *rowRun) restartDaemon(static []string) error {
	if err := rr.d.Stop(); err != nil {
		rr.fail("daemon shutdown: %v", err)
	}
	rr.d = nil
	d, err := rr.r.C.StartDaemon(rr.ctx, DaemonConfig{
		Binary: rr.r.Binary, Mode: rr.row.Mode, Settings: rr.settings(), Endpoints: static, LogPath: rr.logPath,
	})
	if err != nil {
		return fmt.Errorf("restart the daemon: %w", err)
	}
	rr.d = d
	rr.wl.pid = d.Pid()
	rr.lateAfter = time.Now().Add(time.Second)
	return nil
}

// checkRefused checks, within 20 s of the restart, what a 403 must leave:
// an error line naming it and the RBAC, a discovery error, the
// ExtractedprismDiscoveryNotRunning expression holding, and cp2 and cp3
// served from the cache.
func (rr *rowRun) checkRefused() error {
	expr, err := alertExpr("ExtractedprismDiscoveryNotRunning")
	if err != nil {
		return err
	}
	want := mDiscoveryRunning + `{provider="kubernetes"} == 0`
	if expr != want {
		return fmt.Errorf("ExtractedprismDiscoveryNotRunning is %q; this row checks %q", expr, want)
	}
	rr.asserts("without the RoleBinding: an error line naming the 403 and deploy/node-discovery-rbac.yaml, " +
		"discovery_errors_total counting, " + want + " (the alert's expression), cp2 and cp3 served from the cache")
	var last string
	if !rr.waitFor(20*time.Second, func() bool {
		s, err := rr.d.Metrics()
		cp2, err2 := rr.d.upstream(APIAddr("cp2"))
		cp3, err3 := rr.d.upstream(APIAddr("cp3"))
		logged := rr.d.LogContains(`"level":"ERROR"`, "endpointslice list failed", "is forbidden", "system:node:"+nodeName, "node-discovery-rbac.yaml")
		last = fmt.Sprintf("logged %v, running %v, errors %v, cp2 cached %v, cp3 cached %v (%v %v %v)", logged,
			s.Value(mDiscoveryRunning, "provider", "kubernetes"), s.Value(mDiscoveryErrors, "provider", "kubernetes"), cp2.fromCache, cp3.fromCache, err, err2, err3)
		return err == nil && logged && s.Value(mDiscoveryRunning, "provider", "kubernetes") == 0 &&
			s.Value(mDiscoveryErrors, "provider", "kubernetes") >= 1 && cp2.fromCache && cp3.fromCache
	}) {
		rr.fail("within 20s of the restart without the RoleBinding: %s", last)
	} else {
		rr.note("403 reported %s after the restart: %s", time.Since(rr.fault).Round(100*time.Millisecond), last)
	}
	return nil
}

func checkForbidden(rr *rowRun, m Measure) {
	rr.asserts("no short request started more than 1 s after the restarted daemon listens fails")
	if m.Shorts.FailedLate > 0 {
		rr.fail("%d short requests failed after the restarted daemon was listening (first: %s)", m.Shorts.FailedLate, m.Shorts.LateErr)
	}
}

// cacheLists reports whether the endpoint cache at path names every one of
// addrs.
func cacheLists(path string, addrs []string) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if !strings.Contains(string(b), `"`+a+`"`) {
			return false
		}
	}
	return true
}

// alertExpr returns the expression of the alert name in
// deploy/prometheus/alerts.yaml.
func alertExpr(name string) (string, error) {
	path, err := sourceFile("deploy", "prometheus", "alerts.yaml")
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	var rules struct { // a PrometheusRule
		Spec struct {
			Groups []struct {
				Rules []struct {
					Alert string `json:"alert"`
					Expr  string `json:"expr"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	for _, g := range rules.Spec.Groups {
		for _, r := range g.Rules {
			if r.Alert == name {
				return strings.TrimSpace(r.Expr), nil
			}
		}
	}
	return "", fmt.Errorf("%s: no alert %s", path, name)
}
