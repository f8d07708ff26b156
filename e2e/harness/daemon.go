package harness

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/extractedprism/extractedprism/e2e/controlplane"
	"github.com/extractedprism/extractedprism/e2e/pki"
	"github.com/extractedprism/extractedprism/e2e/proc"
)

// Mode is how extractedprism checks and picks upstreams.
type Mode struct {
	HealthCheck string // "tcp" or "readyz"
	Selection   string // "random" or "latency"
	// ProbeCert makes the readyz probe present a client certificate
	// instead of relying on anonymous authentication.
	ProbeCert bool
	// Chart runs the daemon as the Helm chart does by default: readyz with
	// random selection, a service-account token (a real one, from the
	// TokenRequest API) as the probe's credential, and ChartSettings in
	// place of the suite's timing.
	Chart bool
	// Node runs the daemon as a node-level instance with the kubelet's
	// credentials: discovery (and with readyz, the probe) uses w1's node
	// client certificate through its kubelet.conf, the endpoint cache is
	// on, and only cp1 is a static endpoint.
	Node bool
}

// chartDefaults is the mode of the chart's default values.
var chartDefaults = Mode{HealthCheck: "readyz", Selection: "random", Chart: true}

// String is the mode as the result table shows it.
func (m Mode) String() string {
	if m.Chart {
		return "chart-defaults"
	}
	s := m.HealthCheck + "/" + m.Selection
	if m.ProbeCert {
		s += "+cert"
	}
	if m.Node {
		s += "+node"
	}
	return s
}

// Settings are the daemon's timing flags.
type Settings struct {
	HealthInterval time.Duration
	HealthTimeout  time.Duration
	DrainTimeout   time.Duration
	// RebalancePeriod is --rebalance-period; zero leaves the daemon's
	// default.
	RebalancePeriod time.Duration
}

// DefaultSettings are the settings the assertions are stated for.
var DefaultSettings = Settings{HealthInterval: 5 * time.Second, HealthTimeout: 2 * time.Second, DrainTimeout: 10 * time.Second}

// ChartSettings are the chart's default timing (healthInterval,
// healthTimeout and drainTimeout in charts/extractedprism/values.yaml,
// which TestChartSettings holds them to).
var ChartSettings = Settings{HealthInterval: 5 * time.Second, HealthTimeout: 2 * time.Second, DrainTimeout: 4 * time.Second,
	RebalancePeriod: time.Minute}

// ErrNotBuilt means the daemon refused the mode at start-up because this
// build does not implement it yet.
var ErrNotBuilt = errors.New("mode not built")

// Daemon is one extractedprism process running in w1.
type Daemon struct {
	LogPath   string
	proc      *proc.Process // with Activated, the socket holder
	activated bool
	client    *http.Client // for the health server, dialled from w1
	started   time.Time
}

// DaemonConfig is everything one daemon start needs.
type DaemonConfig struct {
	Binary    string
	Mode      Mode
	Settings  Settings
	Endpoints []string // static endpoints
	LogPath   string
	// BindPort and HealthPort default to 7445 and 7446.
	BindPort, HealthPort int
	NoDiscovery          bool
	// TokenFile is the readyz probe's bearer token (Mode.Chart).
	TokenFile string
	// Activated runs the daemon with its listening sockets from socket
	// activation, restarted whenever it exits (activation.go).
	Activated bool
	// Handover is the daemon's --handover-socket; empty for none.
	Handover string
}

// BuildDaemon builds extractedprism from the module at src into dir and
// returns the binary's path.
func BuildDaemon(ctx context.Context, src, dir string) (string, error) {
	out := filepath.Join(dir, "extractedprism")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build in %s: %v\n%s", src, err, b)
	}
	return out, nil
}

// FindSource walks up from dir to the extractedprism module root.
func FindSource(dir string) (string, error) {
	for d := dir; ; d = filepath.Dir(d) {
		b, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err == nil {
			first, _, _ := strings.Cut(string(b), "\n")
			if strings.TrimSpace(first) == "module github.com/extractedprism/extractedprism" {
				return d, nil
			}
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no extractedprism module above %s", dir)
		}
	}
}

