// Command fleet measures what a fleet of extractedprism daemons costs one
// real kube-apiserver: it starts etcd and kube-apiserver on 127.0.0.1, then
// for each daemon binary given, -nodes daemons probing it with readyz (a
// client certificate, as the kubelet's), and reports the API server's CPU
// seconds per 1,000 probes, probes per second, the TLS handshakes it
// counted as failed, and the peak of new connections per 100 ms against
// the mean (the lockstep a fleet started together probes in). A probe is
// counted as the API server counts GET /readyz
// (apiserver_request_total{subresource="/readyz"}): whether a probe
// connects afresh or goes over a kept connection, it asks /readyz once,
// and nothing else asks it meanwhile. Every daemon runs discovery too (an
// admin kubeconfig), so its start-up list is one of the fleet's lists; the
// API server's metrics then say where those lists were served from: the
// watch cache or etcd. -pki rsa gives every certificate an RSA-2048 key,
// as kubeadm does, instead of ECDSA P-256.
//
//	go run ./cmd/fleet -daemon before=/tmp/ep-old -daemon after=/tmp/ep-new
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/extractedprism/extractedprism/e2e/controlplane"
	"github.com/extractedprism/extractedprism/e2e/harness"
	"github.com/extractedprism/extractedprism/e2e/pki"
	"github.com/extractedprism/extractedprism/e2e/proc"
)

type daemonFlag []string

func (d *daemonFlag) String() string     { return strings.Join(*d, ",") }
func (d *daemonFlag) Set(s string) error { *d = append(*d, s); return nil }

type options struct {
	nodes              int
	interval, duration time.Duration
	daemons            daemonFlag // name=path
	profile            string     // a directory for the API server's CPU profiles, or ""
	kinds              string     // probe kinds to measure instead of daemons
	rate               int        // probes per second of each kind
	fault              string     // removal, quorum or restore: measure the moves after it instead
	watchers           int        // long-lived connections per daemon, with -fault
	drain              time.Duration
	periods            string // with -fault restore: the --rebalance-period values to compare
	observe            time.Duration
	observeStep        time.Duration
	keys               string // the certificates' keys: ecdsa or rsa
}

// result is one daemon binary's figures.
type result struct {
	name                 string
	apiCPU, idleCPU      time.Duration // over the measured window, and the same window idle
	peak100ms, mean100ms float64
	counts               apiCounts // over the measured window (lists: from before the fleet started)
}

// apiCounts are counters of the API server: GET /readyz requests, TLS
// handshakes it counted as failed, and EndpointSlice lists: served from
// the watch cache, read from etcd, and the etcd requests for the current
// revision a consistent list from the cache makes.
type apiCounts struct{ readyz, handshakeErrors, cache, etcd, currentRV int }

func (a apiCounts) minus(b apiCounts) apiCounts {
	return apiCounts{a.readyz - b.readyz, a.handshakeErrors - b.handshakeErrors, a.cache - b.cache, a.etcd - b.etcd, a.currentRV - b.currentRV}
}

func main() {
	var o options
	flag.IntVar(&o.nodes, "nodes", 100, "daemons to run, each a node")
	flag.DurationVar(&o.interval, "interval", 5*time.Second, "the daemons' --health-interval")
	flag.DurationVar(&o.duration, "duration", 30*time.Second, "measured window per binary")
	flag.Var(&o.daemons, "daemon", "name=path of an extractedprism binary; repeat to compare")
	flag.StringVar(&o.profile, "profile", "", "write the API server's CPU profile over each measured window to DIR/<name>.pprof")
	flag.StringVar(&o.kinds, "kinds", "", "measure these probe kinds (connect,full,resume,kept,kept-only,full-anon,kept-anon) instead of daemons")
	flag.IntVar(&o.rate, "rate", 100, "probes per second of each kind, with -kinds")
	flag.StringVar(&o.fault, "fault", "", "removal, quorum or restore: the fault of one of 3 API servers to measure the fleet's reconnects after")
	flag.IntVar(&o.watchers, "watchers", 6, "long-lived connections (watches) per daemon, with -fault")
	flag.DurationVar(&o.drain, "drain-timeout", 5*time.Second, "the daemons' --drain-timeout, with -fault")
	flag.StringVar(&o.periods, "rebalance-periods", "0,1m", "with -fault restore: the daemons' --rebalance-period values to compare, comma-separated")
	flag.DurationVar(&o.observe, "observe", 8*time.Minute, "with -fault restore: how long to follow the restored API server's share")
	flag.DurationVar(&o.observeStep, "observe-step", 30*time.Second, "with -fault restore: how often to count it")
	flag.StringVar(&o.keys, "pki", "ecdsa", "the keys of the CA and every certificate: ecdsa (P-256) or rsa (2048 bits)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if o.fault != "" {
		run := runFaults
		if o.fault == "restore" {
			run = runRestores
		}
		if err := run(ctx, o); err != nil {
			fmt.Fprintln(os.Stderr, "fleet:", err)
			os.Exit(1)
		}
		return
	}
	if o.kinds != "" {
		rs, err := measureKinds(ctx, o, splitKinds(o.kinds), o.rate)
		if err != nil {
			fmt.Fprintln(os.Stderr, "fleet:", err)
			os.Exit(1)
		}
		reportKinds(o, o.rate, rs)
		return
	}
	if len(o.daemons) == 0 {
		fmt.Fprintln(os.Stderr, "fleet: give at least one -daemon name=path, or -kinds")
		os.Exit(2)
	}
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "fleet:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	var results []result
	for _, d := range o.daemons {
		name, path, ok := strings.Cut(d, "=")
		if !ok {
			return fmt.Errorf("-daemon %q: want name=path", d)
		}
		r, err := measure(ctx, o, name, path)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		results = append(results, r)
	}
	report(o, results)
	return nil
}

