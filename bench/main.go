// Command bench compares extractedprism with HAProxy and nginx (stream) as
// TCP load balancers in front of the same three local upstreams, with a
// direct connection to the upstreams (no proxy), with gocopy (the smallest
// Go proxy, a reference) and with other extractedprism builds given by
// -ep-alt NAME=PATH. bench/run.sh --baseline REV builds git revision REV
// as the -ep-alt build "baseline", today's build that issue 25's targets
// compare with.
//
// Scenarios, in the order they run: connrate (short connections), reqresp
// (64 B round trips), bulk (downloads), strace (splice calls), idle (RSS
// and descriptors per idle connection), footprint (idle RSS, binary size),
// failover (an upstream killed), fdlimit (more clients than the
// descriptors allow). The idle connection count is lowered to what every
// system can hold: the descriptors of this process and the peers'
// configured limits, and for each extractedprism build, started once
// beforehand, its extractedprism_connection_limit and the descriptors a
// sample of idle connections was measured to hold.
//
// The upstreams (echo and bulk generator) and the load generator run in
// this process, which bench/run.sh pins to CPU 0; every proxy runs under
// `taskset -c 1`. Each scenario repeats the systems interleaved (A, B, C,
// A, B, C, ...) with a fresh proxy process per run, and reports medians.
// All traffic stays on 127.0.0.1, and every loop is bounded in count and
// time.
//
// The report (-o, RESULTS.md by default) starts with the machine, the
// settings and the Targets table, then has a section per scenario and the
// notes. It replaces the file, except for the hand-written section from a
// line "## History" to the end, which it keeps after the new report.
//
// Use bench/run.sh, which builds the binaries and installs the peers; see
// its usage for its options, and go run . -h for the flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

type config struct {
	quick       bool
	reps        int
	slowReps    int           // repetitions of the idle, failover and footprint scenarios
	dur         time.Duration // connection-rate and request/response runs
	bulkBytes   int64         // per stream
	idleConns   int           // asked for; the idle scenario lowers it to what fits
	settle      time.Duration // after the idle connections close, before RSS is read
	failDur     time.Duration
	failKillAt  time.Duration
	out         string
	epBin       string
	epStripped  string
	command     string
	proxyCPU    string
	scenarios   string
	systems     []string
	waitQuiet   time.Duration
	quietLoad   float64
	maxTime     time.Duration
	straceBytes int64
	keepTmp     bool
	upSndBuf    int               // -upstream-sndbuf, bytes; 0 leaves the kernel's autotuning
	alt         map[string]string // -ep-alt: system name → binary
	altNames    []string          // the -ep-alt names, in the order given
}

