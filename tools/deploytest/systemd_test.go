package test

// The systemd example (examples/systemd). systemd-analyze checks the unit;
// the daemon is then run as the unit runs it, as root with no capability
// and no new privileges, from the example's variables, readyz among them:
// it must read kubelet-style credential files (mode
// 0600 in a 0700 directory), find a real TLS API server ready and proxy to
// it. Neither systemd nor its sandbox runs here (no systemd as PID 1).

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var systemdDir = filepath.Join(repoRoot, "examples", "systemd")

// The paths the unit names, which exist only on a node.
const (
	unitExecStart = "ExecStart=/usr/local/bin/extractedprism"
	unitEnvFile   = "EnvironmentFile=/etc/extractedprism/extractedprism.env"
)

// requireTool returns the path of tool, skipping t when it is missing
// unless EP_SYSTEMD_REQUIRE=1 (as CI sets) makes that a failure.
func requireTool(t *testing.T, tool string) string {
	t.Helper()
	path, err := exec.LookPath(tool)
	if err != nil {
		if os.Getenv("EP_SYSTEMD_REQUIRE") == "1" {
			t.Fatalf("%s is required (EP_SYSTEMD_REQUIRE=1): %v", tool, err)
		}
		t.Skipf("%s not installed: %v", tool, err)
	}
	return path
}

// TestSystemdUnitVerifies runs systemd-analyze verify on the unit, with its
// binary and environment file pointed at a built daemon and the example's
// file. verify exits 0 on an unknown key or a misspelt value, so any output
// at all fails the test.
func TestSystemdUnitVerifies(t *testing.T) {
	analyze := requireTool(t, "systemd-analyze")
	unit, err := os.ReadFile(filepath.Join(systemdDir, "extractedprism.service"))
	if err != nil {
		t.Fatalf("%v", err)
	}
	text := string(unit)
	for _, line := range []string{unitExecStart, unitEnvFile} {
		if !strings.Contains(text, line+"\n") {
			t.Fatalf("the unit lacks the line %q", line)
		}
	}
	text = strings.Replace(text, unitExecStart, "ExecStart="+daemonBinary(t), 1)
	envPath, err := filepath.Abs(filepath.Join(systemdDir, "extractedprism.env"))
	if err != nil {
		t.Fatalf("%v", err)
	}
	text = strings.Replace(text, unitEnvFile, "EnvironmentFile="+envPath, 1)
	dir := t.TempDir()
	path := filepath.Join(dir, "extractedprism.service")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatalf("%v", err)
	}
	socket, err := os.ReadFile(filepath.Join(systemdDir, "extractedprism.socket"))
	if err != nil {
		t.Fatalf("%v", err)
	}
	socketPath := filepath.Join(dir, "extractedprism.socket")
	if err := os.WriteFile(socketPath, socket, 0o600); err != nil {
		t.Fatalf("%v", err)
	}
	out, err := exec.Command(analyze, "verify", path, socketPath).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// TestSystemdSocketMatchesSettings checks that extractedprism.socket
// listens where the example's settings put the proxy and the health
// server, in that order: the daemon refuses a socket they do not describe.
// It checks the files as shipped, and with the opt-in for scraping from
// other hosts taken: EP_HEALTH_BIND_ADDRESS uncommented in the settings,
// and the commented ListenStream= in place of the health server's.
func TestSystemdSocketMatchesSettings(t *testing.T) {
	unit, err := os.ReadFile(filepath.Join(systemdDir, "extractedprism.socket"))
	if err != nil {
		t.Fatalf("%v", err)
	}
	listen, optInListen := socketListens(string(unit))
	env := systemdEnv(t)
	if env["EP_HEALTH_BIND_ADDRESS"] != "" {
		t.Errorf("EP_HEALTH_BIND_ADDRESS=%q as shipped; want loopback until the operator opts in", env["EP_HEALTH_BIND_ADDRESS"])
	}
	checkSocketSettings(t, "as shipped", listen, env)

	optInEnv := maps.Clone(env)
	envText, err := os.ReadFile(filepath.Join(systemdDir, "extractedprism.env"))
	if err != nil {
		t.Fatalf("%v", err)
	}
	for line := range strings.SplitSeq(string(envText), "\n") {
		if v, ok := strings.CutPrefix(line, "#EP_HEALTH_BIND_ADDRESS="); ok {
			optInEnv["EP_HEALTH_BIND_ADDRESS"] = v
		}
	}
	if optInEnv["EP_HEALTH_BIND_ADDRESS"] != "0.0.0.0" {
		t.Errorf("the settings' opt-in is EP_HEALTH_BIND_ADDRESS=%q; want a commented #EP_HEALTH_BIND_ADDRESS=0.0.0.0", optInEnv["EP_HEALTH_BIND_ADDRESS"])
	}
	checkSocketSettings(t, "opted in to scraping", optInListen, optInEnv)
	daemonCheck(t, optInEnv)
	if service := unitSettings(t); service["Requires"] != "extractedprism.socket" {
		t.Errorf("the service has Requires=%q; want extractedprism.socket", service["Requires"])
	}
}