// measure runs one fleet of binary against a new control plane.
func measure(ctx context.Context, o options, name, binary string) (result, error) {
	l, err := controlplane.StartLocal(ctx, localOptions(o))
	if err != nil {
		return result{}, err
	}
	defer l.Stop()
	client, err := l.CA.Client("node", "system:node:fleet", "system:nodes")
	if err != nil {
		return result{}, err
	}
	r := result{name: name}
	start, err := readCounts(l)
	if err != nil {
		return r, err
	}
	// The API server alone, over the same window, for what it costs idle.
	idle0 := cpuTime(l.APIServerPid())
	time.Sleep(o.duration)
	r.idleCPU = cpuTime(l.APIServerPid()) - idle0
	daemons, err := startFleet(o, binary, l, client)
	defer stopFleet(daemons)
	if err != nil {
		return r, err
	}
	time.Sleep(2 * o.interval) // every daemon past its first checks
	r.apiCPU, r.counts, err = window(o, name, l, func() { r.peak100ms, r.mean100ms = sampleOpens(ctx, o.duration) })
	if err != nil {
		return r, err
	}
	end, err := readCounts(l)
	if err != nil {
		return r, err
	}
	lists := end.minus(start) // with every daemon's start-up list
	r.counts.cache, r.counts.etcd, r.counts.currentRV = lists.cache, lists.etcd, lists.currentRV
	for _, d := range daemons {
		if exited, err := d.Exited(); exited {
			return r, fmt.Errorf("a daemon exited (%v): %s", err, d.Tail(1000))
		}
	}
	return r, nil
}

func localOptions(o options) controlplane.LocalOptions {
	lo := controlplane.LocalOptions{Keys: pki.Keys(o.keys)}
	if o.profile != "" {
		lo.ExtraAPIServerArgs = []string{"--profiling=true"} // the last of a flag wins
	}
	return lo
}

func startFleet(o options, binary string, l *controlplane.Local, client pki.Pair) ([]*proc.Process, error) {
	var ps []*proc.Process
	for i := range o.nodes {
		port := 20000 + 2*i
		p, err := proc.Start("extractedprism", filepath.Join(l.Dir, "daemon-"+strconv.Itoa(i)+".log"), []string{binary,
			"--endpoints", l.Addr, "--kubeconfig", l.Kubeconfig, "--bind-port", strconv.Itoa(port), "--health-port", strconv.Itoa(port + 1),
			"--health-check", "readyz", "--health-check-ca-file", l.CA.CertFile(), "--health-check-server-name", "kubernetes.default.svc",
			"--health-check-cert-file", client.Cert, "--health-check-key-file", client.Key,
			"--health-interval", o.interval.String(), "--health-timeout", (o.interval / 2).String(), "--log-level", "warn",
		}, nil)
		if err != nil {
			return ps, err
		}
		ps = append(ps, p)
	}
	return ps, nil
}

func stopFleet(ps []*proc.Process) {
	for _, p := range ps {
		_ = p.Signal(syscall.SIGTERM)
	}
	for _, p := range ps {
		_ = p.Stop(10 * time.Second)
	}
}

// window runs fn, the measured window, and returns the API server's CPU
// time and the change of its counters over it.
func window(o options, name string, l *controlplane.Local, fn func()) (time.Duration, apiCounts, error) {
	before, err := readCounts(l)
	if err != nil {
		return 0, apiCounts{}, err
	}
	cpu0 := cpuTime(l.APIServerPid())
	profiled := make(chan error, 1)
	go func() { profiled <- profile(o, name, l) }()
	fn()
	cpu := cpuTime(l.APIServerPid()) - cpu0
	if err := <-profiled; err != nil {
		return cpu, apiCounts{}, err
	}
	after, err := readCounts(l)
	return cpu, after.minus(before), err
}

