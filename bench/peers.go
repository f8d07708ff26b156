package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The systems under test. direct is no proxy at all: the client connects
// to the upstreams itself, round-robin.
const (
	sysDirect  = "direct"
	sysHAProxy = "haproxy"
	sysNginx   = "nginx"
	sysEP      = "extractedprism"
	sysGoCopy  = "gocopy" // the reference Go proxy; see serveGoCopy
	// sysBaseline is the -ep-alt build that bench/run.sh --baseline REV
	// makes of "today's build", which some targets are measured against.
	sysBaseline = "baseline"
)

// env is what every system is started from.
type env struct {
	tmp       string            // config files and logs
	upstreams []string          // the three upstream addresses
	self      string            // this binary, which serves as sysGoCopy
	epBin     string            // extractedprism binary
	alt       map[string]string // other extractedprism builds to compare: system name → binary
	proxyCPU  string            // taskset CPU list for the proxies
	nofile    int               // the open-files limit the proxies inherit
	seq       int               // makes config and log names unique
}

// startOpts vary a start for one scenario.
type startOpts struct {
	// nofile, when not 0, is the open-files limit (soft and hard) the proxy
	// runs under, and the peers are configured to derive their connection
	// limits from it instead of raising it.
	nofile int
}

// instance is one running system.
type instance struct {
	name       string
	addr       string // where clients connect; direct: "" (use upstreams)
	pid        int    // the process that proxies (nginx: the worker)
	pids       []int  // every process of the system (nginx: master and worker)
	healthAddr string // extractedprism's health server
	cmd        *exec.Cmd
	done       chan struct{} // closed when cmd has exited
	logPath    string
	upstreams  []string
}

// target returns the address the n-th connection of a client dials.
func (in *instance) target(n int) string {
	if in.addr != "" {
		return in.addr
	}
	return in.upstreams[n%len(in.upstreams)]
}

func (in *instance) alive() bool {
	if in.cmd == nil {
		return true
	}
	select {
	case <-in.done:
		return false
	default:
		return true
	}
}

func freePort() (int, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	addr, ok := ln.Addr().(*net.TCPAddr)
	if !ok {
		return 0, fmt.Errorf("listener address %s is not TCP", ln.Addr())
	}
	return addr.Port, nil
}

// start starts system name in front of e's upstreams and waits until an
// echo goes through it.
func (e *env) start(name string, o startOpts) (*instance, error) {
	in := &instance{name: name, upstreams: e.upstreams}
	if name == sysDirect {
		return in, nil
	}
	e.seq++
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	in.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	in.logPath = filepath.Join(e.tmp, fmt.Sprintf("%s-%d.log", name, e.seq))
	var argv []string
	switch name {
	case sysHAProxy:
		cfg := filepath.Join(e.tmp, fmt.Sprintf("haproxy-%d.cfg", e.seq))
		if err := os.WriteFile(cfg, []byte(haproxyConfig(in.addr, e.upstreams, e.nofile, o)), 0o600); err != nil {
			return nil, err
		}
		argv = []string{"haproxy", "-db", "-f", cfg}
	case sysNginx:
		dir := filepath.Join(e.tmp, fmt.Sprintf("nginx-%d", e.seq))
		if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o750); err != nil {
			return nil, err
		}
		cfg := filepath.Join(dir, "nginx.conf")
		if err := os.WriteFile(cfg, []byte(nginxConfig(dir, in.addr, e.upstreams, e.nofile, o)), 0o600); err != nil {
			return nil, err
		}
		argv = []string{"nginx", "-p", dir, "-c", cfg}
	case sysGoCopy:
		argv = []string{e.self, gocopyArg, in.addr, strings.Join(e.upstreams, ",")}
	default:
		bin := e.epBin
		if name != sysEP {
			var ok bool
			if bin, ok = e.alt[name]; !ok {
				return nil, fmt.Errorf("unknown system %q", name)
			}
		}
		hport, err := freePort()
		if err != nil {
			return nil, err
		}
		in.healthAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(hport))
		argv = []string{bin,
			"--endpoints", strings.Join(e.upstreams, ","),
			"--bind-port", strconv.Itoa(port), "--health-port", strconv.Itoa(hport),
			"--enable-discovery=false", "--health-interval", "2s", "--health-timeout", "1s"}
	}
	return e.launch(in, argv, o)
}

