package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestMain runs four tests marked t.Parallel at once, not GOMAXPROCS (two
// on CI): they wait on kernel timers and on daemons in processes of their
// own, not on this process's CPU, and two at a time queued them for a
// minute. An explicit -parallel is kept.
func TestMain(m *testing.M) {
	flag.Parse()
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "test.parallel" })
	if !explicit {
		_ = flag.Set("test.parallel", strconv.Itoa(max(4, runtime.GOMAXPROCS(0))))
	}
	m.Run()
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	return unusedPort(t)
}

// handedOut holds every port freePort and deadAddr have given this test
// binary: the kernel hands a port just closed out again, and a daemon whose
// dead upstream was given its own listener's port refuses to start.
var handedOut = struct {
	mu    sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// unusedPort returns a loopback port free now and never returned before.
func unusedPort(t testing.TB) int {
	t.Helper()
	handedOut.mu.Lock()
	defer handedOut.mu.Unlock()
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		_ = ln.Close()
		if !handedOut.ports[port] {
			handedOut.ports[port] = true
			return port
		}
	}
	t.Fatal("no loopback port not handed out before in 100 tries")
	return 0
}

// httpGet returns the status and body of GET url, or 0 if it failed.
func httpGet(url string) (int, string) {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

type runningDaemon struct {
	proxyAddr  string
	healthBase string
	logs       *syncBuffer
	cancel     context.CancelFunc
	done       chan error
}

// startDaemon runs the whole program through run with env as its
// environment and waits until /healthz answers.
func startDaemon(t *testing.T, env map[string]string, args ...string) *runningDaemon {
	t.Helper()
	logs := &syncBuffer{}
	return startDaemonOut(t, logs, logs, env, args...)
}

// startDaemonOut is startDaemon with out as stdout and stderr, whose text
// logs holds.
func startDaemonOut(t *testing.T, out io.Writer, logs *syncBuffer, env map[string]string, args ...string) *runningDaemon {
	t.Helper()
	bindPort, healthPort := freePort(t), freePort(t)
	args = append([]string{
		"--bind-port", strconv.Itoa(bindPort), "--health-port", strconv.Itoa(healthPort),
		"--enable-discovery=false", "--log-level", "debug",
	}, args...)
	d := &runningDaemon{
		proxyAddr:  net.JoinHostPort("127.0.0.1", strconv.Itoa(bindPort)),
		healthBase: "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(healthPort)),
		logs:       logs,
		done:       make(chan error, 1),
	}
	ctx, cancel := context.WithCancel(context.Background())
	d.cancel = cancel
	getenv := func(k string) string { return env[k] }
	go func() { d.done <- run(ctx, args, getenv, environOf(env), out, out) }()
	t.Cleanup(func() {
		d.stop(t)
		if t.Failed() {
			t.Logf("daemon log:\n%s", d.logs.String())
		}
	})
	d.waitOK(t, "/healthz")
	return d
}

// stop cancels the daemon as SIGTERM would and checks it exits cleanly.
func (d *runningDaemon) stop(t *testing.T) {
	t.Helper()
	if d.cancel == nil {
		return
	}
	d.cancel()
	d.cancel = nil
	select {
	case err := <-d.done:
		if err != nil {
			t.Errorf("run returned %v; want nil after shutdown", err)
		}
		if logs := d.logs.String(); !strings.Contains(logs, `"msg":"shutting down","cause":"context canceled"`) {
			t.Errorf("log: no shutdown line with its cause in\n%s", logs)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("run did not return within 15 s of shutdown")
	}
}

// waitForLog waits until the daemon has logged text: lines reach the log
// through the log sink's own goroutine, a moment after they are logged.
func (d *runningDaemon) waitForLog(t *testing.T, text string) {
	t.Helper()
	waitFor(t, "the log to say "+strconv.Quote(text), func() bool { return strings.Contains(d.logs.String(), text) })
}

func (d *runningDaemon) waitOK(t *testing.T, path string) {
	t.Helper()
	waitFor(t, path+" to answer 200", func() bool { code, _ := httpGet(d.healthBase + path); return code == http.StatusOK })
}

// echoThrough opens a connection through the daemon's proxy, closed when
// the test ends, and sends msg through it to an echo upstream and back.
func (d *runningDaemon) echoThrough(t *testing.T, msg string) *net.TCPConn {
	t.Helper()
	c := dialProxy(t, d.proxyAddr)
	if err := roundTrip(c, []byte(msg)); err != nil {
		t.Fatalf("%q through the daemon: %v", msg, err)
	}
	return c
}

func TestRunProxiesAndReports(t *testing.T) {
	a, b := startUpstream(t, echo), startUpstream(t, echo)
	d := startDaemon(t, nil, "--endpoints", a.addr+","+b.addr)
	d.waitOK(t, "/readyz")
	for range 10 {
		_ = d.echoThrough(t, "through the daemon").Close()
	}
	waitFor(t, "connections_active to return to 0", func() bool {
		_, body := httpGet(d.healthBase + "/metrics")
		return strings.Contains(body, "extractedprism_connections_active 0")
	})
	_, body := httpGet(d.healthBase + "/metrics")
	for _, want := range []string{
		"extractedprism_connections_total 10",
		"extractedprism_upstreams_active 2",
		"extractedprism_upstreams_total 2",
		`extractedprism_health_check_status{upstream="` + a.addr + `"} 1`,
		`extractedprism_discovery_updates_total{provider="static"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	// Shutdown closes the connections still open, and the listener.
	c := d.echoThrough(t, "open")
	d.stop(t)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Error("proxied connection still open after shutdown")
	}
	if _, err := net.DialTimeout("tcp", d.proxyAddr, time.Second); err == nil {
		t.Error("listener still accepting after shutdown")
	}
}

// The environment configures the daemon as flags do, and a setting
// without effect is a warning: startDaemon turns discovery off, so a
// kubeconfig does nothing, and no flag reads a misspelt variable.
func TestRunEnvironmentConfiguresDaemon(t *testing.T) {
	a := startUpstream(t, echo)
	d := startDaemon(t, map[string]string{"EP_ENDPOINTS": a.addr, "EP_KUBECONFIG": "/nonexistent", "EP_DRAIN_TIMOUT": "1s"})
	d.echoThrough(t, "env")
	d.waitForLog(t, `"msg":"setting has no effect","setting":"--kubeconfig (EP_KUBECONFIG)"`)
	d.waitForLog(t, `"msg":"setting has no effect","setting":"EP_DRAIN_TIMOUT","because":"no flag reads it; did you mean EP_DRAIN_TIMEOUT?"`)
}

// run refuses a bad configuration before anything listens, with an error
// naming its flags; a port in use is reported with the flags of the
// listener that could not have it, since both listeners bind the same
// address by default, and the other listener is closed again.
func TestRunRefusesToStart(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	_, takenPort, _ := net.SplitHostPort(taken.Addr().String())
	dir := t.TempDir()
	notPEM := dir + "/ca.crt"
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		args []string
		want []string // in the error
	}{
		{[]string{"--health-timeout", "30s"}, []string{"--health-timeout", "EP_HEALTH_TIMEOUT"}},
		{[]string{"--health-check", "readyz", "--health-check-ca-file", dir + "/missing.crt"}, []string{"--health-check-ca-file"}},
		{[]string{"--health-check", "readyz", "--health-check-ca-file", notPEM}, []string{"--health-check-ca-file"}},
		{[]string{"--bind-port", takenPort}, []string{"load balancer listener (--bind-address, --bind-port)", "address already in use"}},
		{[]string{"--health-port", takenPort}, []string{"health server listener (--health-bind-address, --health-port)", "address already in use"}},
	} {
		bindPort := strconv.Itoa(freePort(t))
		args := slices.Concat([]string{"--endpoints", "127.0.0.1:6443", "--enable-discovery=false",
			"--bind-port", bindPort, "--health-port", strconv.Itoa(freePort(t))}, tt.args)
		err := run(context.Background(), args, envOf(nil), environOf(nil), io.Discard, io.Discard)
		for _, w := range tt.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%q: got %v; want an error with %q", tt.args, err, w)
			}
		}
		if c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", bindPort), time.Second); err == nil {
			_ = c.Close()
			t.Errorf("%q: something listens on the proxy port after start-up failed", tt.args)
		}
	}
}

// --help and --version, of the daemon and of check, print and succeed.
func TestRunHelpAndVersionExitCleanly(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"--version"}, {"check", "--help"}, {"check", "--version"}} {
		var out bytes.Buffer
		if err := run(context.Background(), args, envOf(nil), environOf(nil), &out, &out); err != nil {
			t.Errorf("run %q: got %v; want nil", args, err)
		}
		want := []string{"Usage: extractedprism [flags]", "Usage: extractedprism status", "Usage: extractedprism check"}
		if args[len(args)-1] == "--version" {
			want = []string{versionLine() + "\n", " " + runtime.Version() + ")"}
		}
		for _, w := range want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("run %q: got %q; want it to contain %q", args, out.String(), w)
			}
		}
	}
}

func TestRunIPv6(t *testing.T) {
	up6, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback here: %v", err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = up6.Close(); wg.Wait() }) // after the daemon's
	wg.Go(func() {
		for {
			c, err := up6.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { defer c.Close(); echo(c) })
		}
	})
	d := startDaemon(t, nil, "--bind-address", "::1", "--health-bind-address", "127.0.0.1", "--endpoints", up6.Addr().String())
	_, port, _ := net.SplitHostPort(d.proxyAddr)
	d.proxyAddr = net.JoinHostPort("::1", port)
	d.echoThrough(t, "over IPv6")
}

// The start-up line names the version and the connection limit, with a
// warning when the limit is low that names what sets it.
func TestLogStartWarnsOfFewConnections(t *testing.T) {
	for _, tt := range []struct {
		limit   int
		limitBy string
		warning string // "" for none
	}{
		{fewConnections - 1, limitByFiles, "the open-files limit allows few"},
		{fewConnections, limitByFiles, ""},
		{fewConnections - 1, limitByMemory, "the memory limit allows few"},
	} {
		d := beatDaemon(tt.limit)
		d.limitBy = tt.limitBy
		logs := &syncBuffer{}
		d.log = newLogger(slog.LevelInfo, logs)
		d.logStart("127.0.0.1:7445", "127.0.0.1:7446")
		var records []map[string]any
		for line := range strings.Lines(logs.String()) {
			var r map[string]any
			if err := json.Unmarshal([]byte(line), &r); err != nil {
				t.Fatalf("log line %q: %v", line, err)
			}
			records = append(records, r)
		}
		want := map[string]any{"level": "INFO", "msg": "starting", "version": versionLine(), "listen": "127.0.0.1:7445",
			"health": "127.0.0.1:7446", "max_connections": float64(tt.limit), "limited_by": tt.limitBy}
		for k, v := range want {
			if len(records) == 0 || records[0][k] != v {
				t.Fatalf("limit %d by %s: start-up line %v; want its %s to be %v", tt.limit, tt.limitBy, records, k, v)
			}
		}
		warned := len(records) == 2 && records[1]["level"] == "WARN" && strings.HasPrefix(fmt.Sprint(records[1]["msg"]), tt.warning)
		if tt.warning == "" && len(records) != 1 || tt.warning != "" && !warned {
			t.Errorf("limit %d by %s: got %v after the start-up line; want a warning %q", tt.limit, tt.limitBy, records[1:], tt.warning)
		}
	}
}

// TestStartLineCarriesSettings: the start-up line names every setting with
// its effective value, from a flag, a variable or the default.
func TestStartLineCarriesSettings(t *testing.T) {
	cfg, err := parseConfig([]string{"--endpoints", "192.0.2.1:6443", "--upstream-selection", "latency"},
		func(k string) string { return map[string]string{"EP_DRAIN_TIMEOUT": "7s"}[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	d := beatDaemon(fewConnections)
	d.cfg = cfg
	logs := &syncBuffer{}
	d.log = newLogger(slog.LevelInfo, logs)
	d.logStart("127.0.0.1:7445", "127.0.0.1:7446")
	var r struct{ Settings map[string]string }
	if err := json.Unmarshal([]byte(lineWith(logs.String(), `"starting"`)), &r); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"endpoints": "192.0.2.1:6443", "upstream-selection": "latency", "drain-timeout": "7s",
		"health-check": "tcp", "health-bind-address": "127.0.0.1", "health-interval": "20s"}
	for k, v := range want {
		if r.Settings[k] != v {
			t.Errorf("settings[%s]: got %q; want %q", k, r.Settings[k], v)
		}
	}
	fs, _ := newFlagSet(&config{})
	fs.VisitAll(func(f *flag.Flag) {
		if _, ok := r.Settings[f.Name]; !ok && f.Name != versionFlag {
			t.Errorf("no setting %s in the start-up line", f.Name)
		}
	})
}

// beatDaemon is a daemon with what its beat needs: a pool with fake
// checks, a proxy of maxConns slots and a 15 s liveness threshold.
func beatDaemon(maxConns int) *daemon {
	m := newMetrics(prometheus.NewRegistry())
	log := slog.New(slog.DiscardHandler)
	pl := newPool(log, m, defaultTestPool, newFakeChecks().check, randomSelector{})
	return &daemon{
		cfg:       &config{LivenessThreshold: 15 * time.Second},
		log:       log,
		pool:      pl,
		proxy:     newProxy(log, m, pl, time.Second, maxConns),
		heartbeat: newHeartbeat(15 * time.Second),
	}
}

func TestBeatSkippedWhileAcceptFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := beatDaemon(1)
		defer d.pool.close()
		d.proxy.stalledSince.Store(time.Now().UnixNano()) // Accept starts failing now
		for range 4 {
			time.Sleep(5 * time.Second)
			d.beat()
		}
		if ok, _ := d.heartbeat.alive(); ok {
			t.Error("alive after 20 s of failing Accept; want /healthz to fail past the 15 s threshold")
		}
		d.proxy.stalledSince.Store(0) // Accept works again
		d.beat()
		if ok, reason := d.heartbeat.alive(); !ok {
			t.Errorf("not alive after Accept recovered: %s", reason)
		}
	})
}

// With the static endpoint dead and the cache listing a live one, the
// cache serves, and /upstreams shows it as a source.
func TestRunStartsFromEndpointCache(t *testing.T) {
	alive := startUpstream(t, echo)
	cachePath := t.TempDir() + "/endpoints.json"
	if err := (&endpointCache{path: cachePath}).store([]string{alive.addr}); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, nil, "--endpoints", deadAddr(t), "--enable-discovery=true",
		"--kubeconfig", uselessKubeconfig(t), "--endpoint-cache-file", cachePath)
	d.echoThrough(t, "via the cached endpoint")
	if _, body := httpGet(d.healthBase + "/upstreams"); !strings.Contains(body, `"cache"`) {
		t.Errorf("/upstreams does not show the cache as a source:\n%s", body)
	}
}

// uselessKubeconfig writes a kubeconfig that loads but whose credentials
// are useless: discovery runs and never answers, as its requests reach an
// echo server through the proxy.
func uselessKubeconfig(t *testing.T) string {
	return writeKubeconfig(t, "insecure-skip-tls-verify: true")
}

// writeKubeconfig writes a kubeconfig for https://192.0.2.1:6443 with a
// useless token, its cluster's TLS setting being tlsSetting.
func writeKubeconfig(t *testing.T, tlsSetting string) string {
	t.Helper()
	path := t.TempDir() + "/kubeconfig"
	if err := os.WriteFile(path, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://192.0.2.1:6443", `+tlsSetting+`}}]
users: [{name: u, user: {token: nothing}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// seriesValue returns the value of the one series of the metric name
// gathered from g with the labels given (and any others), and whether there
// is one.
func seriesValue(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	found := selectSeries(t, g, name, labels)
	switch len(found) {
	case 0:
		return 0, false
	case 1:
		return found[0].value, true
	}
	t.Fatalf("%s%v: %d series; want at most one", name, labels, len(found))
	return 0, false
}

// TestNewDiscoveryWithoutCredentials: with --enable-discovery and neither a
// kubeconfig nor service-account files, the static endpoints serve alone,
// with a warning; the kubernetes series exist from the start: running 0,
// one error, updates 0. The endpoint cache is not used, as nothing would
// ever replace its list. Without --enable-discovery there are no
// kubernetes series. A named kubeconfig is another matter: see
// TestNewDiscoveryRetriesKubeconfig.
func TestNewDiscoveryWithoutCredentials(t *testing.T) {
	kube := map[string]string{labelProvider: kubeProviderName}
	newDiscovery := func(t *testing.T, cfg *config) (*daemon, *prometheus.Registry, *syncBuffer) {
		reg, logs := prometheus.NewRegistry(), &syncBuffer{}
		cfg.Endpoints, cfg.EndpointCacheFile = []string{"10.0.0.1:6443"}, cacheListing9(t)
		d := &daemon{cfg: cfg, log: newLogger(slog.LevelDebug, logs), listen: "127.0.0.1:7445"}
		d.discovery = d.newDiscovery(newMetrics(reg))
		if len(d.discovery.providers) != 0 || d.cache != nil {
			t.Errorf("providers %d, cache %v; want neither, the static endpoints alone", len(d.discovery.providers), d.cache)
		}
		if got := d.discovery.endpoints(); !slices.Equal(got, cfg.Endpoints) {
			t.Errorf("endpoints: got %v; want the static %v", got, cfg.Endpoints)
		}
		return d, reg, logs
	}
	t.Run("no credentials", func(t *testing.T) {
		if _, err := os.Stat(defaultServiceAccountDir); !errors.Is(err, fs.ErrNotExist) {
			t.Skipf("%s exists here", defaultServiceAccountDir)
		}
		_, reg, logs := newDiscovery(t, &config{EnableDiscovery: true})
		if want := `"level":"WARN","msg":"kubernetes discovery off, serving static endpoints only"`; !strings.Contains(logs.String(), want) {
			t.Errorf("log: got %s; want %s", logs.String(), want)
		}
		for name, want := range map[string]float64{"extractedprism_discovery_running": 0,
			"extractedprism_discovery_errors_total": 1, "extractedprism_discovery_updates_total": 0} {
			if got, ok := seriesValue(t, reg, name, kube); !ok || got != want {
				t.Errorf("%s{provider=\"kubernetes\"}: got %v (exists %v); want %v", name, got, ok, want)
			}
		}
	})
	t.Run("discovery disabled", func(t *testing.T) {
		_, reg, _ := newDiscovery(t, &config{Kubeconfig: "/nonexistent/kubeconfig"})
		for _, name := range []string{"extractedprism_discovery_running", "extractedprism_discovery_errors_total", "extractedprism_discovery_updates_total"} {
			if got, ok := seriesValue(t, reg, name, kube); ok {
				t.Errorf("%s{provider=\"kubernetes\"}: got %v; want no series", name, got)
			}
		}
	})
}

// cacheListing9 writes an endpoint cache listing 10.0.0.9:6443.
func cacheListing9(t *testing.T) string {
	t.Helper()
	path := t.TempDir() + "/endpoints.json"
	if err := (&endpointCache{path: path}).store([]string{"10.0.0.9:6443"}); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestNewDiscoveryRetriesKubeconfig: a --kubeconfig that does not load
// (not there yet, or broken) does not turn discovery off: the kubernetes
// provider runs and retries it, and the endpoint cache stands in until it
// answers.
func TestNewDiscoveryRetriesKubeconfig(t *testing.T) {
	for name, kubeconfig := range map[string]string{
		"kubeconfig does not load": "/nonexistent/kubeconfig",
		"kubeconfig CA is not PEM": writeKubeconfig(t, "certificate-authority-data: bm90IGEgY2VydGlmaWNhdGU="),
	} {
		t.Run(name, func(t *testing.T) {
			cfg := &config{EnableDiscovery: true, Kubeconfig: kubeconfig, Endpoints: []string{"10.0.0.1:6443"}, EndpointCacheFile: cacheListing9(t)}
			d := &daemon{cfg: cfg, log: newLogger(slog.LevelDebug, &syncBuffer{}), listen: "127.0.0.1:7445"}
			d.discovery = d.newDiscovery(newMetrics(prometheus.NewRegistry()))
			if len(d.discovery.providers) != 1 || d.cache == nil {
				t.Errorf("providers %d, cache %v; want the kubernetes provider and the cache", len(d.discovery.providers), d.cache)
			}
			if got, want := d.discovery.endpoints(), []string{"10.0.0.1:6443", "10.0.0.9:6443"}; !slices.Equal(got, want) {
				t.Errorf("endpoints: got %v; want %v, the static and the cached", got, want)
			}
		})
	}
}

func (d *runningDaemon) metricsMissing(want ...string) []string {
	_, body := httpGet(d.healthBase + "/metrics")
	lines := strings.Split(body, "\n")
	return slices.DeleteFunc(want, func(l string) bool { return slices.Contains(lines, l) })
}

// TestRunWaitsForKubeconfig: a --kubeconfig that is not there yet, as on a
// joining node before the kubelet's TLS bootstrap ends, is retried. The
// static endpoint serves meanwhile, with discovery_running 0 and an error
// logged; once the file appears, discovery lists through the daemon's own
// listener and follows the API server's EndpointSlice.
func TestRunWaitsForKubeconfig(t *testing.T) {
	other := startUpstream(t, echo)
	api := sliceServer(t, other.addr)
	path := filepath.Join(t.TempDir(), "kubelet.conf")
	d := startDaemon(t, nil, "--endpoints", api.Listener.Addr().String(), "--enable-discovery=true", "--kubeconfig", path)
	d.waitForLog(t, `"level":"ERROR","msg":"kubernetes credentials do not load, retrying"`)
	waitFor(t, "discovery_running 0", func() bool {
		return len(d.metricsMissing(`extractedprism_discovery_running{provider="kubernetes"} 0`)) == 0
	})
	ca := base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: api.Certificate().Raw}))
	writeFile(t, path, `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://192.0.2.1:6443", certificate-authority-data: `+ca+`, tls-server-name: example.com}}]
users: [{name: u, user: {token: node-token}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`)
	waitFor(t, "discovery to list "+other.addr, func() bool {
		_, body := httpGet(d.healthBase + "/upstreams")
		var doc upstreamsDoc
		_ = json.Unmarshal([]byte(body), &doc)
		return slices.ContainsFunc(doc.Upstreams, func(u upstreamStatus) bool {
			return u.Address == other.addr && slices.Equal(u.Sources, []string{kubeProviderName})
		})
	})
	d.waitForLog(t, `"msg":"kubernetes credentials loaded"`)
	if m := d.metricsMissing(`extractedprism_discovery_running{provider="kubernetes"} 1`); len(m) > 0 {
		t.Errorf("/metrics lacks the lines %q", m)
	}
}

// sliceServer is an API server that lists one EndpointSlice of the
// kubernetes Service, naming addr, and holds every watch open until the
// client goes.
func sliceServer(t *testing.T, addr string) *httptest.Server {
	t.Helper()
	host, port, _ := net.SplitHostPort(addr)
	list := `{"kind":"EndpointSliceList","apiVersion":"discovery.k8s.io/v1","metadata":{"resourceVersion":"7"},
"items":[{"metadata":{"name":"kubernetes","namespace":"default"},"addressType":"IPv4",
"endpoints":[{"addresses":["` + host + `"],"conditions":{"ready":true}}],"ports":[{"name":"https","port":` + port + `}]}]}`
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Get("watch") == "true" {
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			return
		}
		_, _ = io.WriteString(w, list)
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() })
	return srv
}

// A corrupt endpoint cache, or a FIFO no one writes, is logged and ignored:
// the static endpoints serve, and discovery runs, though its requests fail,
// exporting discovery_running 1 (set as the merged provider starts, which
// /healthz does not wait for).
func TestRunCorruptCacheIsNotFatal(t *testing.T) {
	a := startUpstream(t, echo)
	corrupt, fifo := t.TempDir()+"/endpoints.json", t.TempDir()+"/fifo"
	if err := os.WriteFile(corrupt, []byte(`{"version":1,"endpoints":["10.0`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, cachePath := range []string{corrupt, fifo} {
		d := startDaemon(t, nil, "--endpoints", a.addr, "--endpoint-cache-file", cachePath, "--enable-discovery=true",
			"--kubeconfig", uselessKubeconfig(t))
		d.echoThrough(t, "static still works")
		d.waitForLog(t, "endpoint cache ignored")
		want := []string{`extractedprism_discovery_running{provider="kubernetes"} 1`,
			`extractedprism_discovery_running{provider="static"} 1`, `extractedprism_discovery_updates_total{provider="kubernetes"} 0`}
		waitFor(t, fmt.Sprintf("/metrics to show %q", want), func() bool { return len(d.metricsMissing(slices.Clone(want)...)) == 0 })
	}
}

// apply gives the pool the union of the sources when it has changed, and
// logs it; an empty union, or one of only the proxy's own listener, leaves
// the pool its last upstreams rather than none. The cache writer is offered
// what discovery found, never the static endpoints.
func TestApplySkipsEmptyAndUnchangedUnions(t *testing.T) {
	type step struct {
		name      string
		published []string // the kubernetes provider's list; nil publishes none
		want      []string // applied, and the pool serves
		updated   bool     // "endpoint list updated" logged
		cached    []string // offered to the cache writer
	}
	// steps applies each step's list in turn, as the run loop does.
	steps := func(t *testing.T, static []string, steps []step) {
		logs := &syncBuffer{}
		log := slog.New(slog.NewTextHandler(logs, nil))
		m := newMetrics(prometheus.NewRegistry())
		d := &daemon{log: log, listen: "127.0.0.1:7445", cache: &endpointCache{},
			pool: newPool(log, m, defaultTestPool, newFakeChecks().check, randomSelector{}), discovery: newMergedProvider(log, m, static, nil, newScripted(kubeProviderName, nil))}
		defer d.pool.close()
		toCache := make(chan []string, 1)
		var applied []string
		for _, st := range steps {
			if st.published != nil {
				d.discovery.publish(kubeProviderName, st.published)
			}
			before := strings.Count(logs.String(), "endpoint list updated")
			applied = d.apply(applied, toCache)
			var serving []string
			for _, s := range d.pool.describe(nil) {
				if !s.Draining {
					serving = append(serving, s.Address)
				}
			}
			if !slices.Equal(applied, st.want) || !slices.Equal(serving, st.want) {
				t.Errorf("%s: applied %v, pool serving %v; want %v", st.name, applied, serving, st.want)
			}
			if updated := strings.Count(logs.String(), "endpoint list updated") > before; updated != st.updated {
				t.Errorf("%s: logged an update %v; want %v", st.name, updated, st.updated)
			}
			var offered []string
			select {
			case offered = <-toCache:
			default:
			}
			if !slices.Equal(offered, st.cached) {
				t.Errorf("%s: offered the cache %v; want %v", st.name, offered, st.cached)
			}
		}
	}
	static := []string{"10.0.0.9:6443"}
	ab, c := []string{"10.0.0.1:6443", "10.0.0.2:6443"}, []string{"10.0.0.3:6443"}
	synctest.Test(t, func(t *testing.T) {
		steps(t, static, []step{
			{name: "static endpoints", want: static, updated: true},
			{name: "static unchanged", want: static},
		})
		steps(t, nil, []step{
			{name: "nothing yet"},
			{name: "discovered", published: ab, want: ab, updated: true, cached: ab},
			{name: "unchanged", published: slices.Clone(ab), want: ab},
			{name: "empty", published: []string{}, want: ab},
			{name: "own listener only", published: []string{"127.0.0.1:7445"}, want: ab},
			{name: "changed", published: c, want: c, updated: true, cached: c},
		})
	})
}

// A failed cache write is a warning, each time its list comes again;
// TestCacheWriterWritesOnlyChangedLists has the rest of the writer.
func TestCacheWriterWarnsOfFailedWrites(t *testing.T) {
	logs := &syncBuffer{}
	c := &endpointCache{path: t.TempDir() + "/missing/endpoints.json", log: newLogger(slog.LevelDebug, logs)}
	lists := make(chan []string)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { c.writer(ctx, lists) })
	for range 2 {
		lists <- []string{"10.0.0.4:6443"}
	}
	cancel()
	wg.Wait()
	if got := strings.Count(logs.String(), `"level":"WARN","msg":"endpoint cache not written"`); got != 2 {
		t.Errorf("warnings of the failed writes: got %d; want 2 in\n%s", got, logs.String())
	}
}

// The final error line is written, and a stderr that takes nothing holds
// the exit at most logFlushTimeout.
func TestWriteExitError(t *testing.T) {
	var out bytes.Buffer
	writeExitError(&out, errors.New("--bind-port (EP_BIND_PORT) must be in 1-65535: got 0"))
	if want := "extractedprism: --bind-port (EP_BIND_PORT) must be in 1-65535: got 0\n"; out.String() != want {
		t.Errorf("got %q; want %q", out.String(), want)
	}
	synctest.Test(t, func(t *testing.T) {
		w := &stallWriter{release: make(chan struct{})}
		w.stalled.Store(true)
		start := time.Now()
		writeExitError(w, errors.New("stuck"))
		if got := time.Since(start); got != logFlushTimeout {
			t.Errorf("returned after %v; want %v", got, logFlushTimeout)
		}
		close(w.release) // the bubble ends only when the write does
	})
}

// TestWaitShutdown: the daemon's exit waits for the endpoint cache writer at
// most shutdownTimeout, so a write stuck in fsync cannot hold it.
func TestWaitShutdown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var wg sync.WaitGroup
		stuck := make(chan struct{})
		wg.Go(func() { <-stuck })
		start := time.Now()
		if waitShutdown(wg.Wait) {
			t.Fatal("reported finished while the goroutine was still running")
		}
		if got := time.Since(start); got != shutdownTimeout {
			t.Errorf("waited %v; want %v", got, shutdownTimeout)
		}
		close(stuck)
		start = time.Now()
		if !waitShutdown(wg.Wait) {
			t.Fatal("reported unfinished after the goroutine ended")
		}
		if got := time.Since(start); got != 0 {
			t.Errorf("waited %v for a finished group; want no wait", got)
		}
	})
}

// TestRunServesWhileLogReaderStalls: a log reader that stops reading must
// not stall the daemon. The pool logs an upstream's failed check while it
// holds its lock; when that write blocked on stderr, new clients, the
// liveness beat and shutdown all waited on the lock for good.
func TestRunServesWhileLogReaderStalls(t *testing.T) {
	a, b := startUpstream(t, echo), startUpstream(t, echo)
	w := &stallWriter{release: make(chan struct{})}
	d := startDaemonOut(t, w, &w.buf, nil, "--endpoints", a.addr+","+b.addr, "--log-level", "info",
		"--health-interval", "2s", "--health-timeout", "1s", "--liveness-interval", "1s", "--liveness-threshold", "3s")
	t.Cleanup(func() { close(w.release) }) // before d.stop: lets a run that is stuck on the log end
	// The start-up lines must be out first: one still queued would be the
	// write that blocks, and a's failed check would wait behind it unseen.
	waitFor(t, "the start-up lines to be written", func() bool {
		return strings.Contains(w.buf.String(), "endpoint list updated")
	})

	w.stalled.Store(true) // the log reader stops reading
	a.kill()              // b stays healthy
	waitFor(t, "a's failed check to be logged", func() bool {
		return strings.Contains(w.attempted.String(), "upstream suspect")
	})

	for i := range 3 {
		c := dialProxy(t, d.proxyAddr)
		err := roundTrip(c, []byte("through b"))
		_ = c.Close()
		if err != nil {
			t.Errorf("client %d with the log stalled and b healthy: %v", i, err)
			break
		}
	}
	// Past --liveness-threshold a beat stuck on the pool fails /healthz.
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); {
		if code, _ := httpGet(d.healthBase + "/healthz"); code != http.StatusOK {
			t.Errorf("/healthz with the log stalled: got %d; want 200", code)
			break
		}
		time.Sleep(100 * time.Millisecond) // paces the checks; no state to wait for
	}

	d.cancel()
	bound := 2*shutdownTimeout + 2*time.Second // the proxy's, the health server's, the log flush's
	select {
	case err := <-d.done:
		d.cancel = nil // stopped: nothing left for d.stop
		if err != nil {
			t.Errorf("run: got %v; want nil", err)
		}
	case <-time.After(bound):
		t.Errorf("run did not return within %v of shutdown with the log stalled", bound)
	}
}