func main() {
	if gocopyMain(os.Args[1:]) {
		return
	}
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	if err := run(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (*config, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	c := &config{alt: map[string]string{}}
	fs.BoolVar(&c.quick, "quick", false, "smoke run: 1 repetition, short runs, 512 MiB bulk, 2,000 idle connections")
	fs.IntVar(&c.reps, "reps", 5, "repetitions of the connection-rate and request/response scenarios")
	fs.IntVar(&c.slowReps, "slow-reps", 3, "repetitions of the bulk, idle, footprint and failover scenarios")
	fs.DurationVar(&c.dur, "duration", 5*time.Second, "length of one connection-rate or request/response run")
	bulkMiB := fs.Int64("bulk-mib", 2048, "bytes per bulk run, MiB (4 streams carry a quarter each)")
	fs.IntVar(&c.idleConns, "idle-conns", 10000, "idle connections held through each proxy (lowered to what the descriptor and connection limits allow)")
	fs.DurationVar(&c.settle, "settle", 10*time.Second, "wait after the idle connections close before reading RSS")
	fs.DurationVar(&c.failDur, "failover-duration", 10*time.Second, "length of one failover run")
	fs.DurationVar(&c.failKillAt, "failover-kill-at", 3*time.Second, "when the upstream is killed in a failover run")
	fs.StringVar(&c.out, "o", "RESULTS.md", "Markdown report to write; from a line \"## History\" to the end, the file it replaces is kept")
	fs.StringVar(&c.epBin, "ep", "", "extractedprism binary (go build -o X .)")
	fs.StringVar(&c.epStripped, "ep-stripped", "", "extractedprism built with -ldflags='-s -w', for its size")
	fs.StringVar(&c.command, "command", "", "the command line to record in the report")
	fs.StringVar(&c.proxyCPU, "proxy-cpu", "1", "taskset CPU list for the proxies")
	fs.StringVar(&c.scenarios, "scenarios", "connrate,reqresp,bulk,strace,idle,footprint,failover,fdlimit", "scenarios to run")
	systems := fs.String("systems", "direct,haproxy,nginx,extractedprism,gocopy", "systems to compare, in the order each round runs them (gocopy, a reference, runs only in the connection-rate, request/response and bulk scenarios)")
	fs.DurationVar(&c.waitQuiet, "wait-quiet", 0, "wait up to this long for the 1-minute load average to fall below -quiet-load")
	fs.Float64Var(&c.quietLoad, "quiet-load", 1.5, "load average below which the machine counts as quiet")
	fs.DurationVar(&c.maxTime, "max-time", 40*time.Minute, "abort the whole run after this long")
	fs.Func("ep-alt", "other extractedprism builds, NAME=PATH[,NAME=PATH...], repeatable; each runs after extractedprism in every scenario (with -systems given, list the NAMEs there); the targets compare with the one named "+sysBaseline,
		c.addAlt)
	fs.BoolVar(&c.keepTmp, "keep-tmp", false, "keep the temp dir with the peers' configs and logs")
	straceMiB := fs.Int64("strace-mib", 256, "bytes of the bulk download traced with strace, MiB")
	upSndKiB := fs.Int("upstream-sndbuf", 0, "the generating upstreams' SO_SNDBUF, KiB (0: the kernel's autotuning); below the proxies' receive windows, the upstreams send in their own context, not in the proxy's (see the notes)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if c.quick {
		c.applyQuick(set, bulkMiB, straceMiB)
	}
	c.bulkBytes = *bulkMiB << 20
	c.straceBytes = *straceMiB << 20
	c.upSndBuf = *upSndKiB << 10
	c.systems = strings.Split(*systems, ",")
	if !set["systems"] {
		c.systems = withAlts(c.systems, c.altNames)
	}
	return c, c.validate()
}

// addAlt takes one -ep-alt value.
func (c *config) addAlt(v string) error {
	for kv := range strings.SplitSeq(v, ",") {
		name, path, ok := strings.Cut(kv, "=")
		if !ok || name == "" || path == "" {
			return fmt.Errorf("want NAME=PATH, got %q", kv)
		}
		switch name {
		case sysDirect, sysHAProxy, sysNginx, sysEP, sysGoCopy:
			return fmt.Errorf("%s is a built-in system; name the build otherwise", name)
		}
		if _, dup := c.alt[name]; !dup {
			c.altNames = append(c.altNames, name)
		}
		c.alt[name] = path
	}
	return nil
}

// applyQuick shortens the run for -quick, except where a flag was set.
func (c *config) applyQuick(set map[string]bool, bulkMiB, straceMiB *int64) {
	quick := map[string]func(){
		"reps":              func() { c.reps = 1 },
		"slow-reps":         func() { c.slowReps = 1 },
		"duration":          func() { c.dur = 1500 * time.Millisecond },
		"bulk-mib":          func() { *bulkMiB = 512 },
		"idle-conns":        func() { c.idleConns = 2000 },
		"settle":            func() { c.settle = 2 * time.Second },
		"failover-duration": func() { c.failDur = 4 * time.Second },
		"failover-kill-at":  func() { c.failKillAt = 1500 * time.Millisecond },
		"strace-mib":        func() { *straceMiB = 128 },
	}
	for name, apply := range quick {
		if !set[name] {
			apply()
		}
	}
}

// withAlts puts the alternative builds into systems right after
// extractedprism, so every round runs them side by side; at the end when
// extractedprism is not among them.
func withAlts(systems, alts []string) []string {
	i := slices.Index(systems, sysEP)
	if i < 0 {
		return slices.Concat(systems, alts)
	}
	return slices.Concat(systems[:i+1], alts, systems[i+1:])
}

// validate holds the rules across flags.
func (c *config) validate() error {
	var errs []error
	if c.epBin == "" {
		errs = append(errs, errors.New("-ep is required"))
	}
	if c.reps < 1 || c.slowReps < 1 {
		errs = append(errs, errors.New("-reps and -slow-reps must be at least 1"))
	}
	if c.failKillAt >= c.failDur {
		errs = append(errs, errors.New("-failover-kill-at must be less than -failover-duration"))
	}
	for _, s := range c.systems {
		switch s {
		case sysDirect, sysHAProxy, sysNginx, sysEP, sysGoCopy:
		default:
			if _, ok := c.alt[s]; !ok {
				errs = append(errs, fmt.Errorf("-systems: %q is neither a built-in system nor an -ep-alt NAME", s))
			}
		}
	}
	return errors.Join(errs...)
}

// bench is one whole run.
type bench struct {
	cfg  *config
	env  *env
	ups  []*upstream
	rep  strings.Builder // the report body
	tgts [numTargets]target
	note []string

	mu      sync.Mutex
	running map[*instance]bool
	loads   []string // 1-minute load average after each scenario
}

func run(cfg *config) error {
	log.SetFlags(log.Ltime)
	b := &bench{cfg: cfg, running: map[*instance]bool{}}
	nofile := raiseNofile()

	waited, quietAt := b.waitQuiet()
	loadStart := loadAvg()

	tmp, err := os.MkdirTemp("", "ep-bench-")
	if err != nil {
		return err
	}
	if cfg.keepTmp {
		log.Printf("configs and logs in %s", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}
	defer b.closeUpstreams()
	if err := b.startUpstreams(3); err != nil {
		return err
	}
	var addrs []string
	for _, u := range b.ups {
		addrs = append(addrs, u.addr)
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	b.env = &env{tmp: tmp, upstreams: addrs, self: self, epBin: cfg.epBin, alt: cfg.alt, proxyCPU: cfg.proxyCPU, nofile: nofile}

	// Stop every proxy on SIGINT/SIGTERM or when the run takes too long.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, cfg.maxTime)
	defer cancel()
	go b.watchdog(ctx)
	// Runs before cancel: a run that ends with an error is over too, and
	// the watchdog must not report it as interrupted and exit first.
	defer b.markFinished()

	start := time.Now()
	if err := b.runScenarios(); err != nil {
		return err
	}
	b.markFinished()
	took := time.Since(start)
	report := b.header(loadStart, loadAvg(), waited, quietAt, took) + b.targets() + b.rep.String() + b.notes()
	fmt.Fprint(os.Stdout, report)
	if err := writeReport(cfg.out, report); err != nil {
		return err
	}
	log.Printf("wrote %s in %s", cfg.out, took.Round(time.Second)) //nolint:gosec // -o is the operator's own path, logged to the operator's own terminal
	return nil
}

// startUpstreams starts n upstreams on 127.0.0.1 into b.ups.
func (b *bench) startUpstreams(n int) error {
	for range n {
		u, err := startUpstream("127.0.0.1:0", b.cfg.upSndBuf)
		if err != nil {
			return err
		}
		b.ups = append(b.ups, u)
	}
	return nil
}

// closeUpstreams closes every upstream startUpstreams started.
func (b *bench) closeUpstreams() {
	for _, u := range b.ups {
		u.close()
	}
}

// watchdog stops every proxy and exits when ctx ends before the run has
// finished: on SIGINT/SIGTERM, or when the run exceeds -max-time.
func (b *bench) watchdog(ctx context.Context) {
	<-ctx.Done()
	if b.finished() {
		return
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		log.Print("interrupted: stopping the proxies")
	} else {
		log.Printf("run exceeded -max-time %s: stopping the proxies", b.cfg.maxTime)
	}
	b.stopAll()
	os.Exit(3)
}

// The scenarios, by the names -scenarios takes.
const (
	scnConnRate  = "connrate"
	scnReqResp   = "reqresp"
	scnBulk      = "bulk"
	scnStrace    = "strace"
	scnIdle      = "idle"
	scnFootprint = "footprint"
	scnFailover  = "failover"
	scnFDLimit   = "fdlimit"
)

// runScenarios runs the scenarios named in -scenarios, in their fixed
// order, and records the load average after each.
func (b *bench) runScenarios() error {
	scen := map[string]bool{}
	for s := range strings.SplitSeq(b.cfg.scenarios, ",") {
		scen[strings.TrimSpace(s)] = true
	}
	steps := []struct {
		name string
		fn   func() error
	}{
		{scnConnRate, b.connRateScenario},
		{scnReqResp, b.reqRespScenario},
		{scnBulk, b.bulkScenario},
		{scnStrace, b.straceScenario},
		{scnIdle, b.idleScenario},
		{scnFootprint, b.footprintScenario},
		{scnFailover, b.failoverScenario},
		{scnFDLimit, b.fdLimitScenario},
	}
	var loads []string
	for _, s := range steps {
		if !scen[s.name] {
			continue
		}
		log.Printf("scenario %s", s.name)
		if err := s.fn(); err != nil {
			b.stopAll()
			return fmt.Errorf("%s: %w", s.name, err)
		}
		loads = append(loads, fmt.Sprintf("%s %s", s.name, strings.Fields(loadAvg())[0]))
	}
	b.loads = loads
	return nil
}

var finishedMu sync.Mutex
var finishedFlag bool

func (b *bench) finished() bool {
	finishedMu.Lock()
	defer finishedMu.Unlock()
	return finishedFlag
}

func (b *bench) markFinished() {
	finishedMu.Lock()
	defer finishedMu.Unlock()
	finishedFlag = true
}

// raiseNofile lifts this process's open-files limit for the idle scenario;
// children started afterwards inherit it.
// It returns the limit in force. Without CAP_SYS_RESOURCE the hard limit
// cannot be raised, and the soft limit goes up to it.
func raiseNofile() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 1024
	}
	want := syscall.Rlimit{Cur: 1 << 20, Max: 1 << 20}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err != nil {
		rl.Cur = rl.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl)
	}
	_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl)
	return int(min(rl.Cur, 1<<30))
}