// isEP reports whether system name is an extractedprism build: this
// tree's or an -ep-alt one.
func (e *env) isEP(name string) bool {
	_, alt := e.alt[name]
	return name == sysEP || alt
}

// launch starts argv as in's process under taskset (and ulimit, when
// asked) and waits until it proxies.
func (e *env) launch(in *instance, argv []string, o startOpts) (*instance, error) {
	argv = append([]string{"taskset", "-c", e.proxyCPU}, argv...)
	if o.nofile > 0 {
		// bash's ulimit -n sets the soft and the hard limit.
		argv = append([]string{"bash", "-c", fmt.Sprintf(`ulimit -n %d && exec "$@"`, o.nofile), "bench-ulimit"}, argv...)
	}
	if err := in.run(argv); err != nil {
		return nil, err
	}
	if err := in.waitReady(10 * time.Second); err != nil {
		in.stop()
		return nil, fmt.Errorf("%s: %w (log %s)", in.name, err, in.logPath)
	}
	return in, nil
}

func (in *instance) run(argv []string) error {
	logf, err := os.Create(in.logPath)
	if err != nil {
		return err
	}
	defer logf.Close()
	// No context: stop ends the process, SIGTERM first and then its group.
	cmd := exec.CommandContext(context.Background(), argv[0], argv[1:]...) //nolint:gosec // the system under test, built by start from its own configs and the -ep binaries
	cmd.Stdout, cmd.Stderr = logf, logf
	// Own process group, so stop can end exactly what was started here
	// (nginx's worker included); killed with the bench if it dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", argv[0], err)
	}
	in.cmd = cmd
	in.done = make(chan struct{})
	go func() { _ = cmd.Wait(); close(in.done) }()
	return nil
}

// waitReady waits until an echo goes through the proxy and, for nginx,
// its worker process is known.
func (in *instance) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var lastErr error
	for time.Now().Before(deadline) {
		if !in.alive() {
			return errors.New("exited during start-up")
		}
		lastErr = echoOnce(in.addr, 64, time.Second)
		if lastErr == nil {
			lastErr = in.findPIDs()
		}
		if lastErr == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("not ready after %s: %w", timeout, lastErr)
}

// findPIDs resolves the process to measure. taskset and bash exec the
// program, so the started PID is the program's; nginx proxies in its one
// worker, a child of the started master.
func (in *instance) findPIDs() error {
	root := in.cmd.Process.Pid
	if comm := procComm(root); comm == "taskset" || comm == "bash" || comm == "" {
		return fmt.Errorf("process %d is still %q", root, comm)
	}
	in.pid, in.pids = root, []int{root}
	if in.name == sysNginx {
		kids := childPIDs(root)
		if len(kids) != 1 {
			return fmt.Errorf("nginx master %d has %d children; want 1 worker", root, len(kids))
		}
		in.pid = kids[0]
		in.pids = append(in.pids, kids[0])
	}
	return nil
}

// stop ends the system: SIGTERM to the started process, then SIGKILL to
// its process group after 5 s.
func (in *instance) stop() {
	if in.cmd == nil {
		return
	}
	pid := in.cmd.Process.Pid
	_ = syscall.Kill(pid, syscall.SIGTERM)
	select {
	case <-in.done:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		<-in.done
	}
	// nginx's worker may outlive the master by a moment; it is in the group.
	_ = syscall.Kill(-pid, syscall.SIGKILL)
}

// metricsLimit bounds what metrics reads: /metrics is a few KiB.
const metricsLimit = 16 << 20