// socketListens returns a socket unit's ListenStream= addresses, and the
// same with each commented #ListenStream= line in place of the one before.
func socketListens(unit string) (listen, optIn []string) {
	for line := range strings.SplitSeq(unit, "\n") {
		line = strings.TrimSpace(line)
		if v, ok := strings.CutPrefix(line, "ListenStream="); ok {
			listen = append(listen, v)
			optIn = append(optIn, v)
		} else if v, ok := strings.CutPrefix(line, "#ListenStream="); ok && len(optIn) > 0 {
			optIn[len(optIn)-1] = v
		}
	}
	return listen, optIn
}

// checkSocketSettings checks that listen holds the proxy's and the health
// server's addresses as the settings env give them, in that order.
func checkSocketSettings(t *testing.T, what string, listen []string, env map[string]string) {
	t.Helper()
	or := func(name, def string) string { return cmp.Or(env[name], def) }
	bind := or("EP_BIND_ADDRESS", "127.0.0.1")
	want := []string{net.JoinHostPort(bind, or("EP_BIND_PORT", "7445")), net.JoinHostPort(or("EP_HEALTH_BIND_ADDRESS", bind), or("EP_HEALTH_PORT", "7446"))}
	if !slices.Equal(listen, want) {
		t.Errorf("%s: ListenStream= %q; want %q, the proxy's and the health server's addresses", what, listen, want)
	}
}

// unitSettings returns the unit's Key=value lines; a key set twice keeps
// its last value, as in systemd.
func unitSettings(t *testing.T) map[string]string {
	t.Helper()
	unit, err := os.ReadFile(filepath.Join(systemdDir, "extractedprism.service"))
	if err != nil {
		t.Fatalf("%v", err)
	}
	settings := map[string]string{}
	for line := range strings.SplitSeq(string(unit), "\n") {
		if key, value, ok := strings.Cut(strings.TrimSpace(line), "="); ok && !strings.HasPrefix(key, "#") {
			settings[key] = value
		}
	}
	return settings
}

// systemdEnv returns the example's variables, checking that every one is
// a variable the daemon reads.
func systemdEnv(t *testing.T) map[string]string {
	t.Helper()
	path := filepath.Join(systemdDir, "extractedprism.env")
	env := envFile(t, path)
	known := daemonVariables(t)
	for name := range env {
		if !known[name] {
			t.Errorf("%s sets %s, which the daemon does not read", path, name)
		}
	}
	if env["EP_HEALTH_CHECK"] != "readyz" {
		t.Fatalf("%s: EP_HEALTH_CHECK=%q; want readyz, the chart's", path, env["EP_HEALTH_CHECK"])
	}
	return env
}

// TestSystemdExampleDiscovery checks that the example runs discovery with
// the kubelet's kubeconfig and keeps the endpoint cache in the directory
// the unit's StateDirectory= makes, the one path ProtectSystem=strict
// leaves writable.
func TestSystemdExampleDiscovery(t *testing.T) {
	env := systemdEnv(t)
	unit := unitSettings(t)
	for name, want := range map[string]string{
		"EP_ENABLE_DISCOVERY": "true",
		"EP_KUBECONFIG":       "/etc/kubernetes/kubelet.conf",
	} {
		if env[name] != want {
			t.Errorf("%s = %q; want %q", name, env[name], want)
		}
	}
	if unit["StateDirectory"] == "" {
		t.Fatal("the unit has no StateDirectory=")
	}
	stateDir := "/var/lib/" + unit["StateDirectory"]
	if cache := env["EP_ENDPOINT_CACHE_FILE"]; filepath.Dir(cache) != stateDir {
		t.Errorf("EP_ENDPOINT_CACHE_FILE = %q; want a file in %s, the unit's state directory", cache, stateDir)
	}
}