// waitQuiet waits, within -wait-quiet, for the load average to drop.
func (b *bench) waitQuiet() (time.Duration, bool) {
	start := time.Now()
	for {
		if loadAvg1() < b.cfg.quietLoad {
			return time.Since(start), true
		}
		if time.Since(start) >= b.cfg.waitQuiet {
			return time.Since(start), false
		}
		log.Printf("load average %s; waiting for < %.1f (up to %s more)", loadAvg(), b.cfg.quietLoad,
			(b.cfg.waitQuiet - time.Since(start)).Round(time.Second))
		time.Sleep(min(15*time.Second, b.cfg.waitQuiet-time.Since(start)+time.Second))
	}
}

func (b *bench) start(name string, o startOpts) (*instance, error) {
	in, err := b.env.start(name, o)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	b.running[in] = true
	b.mu.Unlock()
	return in, nil
}

func (b *bench) stop(in *instance) {
	in.stop()
	b.mu.Lock()
	delete(b.running, in)
	b.mu.Unlock()
}

func (b *bench) stopAll() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for in := range b.running {
		in.stop()
	}
	clear(b.running)
}

// proxies are the load balancers: the systems other than direct and the
// gocopy reference, which has no health checks or limits to measure.
func (b *bench) proxies() []string {
	return b.without(sysDirect, sysGoCopy)
}