// profile fetches the API server's CPU profile over the measured window
// into o.profile/<name>.pprof, when asked for; its own connection is one
// more accepted connection, against hundreds of probes.
func profile(o options, name string, l *controlplane.Local) error {
	if o.profile == "" {
		return nil
	}
	body, err := adminGet(l, "/debug/pprof/profile?seconds="+strconv.Itoa(int(o.duration.Seconds())), o.duration+30*time.Second)
	if err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	return os.WriteFile(filepath.Join(o.profile, name+".pprof"), body, 0o644)
}

// adminGet reads path from the API server as its admin.
func adminGet(l *controlplane.Local, path string, timeout time.Duration) ([]byte, error) {
	cfg, err := controlplane.ClientTLS(l.CA, l.Admin, "")
	if err != nil {
		return nil, err
	}
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: timeout}
	resp, err := c.Get("https://" + l.Addr + path)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return io.ReadAll(resp.Body)
}

// readCounts reads apiCounts from the API server's metrics.
func readCounts(l *controlplane.Local) (apiCounts, error) {
	body, err := adminGet(l, "/metrics", 10*time.Second)
	if err != nil {
		return apiCounts{}, err
	}
	m := harness.ParseMetrics(string(body))
	return apiCounts{
		readyz:          int(m.Sum("apiserver_request_total", "subresource", "/readyz")),
		handshakeErrors: int(m.Value("apiserver_tls_handshake_errors_total")),
		cache:           int(m.Sum("apiserver_storage_list_total", "resource", "endpointslices", "storage", "watchcache")),
		etcd:            int(m.Sum("apiserver_storage_list_total", "resource", "endpointslices", "storage", "etcd")),
		currentRV:       int(m.Sum("etcd_request_duration_seconds_count", "resource", "endpointslices", "operation", "getCurrentResourceVersion")),
	}, nil
}

// sampleOpens counts accepted connections per 100 ms over d and returns
// the peak and the mean.
func sampleOpens(ctx context.Context, d time.Duration) (peak, mean float64) {
	var counts []int
	last := passiveOpens()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for end := time.Now().Add(d); time.Now().Before(end); {
		select {
		case <-ctx.Done():
			return 0, 0
		case <-t.C:
		}
		n := passiveOpens()
		counts = append(counts, n-last)
		last = n
	}
	if len(counts) == 0 {
		return 0, 0
	}
	sum := 0
	for _, c := range counts {
		sum += c
	}
	return float64(slices.Max(counts)), float64(sum) / float64(len(counts))
}

// cpuTime is the user and system time of pid from /proc/<pid>/stat.
func cpuTime(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The fields after the command, which is in parentheses and may hold spaces.
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.Atoi(f[11])
	stime, _ := strconv.Atoi(f[12])
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ
}

// passiveOpens is the host's Tcp PassiveOpens counter.
func passiveOpens() int {
	b, err := os.ReadFile("/proc/net/snmp")
	if err != nil {
		return 0
	}
	var names []string
	for line := range strings.SplitSeq(string(b), "\n") {
		rest, ok := strings.CutPrefix(line, "Tcp: ")
		if !ok {
			continue
		}
		if names == nil {
			names = strings.Fields(rest)
			continue
		}
		if i := slices.Index(names, "PassiveOpens"); i >= 0 {
			if v := strings.Fields(rest); i < len(v) {
				n, _ := strconv.Atoi(v[i])
				return n
			}
		}
	}
	return 0
}

func report(o options, rs []result) {
	fmt.Printf("fleet: %d daemons, readyz every %s (client certificate, %s keys), %s measured per binary, one kube-apiserver\n\n", o.nodes, o.interval, o.keys, o.duration)
	fmt.Println("| daemon | probes (GET /readyz) | probes/s | API server CPU ms per probe (idle subtracted) | TLS handshake errors | new connections per 100 ms, peak / mean |")
	fmt.Println("|---|---|---|---|---|---|")
	for _, r := range rs {
		fmt.Printf("| %s | %d | %.1f | %.3f | %d | %.0f / %.1f |\n", r.name, r.counts.readyz, float64(r.counts.readyz)/o.duration.Seconds(),
			perProbe(r), r.counts.handshakeErrors, r.peak100ms, r.mean100ms)
	}
	fmt.Println("\n| daemon | EndpointSlice lists from the watch cache | from etcd | etcd requests for the current revision |")
	fmt.Println("|---|---|---|---|")
	for _, r := range rs {
		fmt.Printf("| %s | %d | %d | %d |\n", r.name, r.counts.cache, r.counts.etcd, r.counts.currentRV)
	}
	if len(rs) == 2 && perProbe(rs[1]) > 0 {
		fmt.Printf("\n%s costs the API server %.1f times less per probe than %s\n", rs[1].name, perProbe(rs[0])/perProbe(rs[1]), rs[0].name)
	}
}

// perProbe is the API server's CPU milliseconds per probe, idle subtracted.
func perProbe(r result) float64 {
	if r.counts.readyz == 0 {
		return 0
	}
	return float64((r.apiCPU - r.idleCPU).Microseconds()) / 1000 / float64(r.counts.readyz)
}
