package harness

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// Row is one line of the result table: a scenario in a mode.
type Row struct {
	Scenario string
	Mode     Mode
}

// Name is the row's test name, such as "kill/readyz-random".
func (r Row) Name() string {
	return r.Scenario + "/" + strings.NewReplacer("/", "-", "+", "-").Replace(r.Mode.String())
}

var (
	tcpRandom         = Mode{HealthCheck: "tcp", Selection: "random"}
	tcpLatency        = Mode{HealthCheck: "tcp", Selection: "latency"}
	readyzRandom      = Mode{HealthCheck: "readyz", Selection: "random"}
	readyzRandomCert  = Mode{HealthCheck: "readyz", Selection: "random", ProbeCert: true}
	readyzLatency     = Mode{HealthCheck: "readyz", Selection: "latency"}
	tcpRandomNode     = Mode{HealthCheck: "tcp", Selection: "random", Node: true}
	readyzRandomNode  = Mode{HealthCheck: "readyz", Selection: "random", Node: true}
	readyzLatencyCert = Mode{HealthCheck: "readyz", Selection: "latency", ProbeCert: true}
)

// DefaultRows are the scenarios in priority order, each in tcp mode and in
// readyz mode, with latency selection where the upstream set changes under
// load, the faults once more as the chart runs the daemon by default, and
// the node-level instance on the kubelet's credentials (Mode.Node).
// All API servers here are equally close, so latency selection is
// expected to behave like random; its rows check that it does.
func DefaultRows() []Row {
	return []Row{
		{"steady", tcpRandom},
		{"steady", readyzRandom},
		{"steady", tcpLatency},
		{"steady", readyzLatencyCert},
		{"compaction", tcpRandom},
		{"compaction", readyzRandom},
		{"membership", tcpRandom},
		{"membership", readyzRandom},
		{"kill", tcpRandom},
		{"kill", readyzRandom},
		{"kill", readyzLatency},
		{"blackhole", tcpRandom},
		{"blackhole", readyzRandom},
		{"blackhole", tcpLatency},
		{"quorum", tcpRandom},
		{"quorum", readyzRandomCert},
		{"kill", chartDefaults},
		{"blackhole", chartDefaults},
		{"quorum", chartDefaults},
		{"restart", tcpRandom},
		{"restart", readyzRandom},
		{"membership", tcpRandomNode},
		{"membership", readyzRandomNode},
		{"rotation", readyzRandomNode},
		{"forbidden", readyzRandomNode},
		{"lb-restart", tcpRandom},
		{"lb-restart", readyzRandom},
		{"lb-upgrade", tcpRandom},
		{"lb-upgrade", readyzRandom},
		{"rebalance", chartDefaults},
	}
}

// Status of a row.
const (
	StatusPass     = "pass"
	StatusFail     = "FAIL"
	StatusNotBuilt = "not built"
	StatusError    = "error"
)

// Result is one row's outcome.
type Result struct {
	Row
	Status   string
	Failures []string // broken assertions (Status FAIL)
	Err      string   // why the row could not run (Status error, not built)
	Notes    []string // observations
	Victim   string
	Measure  Measure
	Elapsed  time.Duration
	Asserted []string // what the row checks, for the table's legend
}

// Runner runs rows against one cluster, one at a time.
type Runner struct {
	C        *Cluster
	Binary   string // extractedprism
	Settings Settings
	Dir      string // daemon logs
	Logf     func(format string, args ...any)

	mu     sync.Mutex // guards probed, n
	probed map[Mode]error
	n      int
}