// without returns the systems other than those named.
func (b *bench) without(names ...string) []string {
	return slices.DeleteFunc(slices.Clone(b.cfg.systems), func(s string) bool { return slices.Contains(names, s) })
}

// interleave runs fn for every system, reps times, in the order A, B, C,
// A, B, C, each run with a fresh system.
func (b *bench) interleave(systems []string, reps int, o startOpts, fn func(in *instance, rep int) error) error {
	for rep := range reps {
		for _, name := range systems {
			in, err := b.start(name, o)
			if err != nil {
				return err
			}
			err = fn(in, rep)
			alive := in.alive()
			b.stop(in)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			if !alive {
				return fmt.Errorf("%s exited during the run (log %s)", name, in.logPath)
			}
		}
	}
	return nil
}

func (b *bench) section(title, intro string) {
	fmt.Fprintf(&b.rep, "\n## %s\n\n%s\n\n", title, intro)
}

func (b *bench) header(loadStart, loadEnd string, waited time.Duration, quiet bool, took time.Duration) string {
	mi := readMachineInfo()
	// Bounds the version commands below.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var h strings.Builder
	h.WriteString("# extractedprism performance benchmark\n\n")
	fmt.Fprintf(&h, "Generated by `bench/run.sh` on %s in %s.\n\n", time.Now().UTC().Format("2006-01-02 15:04 MST"), took.Round(time.Second))
	cmd := b.cfg.command
	if cmd == "" {
		cmd = strings.Join(os.Args, " ")
	}
	fmt.Fprintf(&h, "Command: `%s`\n\n", cmd)
	h.WriteString("| Machine | |\n|---|---|\n")
	fmt.Fprintf(&h, "| CPUs (nproc) | %d |\n", mi.CPUs)
	fmt.Fprintf(&h, "| CPU model | %s |\n", mi.Model)
	fmt.Fprintf(&h, "| Kernel | %s |\n", mi.Kernel)
	fmt.Fprintf(&h, "| Memory | %s |\n", mi.MemTotal)
	fmt.Fprintf(&h, "| Go | %s |\n", runtime.Version())
	fmt.Fprintf(&h, "| HAProxy | %s |\n", firstLine(exec.CommandContext(ctx, "haproxy", "-v")))
	fmt.Fprintf(&h, "| nginx | %s |\n", firstLine(exec.CommandContext(ctx, "nginx", "-v")))
	fmt.Fprintf(&h, "| Pinning | load generator and upstreams `taskset -c 0`, proxies `taskset -c %s` |\n", b.cfg.proxyCPU)
	fmt.Fprintf(&h, "| Load average (1, 5, 15 min) | start %s, end %s |\n", loadStart, loadEnd)
	fmt.Fprintf(&h, "| 1-minute load after each scenario | %s |\n", strings.Join(b.loads, ", "))
	busy := false
	for _, l := range b.loads {
		var v float64
		_, _ = fmt.Sscanf(strings.Fields(l)[1], "%g", &v)
		busy = busy || v >= b.cfg.quietLoad+1 // the run itself adds about 1
	}
	if quiet && busy {
		h.WriteString("\n**Other work started during the run**: the load average after some scenarios (above) was well over what the benchmark itself causes (about 1), so those scenarios shared the CPUs; their absolute numbers are less reliable than the ratios between systems measured in the same interleaved runs.\n")
	}
	if !quiet {
		fmt.Fprintf(&h, "\n**Measured under load**: the 1-minute load average was %s at the start "+
			"(quiet means below %.1f; waited %s). Other work shared the two CPUs, so absolute "+
			"numbers are low and noisy; the ratios between systems measured in the same interleaved "+
			"runs are more telling than the values.\n", strings.Fields(loadStart)[0], b.cfg.quietLoad, waited.Round(time.Second))
	}
	fmt.Fprintf(&h, "\nSettings: %d repetitions (%d for bulk, idle, footprint and failover), interleaved "+
		"(A, B, C, A, B, C, ...), a fresh proxy process per run; each cell is the median over "+
		"repetitions. Runs of %s; bulk %s per run; %s idle connections. "+
		"Ratios are value ÷ reference: above 1 is more for rates and slower for times.\n",
		b.cfg.reps, b.cfg.slowReps, b.cfg.dur, mib(b.cfg.bulkBytes), fmtNum(float64(b.cfg.idleConns), 0))
	return h.String()
}