// daemonArgs is the daemon's command line.
func (c *Cluster) daemonArgs(cfg DaemonConfig) []string {
	bindPort, healthPort := cfg.BindPort, cfg.HealthPort
	if bindPort == 0 {
		bindPort, healthPort = 7445, 7446
	}
	kubeconfig := c.daemonKubeconfig()
	if cfg.Mode.Node {
		kubeconfig = c.nodeKubeconfig()
	}
	args := []string{
		cfg.Binary,
		"--endpoints", strings.Join(cfg.Endpoints, ","),
		"--bind-address", "127.0.0.1",
		"--bind-port", strconv.Itoa(bindPort),
		"--health-port", strconv.Itoa(healthPort),
		"--health-interval", cfg.Settings.HealthInterval.String(),
		"--health-timeout", cfg.Settings.HealthTimeout.String(),
		"--drain-timeout", cfg.Settings.DrainTimeout.String(),
		"--enable-discovery=" + strconv.FormatBool(!cfg.NoDiscovery),
		"--kubeconfig", kubeconfig,
		"--upstream-selection", cfg.Mode.Selection,
		"--health-check", cfg.Mode.HealthCheck,
	}
	if cfg.Mode.HealthCheck == "readyz" {
		args = append(args, "--health-check-ca-file", c.CA.CertFile(),
			"--health-check-server-name", pki.ServiceName)
		switch {
		case cfg.Mode.Node:
			args = append(args, "--health-check-cert-file", c.nodeCertPath(), "--health-check-key-file", c.nodeCertPath())
		case cfg.Mode.ProbeCert:
			args = append(args, "--health-check-cert-file", c.Probe.Cert, "--health-check-key-file", c.Probe.Key)
		}
		if cfg.TokenFile != "" {
			args = append(args, "--health-check-token-file", cfg.TokenFile)
		}
	}
	if cfg.Settings.RebalancePeriod != 0 {
		args = append(args, "--rebalance-period", cfg.Settings.RebalancePeriod.String())
	}
	if cfg.Handover != "" {
		args = append(args, "--handover-socket", cfg.Handover)
	}
	if cfg.Mode.Node && !cfg.NoDiscovery {
		args = append(args, "--endpoint-cache-file", c.nodeCachePath())
	}
	return args
}

// daemonCommand is the daemon's command line, under the socket holder
// with Activated.
func (c *Cluster) daemonCommand(cfg DaemonConfig) []string {
	args := c.daemonArgs(cfg)
	if cfg.Activated {
		args = activatedArgv(args, cmp.Or(cfg.BindPort, 7445), cmp.Or(cfg.HealthPort, 7446))
	}
	return args
}

// daemonKubeconfig writes (once) the discovery credentials. The server
// address is deliberately unreachable: extractedprism replaces it with its
// own listener.
func (c *Cluster) daemonKubeconfig() string {
	path := filepath.Join(c.Dir, "extractedprism.kubeconfig")
	if _, err := os.Stat(path); err == nil {
		return path
	}
	if err := controlplane.WriteKubeconfig(path, "https://192.0.2.254:1", "", c.CA.CertFile(), c.Admin); err != nil {
		c.logf("writing %s: %v", path, err)
	}
	return path
}