// Run runs one row. It never panics on a failed assertion: those go to
// Result.Failures.
func (r *Runner) Run(ctx context.Context, row Row) (res Result) {
	start := time.Now()
	res.Row = row
	defer func() { res.Elapsed = time.Since(start) }()
	sc, ok := scenarios[row.Scenario]
	if !ok {
		res.Status, res.Err = StatusError, "unknown scenario "+row.Scenario
		return res
	}
	if err := r.probe(ctx, row.Mode); err != nil {
		res.Status, res.Err = StatusError, err.Error()
		if errors.Is(err, ErrNotBuilt) {
			res.Status = StatusNotBuilt
		}
		return res
	}
	r.mu.Lock()
	r.n++
	n := r.n
	r.mu.Unlock()
	err := r.attempt(ctx, sc, &res, n, "")
	if err != nil {
		// Once more from a restored cluster: a row that could not run is
		// most often the environment (a slow restart on a loaded machine).
		r.logf("[%s] could not run, retrying once: %v", row.Name(), err)
		first := firstLine(err.Error())
		res = Result{Row: row}
		err = r.attempt(ctx, sc, &res, n, "-retry")
		res.Notes = append(res.Notes, "retried once; the first attempt could not run: "+first)
	}
	switch {
	case err != nil:
		res.Status, res.Err = StatusError, err.Error()
	case len(res.Failures) > 0:
		res.Status = StatusFail
	default:
		res.Status = StatusPass
	}
	return res
}

// attempt runs a row once; its error means the row could not run.
func (r *Runner) attempt(ctx context.Context, sc scenario, res *Result, n int, suffix string) error {
	rr := &rowRun{r: r, row: res.Row, res: res, ctx: ctx, n: n, namespace: fmt.Sprintf("e2e-%02d%s", n, suffix),
		logPath: filepath.Join(r.Dir, fmt.Sprintf("extractedprism-%02d-%s%s.log", n, strings.ReplaceAll(res.Row.Name(), "/", "-"), suffix))}
	return rr.run(sc)
}

// probe checks once per mode whether the daemon accepts it.
func (r *Runner) probe(ctx context.Context, m Mode) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.probed == nil {
		r.probed = map[Mode]error{}
	}
	if err, ok := r.probed[m]; ok {
		return err
	}
	name := strings.NewReplacer("/", "-", "+", "-").Replace(m.String())
	err := r.C.ProbeMode(ctx, r.Binary, m, filepath.Join(r.Dir, "probe-"+name+".log"))
	r.probed[m] = err
	return err
}

func (r *Runner) logf(format string, args ...any) {
	if r.Logf != nil {
		r.Logf(format, args...)
	}
}

// rowRun is the state of one running row, handed to the scenario.
type rowRun struct {
	r         *Runner
	row       Row
	res       *Result
	ctx       context.Context
	n         int
	namespace string // of the workload's ConfigMaps
	logPath   string

	d  *Daemon
	wl *Workload
	// discoveryPorts are the local ports of the daemon's connections to
	// the API server its own discovery connection goes to, that one among
	// them (with readyz, the probe's kept connection to it too: cutting
	// both costs one more handshake, nothing else); discoveryRemote is that
	// server.
	discoveryPorts  []int
	discoveryRemote string

	fault     time.Time // zero: no fault
	lateAfter time.Time // short-request failures after this are late

	nodeCertExpiry  time.Time     // Mode.Node: when the first node certificate expires
	rebalancePeriod time.Duration // the scenario's, if any
	handover        string        // the daemon's --handover-socket, if any
}

func (rr *rowRun) logf(format string, args ...any) {
	rr.r.logf("[%s] "+format, append([]any{rr.row.Name()}, args...)...)
}

func (rr *rowRun) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	rr.logf("FAIL: %s", msg)
	rr.res.Failures = append(rr.res.Failures, msg)
}

func (rr *rowRun) note(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	rr.logf("%s", msg)
	rr.res.Notes = append(rr.res.Notes, msg)
}

func (rr *rowRun) asserts(what string) {
	rr.res.Asserted = append(rr.res.Asserted, what)
}

// settings is the row's timing: the chart's for its mode, else the suite's,
// with the scenario's rebalance period.
func (rr *rowRun) settings() Settings {
	s := rr.r.Settings
	if rr.row.Mode.Chart {
		s = ChartSettings
	}
	if rr.rebalancePeriod != 0 {
		s.RebalancePeriod = rr.rebalancePeriod
	}
	return s
}