// TestSystemdExampleRunsWithoutCapabilities runs the daemon as the unit
// does (root, CapabilityBoundingSet= and NoNewPrivileges=yes, through
// setpriv) with the example's settings, the credential paths pointed at
// files laid out like the kubelet's (a kubeconfig naming the certificate
// file), the endpoint cache in a root-only state directory, and a TLS API
// server on loopback that serves /readyz and the kubernetes EndpointSlice.
// The daemon must discover the slice's endpoint with the kubeconfig's
// credentials and write it to the cache.
func TestSystemdExampleRunsWithoutCapabilities(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, as the unit runs the daemon")
	}
	setpriv := requireTool(t, "setpriv")
	activate := requireTool(t, "systemd-socket-activate")
	unit := unitSettings(t)
	if unit["CapabilityBoundingSet"] != "" || unit["NoNewPrivileges"] != "yes" || unit["User"] != "" {
		t.Fatalf("the unit no longer runs the daemon as root without capabilities (CapabilityBoundingSet=%q NoNewPrivileges=%q User=%q); change this test with it",
			unit["CapabilityBoundingSet"], unit["NoNewPrivileges"], unit["User"])
	}
	env := systemdEnv(t)
	pki := writePKI(t, t.TempDir())
	creds := filepath.Join(t.TempDir(), "pki")
	if err := os.Mkdir(creds, 0o700); err != nil {
		t.Fatalf("%v", err)
	}
	// kubelet-client-current.pem holds the certificate and its key.
	clientPEM := filepath.Join(creds, "kubelet-client-current.pem")
	caFile := filepath.Join(creds, "ca.crt")
	for path, data := range map[string][]byte{clientPEM: append(pki.adminCertPEM, pki.adminKeyPEM...), caFile: pki.caPEM} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatalf("%v", err)
		}
	}
	// The kubelet's kubeconfig as its bootstrap writes it: the CA and the
	// one certificate-and-key file named by path.
	kubeconfig := filepath.Join(t.TempDir(), "kubelet.conf")
	if err := os.WriteFile(kubeconfig, []byte(kubeletKubeconfig(caFile, clientPEM)), 0o600); err != nil {
		t.Fatalf("%v", err)
	}
	state := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatalf("%v", err)
	}
	// An address on loopback that nothing serves: discovery only has to
	// report it, and it differs from the static endpoint.
	discovered := net.JoinHostPort("127.0.0.2", strconv.Itoa(freePort(t)))
	upstream := readyzServer(t, pki, discovered)
	bindPort, healthPort := freePort(t), freePort(t)
	env["EP_ENDPOINTS"] = upstream // loopback only, never the example's addresses
	env["EP_KUBECONFIG"] = kubeconfig
	env["EP_ENDPOINT_CACHE_FILE"] = filepath.Join(state, "endpoints.json")
	env["EP_BIND_PORT"], env["EP_HEALTH_PORT"] = strconv.Itoa(bindPort), strconv.Itoa(healthPort)
	env["EP_HEALTH_CHECK_CA_FILE"] = caFile
	env["EP_HEALTH_CHECK_CERT_FILE"], env["EP_HEALTH_CHECK_KEY_FILE"] = clientPEM, clientPEM

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	// The sockets come from systemd-socket-activate, as from
	// extractedprism.socket: it opens them and execs setpriv, which execs
	// the daemon, one process throughout, as LISTEN_PID wants.
	// It hands the daemon only the variables given with --setenv.
	args := []string{"--listen", net.JoinHostPort("127.0.0.1", strconv.Itoa(bindPort)),
		"--listen", net.JoinHostPort("127.0.0.1", strconv.Itoa(healthPort)), "--fdname", "extractedprism:extractedprism"}
	for name, value := range env {
		args = append(args, "--setenv", name+"="+value)
	}
	args = append(args, setpriv, "--no-new-privs", "--bounding-set=-all", "--inh-caps=-all", "--ambient-caps=-all", "--", daemonBinary(t))
	cmd := exec.CommandContext(ctx, activate, args...)
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	var logs lockedBuffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("%v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() { _ = cmd.Process.Kill() }()

	health := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(healthPort))
	waitFor(ctx, t, "the daemon's /readyz with the upstream ready", func() error {
		select {
		case err := <-exited:
			t.Fatalf("the daemon ended: %v\n%s", err, logs.String())
		default:
		}
		return getOK(http.DefaultClient, health+"/readyz")
	})
	checkNoPrivileges(t, cmd.Process.Pid)
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: apiClientTLS(t, pki)}}
	if err := getOK(client, "https://"+net.JoinHostPort("127.0.0.1", strconv.Itoa(bindPort))+"/readyz"); err != nil {
		t.Errorf("a request through the daemon: %v", err)
	}
	waitFor(ctx, t, "the discovered endpoint in the cache", func() error {
		data, err := os.ReadFile(env["EP_ENDPOINT_CACHE_FILE"])
		if err != nil {
			return err
		}
		if !strings.Contains(string(data), discovered) {
			return fmt.Errorf("the cache holds %s; want %s", data, discovered)
		}
		return nil
	})
	if out := logs.String(); strings.Contains(out, "permission denied") {
		t.Errorf("the daemon met a permission error:\n%s", out)
	}
	if n := strings.Count(logs.String(), "using the listening socket the service manager passed"); n != 2 {
		t.Errorf("the daemon used %d passed sockets; want 2, the proxy's and the health server's:\n%s", n, logs.String())
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("%v", err)
	}
	if err := <-exited; err != nil {
		t.Errorf("after SIGTERM: %v; want exit status 0\n%s", err, logs.String())
	}
}