// probeToken writes (once) the token the kubelet would mount into the
// chart's pods: one for the ServiceAccount extractedprism in kube-system,
// issued by the TokenRequest API and signed with the cluster's
// service-account key, so the API servers authenticate it as that account.
func (c *Cluster) probeToken(ctx context.Context) (string, error) {
	path := filepath.Join(c.Dir, "probe.token")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	cs, err := c.DirectClient()
	if err != nil {
		return "", fmt.Errorf("probe token: %w", err)
	}
	sas := cs.CoreV1().ServiceAccounts("kube-system")
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "extractedprism"}}
	if _, err := sas.Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("probe token: create ServiceAccount: %w", err)
	}
	// A day outlives any run; the kubelet would rotate it hourly.
	tr := &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](24 * 3600)}}
	tr, err = sas.CreateToken(ctx, sa.Name, tr, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("probe token: TokenRequest: %w", err)
	}
	if err := os.WriteFile(path, []byte(tr.Status.Token), 0o600); err != nil {
		return "", fmt.Errorf("probe token: %w", err)
	}
	return path, nil
}

// StartDaemon starts extractedprism in w1 and waits until its health server
// answers. It returns ErrNotBuilt (wrapping the daemon's message) when the
// daemon refuses the mode at start-up.
func (c *Cluster) StartDaemon(ctx context.Context, cfg DaemonConfig) (*Daemon, error) {
	if cfg.Mode.Chart && cfg.TokenFile == "" {
		path, err := c.probeToken(ctx)
		if err != nil {
			return nil, err
		}
		cfg.TokenFile = path
	}
	p, err := proc.Start("extractedprism", cfg.LogPath, append(c.W1.Command(), c.daemonCommand(cfg)...), nil)
	if err != nil {
		return nil, err
	}
	healthPort := cfg.HealthPort
	if healthPort == 0 {
		healthPort = 7446
	}
	d := &Daemon{
		LogPath:   cfg.LogPath,
		proc:      p,
		activated: cfg.Activated,
		client: &http.Client{
			Transport: &http.Transport{DialContext: c.W1.DialContext, DisableKeepAlives: true},
			Timeout:   3 * time.Second,
		},
		started: time.Now(),
	}
	healthURL := "http://127.0.0.1:" + strconv.Itoa(healthPort)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if exited, exitErr := p.Exited(); exited {
			msg := lastErrorLine(cfg.LogPath)
			if strings.Contains(msg, "not implemented in this build") {
				return nil, fmt.Errorf("%w: %s", ErrNotBuilt, msg)
			}
			return nil, fmt.Errorf("extractedprism exited at start-up (%v): %s", exitErr, p.Tail(2000))
		}
		resp, err := d.client.Get(healthURL + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return d, nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			d.Stop()
			return nil, fmt.Errorf("extractedprism health server did not answer within 20s (last: %v)\n%s", err, p.Tail(2000))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// lastErrorLine returns the last line of the daemon's log that names an
// error: the start-up refusal is printed as "extractedprism: <err>".
func lastErrorLine(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	var last string
	s := bufio.NewScanner(f)
	for s.Scan() {
		if line := s.Text(); strings.HasPrefix(line, "extractedprism:") {
			last = line
		}
	}
	return last
}

// ProbeMode reports whether the daemon binary accepts a mode, by starting it
// on spare ports in w1 with one static endpoint and no discovery. It
// returns ErrNotBuilt for a refused mode.
func (c *Cluster) ProbeMode(ctx context.Context, binary string, mode Mode, logPath string) error {
	cfg := DaemonConfig{Binary: binary, Mode: mode, Settings: DefaultSettings, Endpoints: []string{APIAddr("cp1")},
		LogPath: logPath, BindPort: 17445, HealthPort: 17446, NoDiscovery: true}
	if mode.Chart {
		// The token is issued once the row has restored the cluster; a
		// missing token file fails only probes, not the start.
		cfg.TokenFile = filepath.Join(c.Dir, "probe-mode.token")
	}
	d, err := c.StartDaemon(ctx, cfg)
	if err != nil {
		return err
	}
	return d.Stop()
}

// Pid is the daemon's process id (the process runs inside w1); with
// Activated, the current one, 0 between a stop and the next start.
func (d *Daemon) Pid() int {
	if d.activated {
		return d.daemonChild()
	}
	return d.proc.Pid()
}

// Stop sends SIGTERM and waits; the daemon promises to exit within about
// 10 s (5 s for connections, 5 s for the health server).
func (d *Daemon) Stop() error {
	if d.activated {
		return d.stopActivated()
	}
	return d.proc.Stop(20 * time.Second)
}

// Exited reports whether the daemon has exited.
func (d *Daemon) Exited() bool {
	exited, _ := d.proc.Exited()
	return exited
}

// Get fetches a path from the daemon's health server.
func (d *Daemon) Get(path string) (int, string, error) {
	resp, err := d.client.Get("http://" + HealthAddr + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b), err
}

// Metrics scrapes /metrics.
func (d *Daemon) Metrics() (Samples, error) {
	code, body, err := d.Get("/metrics")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("/metrics: status %d", code)
	}
	return ParseMetrics(body), nil
}

// LogContains reports whether a line of the daemon's log contains every
// one of the strings.
func (d *Daemon) LogContains(parts ...string) bool {
	return logContains(d.LogPath, parts...)
}

func logContains(path string, parts ...string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64*1024), 1<<20)
next:
	for s.Scan() {
		line := s.Text()
		for _, p := range parts {
			if !strings.Contains(line, p) {
				continue next
			}
		}
		return true
	}
	return false
}