func mib(n int64) string {
	if n >= 1<<30 && n%(1<<30) == 0 {
		return fmt.Sprintf("%d GiB", n>>30)
	}
	return fmt.Sprintf("%d MiB", n>>20)
}

// firstLine runs cmd and returns the first line it prints, or "not
// installed" when it fails without output.
func firstLine(cmd *exec.Cmd) string {
	out, err := cmd.CombinedOutput()
	if err != nil && len(out) == 0 {
		return "not installed"
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return line
}

func (b *bench) notes() string {
	var s strings.Builder
	s.WriteString("\n## Notes\n\n")
	for _, n := range b.note {
		s.WriteString("- " + n + "\n")
	}
	for _, n := range staticNotes {
		s.WriteString("- " + n + "\n")
	}
	return s.String()
}

var staticNotes = []string{
	"The upstreams are three in-process servers on 127.0.0.1 (echo; or a generator that sends a requested number of bytes and closes). They run on CPU 0 with the load generator, so the direct row measures client plus server on one CPU, and a proxy adds a second CPU to the pipeline: a proxied run can be faster than direct.",
	"HAProxy: `mode tcp`, `nbthread 1`, `balance random`, `check inter 2s fall 2 rise 1`, `retries 3`, `option redispatch`, `timeout connect 1s`, global `maxconn` from the inherited descriptor limit (two per connection, at most 100,000); default buffers and no `option splice-*` (HAProxy splices only when told to). nginx: stream module, `worker_processes 1`, `random` balancing, `max_fails=2 fail_timeout=2s` (passive checks; nginx has no active ones), `proxy_next_upstream on`, `proxy_next_upstream_tries 3`, `proxy_connect_timeout 1s`, `worker_rlimit_nofile` the inherited limit. extractedprism: `--enable-discovery=false --health-interval 2s --health-timeout 1s`, random selection, built with plain `go build`; the same for baseline, built by `bench/run.sh --baseline REV` from revision REV in a temporary git worktree. Every proxy is a child process of the bench, under `taskset -c 1`, with its config in a temp dir.",
	"gocopy is a reference, not a load balancer: the bench binary itself as the smallest Go TCP proxy (accept, dial the next upstream in turn, `io.Copy` each way, which splices TCP to TCP on Linux; no health checks, retries or limits), under the same `taskset`. It shows what Go's `net` package and runtime cost on this machine, which every Go proxy pays; it runs only in the connection-rate, request/response and bulk scenarios, as the others measure the health checks and limits it does not have.",
	"Proxy CPU is utime+stime of the proxying process (nginx: its worker) from /proc/PID/stat before and after the run (10 ms resolution). GB is 10^9 bytes.",
	"On loopback the kernel sends and receives a segment in the context of the process whose call releases it, so proxy CPU includes some of its peers' TCP work: an upstream whose send buffer holds more than the proxy's receive window sends the rest when the proxy's window update reaches it, on the proxy's CPU. extractedprism fixes that window (SO_RCVBUF 256 KiB, issue 26) while the others autotune theirs, so its bulk CPU also counts much of the upstream's sending and of the receiving into the proxy's socket (in one 1 GiB download, 80 % of the segments went out on the proxy's CPU against 35 % without the bound); across a network that work stays on the API server and the NIC's interrupts. With `-upstream-sndbuf 128` the upstreams stay within the window and the bound's share drops out.",
	"Idle memory is the VmRSS delta of the proxying process divided by the connections; the descriptor count is /proc/PID/fd before and with the connections open, by kind from the links' targets (socket:, pipe:). Kernel memory is not in RSS: the kernel column is the delta of the machine's SUnreclaim (slab, where sockets and pipe rings live) per connection, so it includes the client's and the upstream's sockets, the same for every system.",
	"Failover: workers start short connections (connect, 64 B echo, close) at a fixed pace; one of the three upstreams is killed mid-run (listener and connections closed, so new dials to it are refused). 'Failed new' counts connections started after the kill that failed; 'broken in flight' those started before it that failed (they were on the killed upstream). Recovery is the time from the kill to the end of the last new connection that failed or took over 100 ms; 0 when there was none.",
}