// scenario is one kind of row.
type scenario struct {
	// static endpoints; nil means the three control-plane nodes (in
	// Mode.Node, cp1 alone).
	static func() []string
	// nodeCertValidity is how long the first node certificate of a
	// Mode.Node row is valid; zero means nodeCertValidity.
	nodeCertValidity time.Duration
	// activated runs the daemon under socket activation (activation.go).
	activated bool
	// handover gives the daemon a --handover-socket (lbscenarios.go).
	handover bool
	// rebalancePeriod, when not zero, is the daemon's --rebalance-period.
	rebalancePeriod time.Duration
	// act injects the fault and observes; it sets rr.fault and
	// rr.lateAfter. Its error means the row could not run.
	act func(rr *rowRun) error
	// check asserts on what the clients saw.
	check func(rr *rowRun, m Measure)
}

func threeEndpoints() []string {
	var eps []string
	for _, n := range CPNames {
		eps = append(eps, APIAddr(n))
	}
	return eps
}

// run restores the cluster, starts the daemon and the workload, runs the
// scenario and checks the outcome.
func (rr *rowRun) run(sc scenario) error {
	ctx, cancel := context.WithTimeout(rr.ctx, 10*time.Minute)
	defer cancel()
	rr.rebalancePeriod = sc.rebalancePeriod
	rctx, rcancel := context.WithTimeout(ctx, 4*time.Minute)
	err := rr.r.C.Restore(rctx)
	rcancel()
	if err != nil {
		return fmt.Errorf("restore the cluster: %w", err)
	}
	static, err := rr.staticEndpoints(ctx, sc)
	if err != nil {
		return err
	}
	if sc.handover {
		if err := rr.handoverSocket(); err != nil {
			return err
		}
	}
	if err := rr.startDaemon(ctx, static, sc.activated); err != nil {
		return err
	}
	defer func() {
		if rr.d != nil {
			if err := rr.d.Stop(); err != nil {
				rr.fail("daemon shutdown: %v", err)
			}
		}
	}()
	rr.wl, err = rr.r.C.StartWorkload(ctx, rr.namespace, rr.d.Pid(), 3)
	if err != nil {
		return fmt.Errorf("start the workload: %w", err)
	}
	stopped := false
	defer func() {
		if !stopped {
			rr.wl.Stop()
		}
	}()
	for _, w := range rr.wl.Watchers() {
		rr.logf("watcher %d on %s", w.ID, orUnknown(w.Upstream))
	}
	sleepCtx(ctx, 5*time.Second) // warm-up: steady traffic before any fault

	if err := sc.act(rr); err != nil {
		return err
	}
	if rr.d != nil && rr.d.Exited() {
		rr.fail("the daemon exited during the scenario:\n%s", rr.d.proc.Tail(2000))
	}
	rr.wl.Stop()
	stopped = true
	m := rr.wl.Measure(rr.fault, rr.lateAfter, time.Now())
	rr.res.Measure = m
	sc.check(rr, m)
	return nil
}

// staticEndpoints are the row's static endpoints. In Mode.Node they are
// cp1 alone, with the kubelet's credentials and the RBAC prepared: the
// others come from discovery.
func (rr *rowRun) staticEndpoints(ctx context.Context, sc scenario) ([]string, error) {
	if rr.row.Mode.Node {
		rr.nodeCertExpiry = time.Now().Add(cmp.Or(sc.nodeCertValidity, nodeCertValidity))
		if err := rr.r.C.prepareNode(ctx, rr.nodeCertExpiry); err != nil {
			return nil, fmt.Errorf("node credentials: %w", err)
		}
		return []string{APIAddr("cp1")}, nil
	}
	if sc.static != nil {
		return sc.static(), nil
	}
	return threeEndpoints(), nil
}