// CountLog counts the daemon's log lines that contain every one of the
// strings.
func (d *Daemon) CountLog(parts ...string) int {
	f, err := os.Open(d.LogPath)
	if err != nil {
		return 0
	}
	defer f.Close()
	n := 0
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64*1024), 1<<20)
next:
	for s.Scan() {
		line := s.Text()
		for _, p := range parts {
			if !strings.Contains(line, p) {
				continue next
			}
		}
		n++
	}
	return n
}

// upstreamState is what the tests read of one upstream in /upstreams.
type upstreamState struct {
	known     bool // in the pool
	draining  bool
	fromKube  bool // listed by Kubernetes discovery
	fromCache bool // listed by the endpoint cache
}

// upstreamJSON is what the tests read of one upstream in /upstreams.
type upstreamJSON struct {
	Address     string   `json:"address"`
	Sources     []string `json:"sources"`
	Draining    bool     `json:"draining"`
	Connections int      `json:"connections"`
	LongLived   int      `json:"long_lived_connections"`
}

// upstreams reads the daemon's /upstreams.
func (d *Daemon) upstreams() ([]upstreamJSON, error) {
	code, body, err := d.Get("/upstreams")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("/upstreams: status %d", code)
	}
	var doc struct {
		Upstreams []upstreamJSON `json:"upstreams"`
	}
	if err := json.Unmarshal([]byte(body), &doc); err != nil {
		return nil, fmt.Errorf("/upstreams: %w", err)
	}
	return doc.Upstreams, nil
}

// upstream reads addr's state from the daemon's /upstreams.
func (d *Daemon) upstream(addr string) (upstreamState, error) {
	us, err := d.upstreams()
	if err != nil {
		return upstreamState{}, err
	}
	for _, u := range us {
		if u.Address == addr {
			return upstreamState{known: true, draining: u.Draining, fromKube: slices.Contains(u.Sources, "kubernetes"),
				fromCache: slices.Contains(u.Sources, "cache")}, nil
		}
	}
	return upstreamState{}, nil
}

// onlyProxiedUpstream returns the one upstream with a proxied connection
// in the daemon's /upstreams: before the workload starts, discovery's own.
func (d *Daemon) onlyProxiedUpstream() (string, error) {
	us, err := d.upstreams()
	if err != nil {
		return "", err
	}
	var with []string
	addr := ""
	for _, u := range us {
		if u.Connections > 0 {
			with = append(with, fmt.Sprintf("%s: %d", u.Address, u.Connections))
			if u.Connections == 1 {
				addr = u.Address
			}
		}
	}
	if len(with) != 1 || addr == "" {
		return "", fmt.Errorf("want one upstream with one proxied connection, discovery's: got %v", with)
	}
	return addr, nil
}