// lockedBuffer is a bytes.Buffer that the process's output copier and the
// test may use at once.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// kubeletKubeconfig is a kubeconfig like the one the kubelet writes after
// its bootstrap: a server (which the daemon replaces with its listener),
// the CA, and the rotating certificate-and-key file for both client fields.
func kubeletKubeconfig(caFile, clientPEM string) string {
	return `apiVersion: v1
kind: Config
clusters:
  - name: default-cluster
    cluster:
      server: https://192.0.2.11:6443
      certificate-authority: ` + caFile + `
users:
  - name: default-auth
    user:
      client-certificate: ` + clientPEM + `
      client-key: ` + clientPEM + `
contexts:
  - name: default-context
    context:
      cluster: default-cluster
      user: default-auth
current-context: default-context
`
}

// sliceList is the kubernetes EndpointSlice list an API server answers,
// with one ready endpoint.
func sliceList(endpoint string) (string, error) {
	host, port, err := net.SplitHostPort(endpoint)
	if err != nil {
		return "", err
	}
	return `{"kind":"EndpointSliceList","apiVersion":"discovery.k8s.io/v1","metadata":{"resourceVersion":"1"},"items":[{` +
		`"metadata":{"name":"kubernetes","namespace":"default","labels":{"kubernetes.io/service-name":"kubernetes"}},` +
		`"addressType":"IPv4","endpoints":[{"addresses":["` + host + `"],"conditions":{"ready":true}}],` +
		`"ports":[{"name":"https","port":` + port + `,"protocol":"TCP"}]}]}`, nil
}

// readyzServer starts a TLS server on loopback with the test PKI's serving
// certificate that, like kube-apiserver, wants a client certificate from
// its CA, answers /readyz with 200 and lists the kubernetes EndpointSlice
// with the one endpoint discovered. A watch ends at once, as one closed by
// the API server would. It returns its address.
func readyzServer(t *testing.T, pki testPKI, discovered string) string {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(pki.servingCert, pki.servingKey)
	if err != nil {
		t.Fatalf("%v", err)
	}
	clientCAs := x509.NewCertPool()
	clientCAs.AppendCertsFromPEM(pki.caPEM)
	list, err := sliceList(discovered)
	if err != nil {
		t.Fatalf("%v", err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/readyz":
			_, _ = fmt.Fprint(w, "ok")
		case r.URL.Path == "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices" && r.URL.Query().Get("watch") != "":
			w.Header().Set("Content-Type", "application/json")
		case r.URL.Path == "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices":
			w.Header().Set("Content-Type", "application/json")
			_, _ = fmt.Fprint(w, list)
		default:
			http.NotFound(w, r)
		}
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: clientCAs, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// apiClientTLS is a client's TLS configuration for the test API server:
// the admin certificate, and the serving certificate verified as
// "kubernetes", as a kubeconfig with tls-server-name does.
func apiClientTLS(t *testing.T, pki testPKI) *tls.Config {
	t.Helper()
	cert, err := tls.X509KeyPair(pki.adminCertPEM, pki.adminKeyPEM)
	if err != nil {
		t.Fatalf("%v", err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pki.caPEM)
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: roots, ServerName: "kubernetes", MinVersion: tls.VersionTLS12}
}

// getOK fails unless a GET of url answers 200.
func getOK(client *http.Client, url string) error {
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}

// checkNoPrivileges checks in /proc that process pid has no capability,
// effective or in its bounding set, and cannot gain privileges.
func checkNoPrivileges(t *testing.T, pid int) {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("%v", err)
	}
	for _, want := range []string{"CapEff:\t0000000000000000", "CapBnd:\t0000000000000000", "NoNewPrivs:\t1"} {
		if !strings.Contains(string(status), want+"\n") {
			t.Errorf("/proc/%d/status lacks %q:\n%s", pid, want, status)
		}
	}
}