// startDaemon starts extractedprism and waits until it is ready, its
// discovery has listed the three API servers and it knows exactly three
// upstreams; then it notes the discovery connection.
func (rr *rowRun) startDaemon(ctx context.Context, static []string, activated bool) error {
	d, err := rr.r.C.StartDaemon(ctx, DaemonConfig{
		Binary: rr.r.Binary, Mode: rr.row.Mode, Settings: rr.settings(), Endpoints: static, LogPath: rr.logPath, Activated: activated,
		Handover: rr.handover,
	})
	if err != nil {
		return err
	}
	rr.d = d
	if err := rr.waitDaemonReady(30 * time.Second); err != nil {
		return err
	}
	// Before the workload starts, the lasting connections to API servers
	// are discovery's own (through the daemon's listener, so counted in
	// /upstreams) and, with readyz, the probes' kept ones; checks come and
	// go.
	conns := newConnsSince(d.Pid(), nil)
	remote, err := d.onlyProxiedUpstream()
	for port, r := range conns {
		if err == nil && r == remote {
			rr.discoveryPorts = append(rr.discoveryPorts, port)
		}
	}
	if len(rr.discoveryPorts) == 0 {
		rr.logf("connections to API servers at start-up, by local port: %v (%v)", conns, err)
		return nil
	}
	slices.Sort(rr.discoveryPorts)
	rr.discoveryRemote = remote
	return nil
}

// cutDiscovery kills the daemon's discovery connection (see
// discoveryPorts) with ss -K and waits until it is gone.
func (rr *rowRun) cutDiscovery() error {
	for _, port := range rr.discoveryPorts {
		if out, err := rr.r.C.ExecW1(rr.ctx, "ss", "-K", "-tn", "state", "established", "sport", "=", fmt.Sprintf(":%d", port)); err != nil {
			return fmt.Errorf("ss -K: %v: %s", err, out)
		}
	}
	if !rr.waitFor(10*time.Second, func() bool {
		conns, err := upstreamConns(rr.d.Pid())
		if err != nil {
			return false
		}
		for _, port := range rr.discoveryPorts {
			if _, open := conns[port]; open {
				return false
			}
		}
		return true
	}) {
		return fmt.Errorf("discovery's connection from ports %v still open 10s after ss -K", rr.discoveryPorts)
	}
	return nil
}

// waitDaemonReady waits for /readyz 200, a Kubernetes discovery update and
// three known upstreams, with readyz all three ready: a probe credential
// the API servers refuse fails the row here.
func (rr *rowRun) waitDaemonReady(timeout time.Duration) error {
	var last string
	ok := rr.waitFor(timeout, func() bool {
		code, _, err := rr.d.Get("/readyz")
		if err != nil || code != 200 {
			last = fmt.Sprintf("/readyz: %d %v", code, err)
			return false
		}
		s, err := rr.d.Metrics()
		if err != nil {
			last = err.Error()
			return false
		}
		updates := s.Value("extractedprism_discovery_updates_total", "provider", "kubernetes")
		total := s.Value("extractedprism_upstreams_total")
		ready := 3.0
		if rr.row.Mode.HealthCheck == "readyz" {
			ready = s.Sum(mReady)
		}
		last = fmt.Sprintf("kubernetes discovery updates %v, upstreams %v, ready %v", updates, total, ready)
		return updates >= 1 && total == 3 && ready == 3
	})
	if !ok {
		return fmt.Errorf("daemon not ready with discovery within %s (%s)\n%s", timeout, last, rr.d.proc.Tail(3000))
	}
	return nil
}

// waitFor polls cond every 250 ms until it holds or timeout passes.
func (rr *rowRun) waitFor(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) || rr.ctx.Err() != nil {
			return false
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// sample scrapes the daemon's metrics every second for d, handing each
// scrape to fn.
func (rr *rowRun) sample(d time.Duration, fn func(now time.Time, s Samples)) {
	end := time.Now().Add(d)
	for time.Now().Before(end) && rr.ctx.Err() == nil {
		if s, err := rr.d.Metrics(); err == nil {
			fn(time.Now(), s)
		}
		time.Sleep(time.Second)
	}
}

// victim is the control-plane node of watcher 0's connection, so that the
// fault hits at least one watcher; cp1 if that is unknown.
func (rr *rowRun) victim() string {
	if ws := rr.wl.Watchers(); len(ws) > 0 {
		for _, n := range CPNames {
			if ws[0].Upstream == APIAddr(n) {
				return n
			}
		}
	}
	rr.note("watcher 0's upstream is unknown; the fault goes to cp1")
	return "cp1"
}

func orUnknown(s string) string {
	if s == "" {
		return "?"
	}
	return s
}