// metrics fetches extractedprism's /metrics once.
func (in *instance) metrics() ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+in.healthAddr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, metricsLimit))
	if resp.StatusCode != http.StatusOK {
		return body, fmt.Errorf("/metrics: %s", resp.Status)
	}
	return body, err
}

// scrapeMetrics fetches extractedprism's /metrics once and returns its size.
func (in *instance) scrapeMetrics() (int, error) {
	body, err := in.metrics()
	return len(body), err
}

// metric returns the value of the series name, one without labels, from
// extractedprism's /metrics.
func (in *instance) metric(name string) (float64, error) {
	body, err := in.metrics()
	if err != nil {
		return 0, err
	}
	return metricValue(body, name)
}

// metricValue finds the series name, one without labels, in a Prometheus
// text exposition.
func metricValue(exposition []byte, name string) (float64, error) {
	for line := range strings.SplitSeq(string(exposition), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == name {
			return strconv.ParseFloat(f[1], 64)
		}
	}
	return 0, fmt.Errorf("/metrics: no series %s", name)
}

// healthz returns the status code of extractedprism's /healthz, or 0.
func (in *instance) healthz(path string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+in.healthAddr+path, nil)
	if err != nil {
		return 0
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

// haproxyMaxconn is HAProxy's maxconn under the inherited descriptor
// limit nofile: as many as it allows at two descriptors a connection, so
// the idle scenario fits.
func haproxyMaxconn(nofile int) int {
	return min(100000, (nofile-100)/2)
}

// nginxWorkerConns is nginx's worker_connections under the inherited
// descriptor limit nofile; a proxied connection takes two.
func nginxWorkerConns(nofile int) int {
	return min(65536, nofile)
}

// haproxyConfig: mode tcp, one thread, health checks every 2 s with fall 2
// rise 1, retries 3 with redispatch, random balancing like extractedprism.
func haproxyConfig(addr string, ups []string, nofile int, o startOpts) string {
	var b strings.Builder
	b.WriteString("global\n    nbthread 1\n")
	if o.nofile == 0 {
		fmt.Fprintf(&b, "    maxconn %d\n", haproxyMaxconn(nofile))
	}
	b.WriteString(`defaults
    mode tcp
    timeout connect 1s
    timeout client 1h
    timeout server 1h
    retries 3
    option redispatch
frontend fe
    bind ` + addr + `
    default_backend be
backend be
    balance random
`)
	for i, u := range ups {
		fmt.Fprintf(&b, "    server u%d %s check inter 2s fall 2 rise 1\n", i+1, u)
	}
	return b.String()
}

// nginxConfig: stream proxy, one worker, proxy_next_upstream on, passive
// health (two failures take a server out for 2 s).
func nginxConfig(dir, addr string, ups []string, nofile int, o startOpts) string {
	var b strings.Builder
	b.WriteString("load_module /usr/lib/nginx/modules/ngx_stream_module.so;\n")
	fmt.Fprintf(&b, "worker_processes 1;\npid %s/nginx.pid;\nerror_log %s/logs/error.log warn;\ndaemon off;\n", dir, dir)
	if o.nofile == 0 {
		fmt.Fprintf(&b, "worker_rlimit_nofile %d;\nevents { worker_connections %d; }\n", nofile, nginxWorkerConns(nofile))
	} else {
		// Descriptors, not worker_connections, are the limit here.
		b.WriteString("events { worker_connections 4096; }\n")
	}
	b.WriteString("stream {\n    upstream be {\n        random;\n")
	for _, u := range ups {
		fmt.Fprintf(&b, "        server %s max_fails=2 fail_timeout=2s;\n", u)
	}
	fmt.Fprintf(&b, `    }
    server {
        listen %s;
        proxy_pass be;
        proxy_connect_timeout 1s;
        proxy_timeout 1h;
        proxy_next_upstream on;
        proxy_next_upstream_tries 3;
    }
}
`, addr)
	return b.String()
}
