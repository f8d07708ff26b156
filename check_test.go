package main

import (
	"bytes"
	"context"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// heldPorts returns two loopback ports that stay taken until t ends.
func heldPorts(t *testing.T) (string, string) {
	t.Helper()
	var ports []string
	for range 2 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ln.Close() })
		ports = append(ports, strconv.Itoa(ln.Addr().(*net.TCPAddr).Port))
	}
	return ports[0], ports[1]
}

// runSub runs the subcommand cmd ("check", "status") with args and env and
// returns its output and error.
func runSub(cmd string, args []string, env map[string]string) (string, error) {
	var out bytes.Buffer
	err := run(context.Background(), append([]string{cmd}, args...), envOf(env), environOf(env), &out, &out)
	return out.String(), err
}

// check accepts what a start would accept, lists what a start would warn
// of (settings without effect, unknown EP_ variables, a kubeconfig that does
// not load) as warnings, exiting 0, and binds nothing: it passes with both
// ports held by someone else, where a start fails.
func TestRunCheckAcceptsValidConfiguration(t *testing.T) {
	bindPort, healthPort := heldPorts(t)
	ports := []string{"--bind-port", bindPort, "--health-port", healthPort}
	const valid = "extractedprism check: configuration is valid\n"
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"plain", []string{"--endpoints", testEndpoint}, nil, valid},
		{"from variables", nil, map[string]string{"EP_ENDPOINTS": testEndpoint, "EP_UPSTREAM_SELECTION": "latency"}, valid},
		{"ignored settings", []string{"--endpoints", testEndpoint, "--enable-discovery=false", "--kubeconfig", "/kc"},
			map[string]string{"EP_HEALTH_CHECK_TOKEN_FILE": "/token"},
			"warning: --health-check-token-file (EP_HEALTH_CHECK_TOKEN_FILE) has no effect: --health-check (EP_HEALTH_CHECK) is tcp\n" +
				"warning: --kubeconfig (EP_KUBECONFIG) has no effect: --enable-discovery (EP_ENABLE_DISCOVERY) is false\n" + valid},
		{"unknown variables", []string{"--endpoints", testEndpoint},
			map[string]string{"EP_HEALTH_CHEK": "readyz", "EP_SERVICE_HOST": "10.96.0.1", "HOME": "/root"},
			"warning: EP_HEALTH_CHEK has no effect: no flag reads it; did you mean EP_HEALTH_CHECK?\n" +
				"warning: EP_SERVICE_HOST has no effect: no flag reads it\n" + valid},
		// A start retries it: a warning, as start gives.
		{"kubeconfig does not load", []string{"--endpoints", testEndpoint, "--kubeconfig", "/nonexistent/kubelet.conf"}, nil,
			"warning: --kubeconfig (EP_KUBECONFIG) has no effect: it does not load here: load kubeconfig /nonexistent/kubelet.conf: " +
				"stat /nonexistent/kubelet.conf: no such file or directory; a start retries it, serving the static endpoints meanwhile\n" + valid},
		// A start stops on it, but the chart's hook runs in a pod of its
		// own, where the node's files may be missing: a warning.
		{"CA does not load", []string{"--endpoints", testEndpoint, "--health-check", "readyz",
			"--health-check-ca-file", "/nonexistent/ca.crt"}, nil,
			"warning: a start here would stop: --health-check-ca-file (EP_HEALTH_CHECK_CA_FILE): readyz: read CA: " +
				"open /nonexistent/ca.crt: no such file or directory\n" + valid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := runSub("check", append(tt.args, ports...), tt.env)
			if err != nil {
				t.Fatalf("check: got %v; want nil", err)
			}
			if out != tt.want {
				t.Errorf("check output: got %q; want %q", out, tt.want)
			}
		})
	}
	// The ports are held: a start with the same settings cannot listen.
	err := run(context.Background(), append([]string{"--endpoints", testEndpoint}, ports...), envOf(nil), environOf(nil), &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Errorf("start on the held ports: got %v; want address already in use", err)
	}
}

// check fails, through run's error, with exactly the message a start would
// stop with, and does not call the configuration valid.
func TestRunCheckRefusesWithTheDaemonsMessage(t *testing.T) {
	// Held ports: a start that wrongly got past validation fails at once
	// rather than running.
	bindPort, healthPort := heldPorts(t)
	ports := []string{"--bind-port", bindPort, "--health-port", healthPort}
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string // in the error
	}{
		{"rule", []string{"--endpoints", testEndpoint, "--health-timeout", "30s"}, nil,
			"--health-timeout (EP_HEALTH_TIMEOUT) must be less than --health-interval (EP_HEALTH_INTERVAL)"},
		{"every bad value at once", []string{"--endpoints", testEndpoint, "--drain-timeout", "soon"},
			map[string]string{"EP_LIVENESS_INTERVAL": "often"},
			`--drain-timeout (EP_DRAIN_TIMEOUT): invalid duration "soon"` + "\n" + `EP_LIVENESS_INTERVAL (--liveness-interval): invalid duration "often"`},
		{"no endpoints", nil, nil, "--endpoints (EP_ENDPOINTS) must not be empty"},
		{"typo named", nil, map[string]string{"EP_ENDPOINT": testEndpoint},
			"--endpoints (EP_ENDPOINTS) must not be empty: want a comma-separated list of host:port\n" +
				"EP_ENDPOINT has no effect: no flag reads it; did you mean EP_ENDPOINTS?"},
		{"unknown flag", []string{"--endpoints", testEndpoint, "--endpoint", testEndpoint}, nil,
			"flag provided but not defined: -endpoint (--help lists the flags)"},
		{"argument", []string{"--endpoints", testEndpoint, "10.0.0.2:6443"}, nil, `unexpected argument "10.0.0.2:6443"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := slices.Concat(ports, tt.args)
			out, err := runSub("check", args, tt.env)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("check: got %v; want an error with %q", err, tt.want)
			}
			if strings.Contains(out, "valid") {
				t.Errorf("check output: got %q; want no verdict of valid", out)
			}
			startErr := run(context.Background(), args, envOf(tt.env), environOf(tt.env), &bytes.Buffer{}, &bytes.Buffer{})
			if startErr == nil || startErr.Error() != err.Error() {
				t.Errorf("check and start disagree: check %q; start %v", err, startErr)
			}
		})
	}
}

// An EP_ variable no flag reads is named, with the one it is a typo of
// when one is near; other variables are not the daemon's.
func TestUnknownVariables(t *testing.T) {
	tests := []struct {
		environ []string
		want    []string // "NAME: because"
	}{
		{[]string{"EP_HEALTH_CHEK=readyz"}, []string{"EP_HEALTH_CHEK: no flag reads it; did you mean EP_HEALTH_CHECK?"}},
		{[]string{"EP_BIND_PROT=7445"}, []string{"EP_BIND_PROT: no flag reads it; did you mean EP_BIND_PORT?"}},
		{[]string{"EP_HEALTHCHECK_CA_FILE=/ca"}, []string{"EP_HEALTHCHECK_CA_FILE: no flag reads it; did you mean EP_HEALTH_CHECK_CA_FILE?"}},
		{[]string{"EP_LIVENESS_TRESHOLD=20s", "EP_ENDPOINT=x"}, []string{
			"EP_ENDPOINT: no flag reads it; did you mean EP_ENDPOINTS?",
			"EP_LIVENESS_TRESHOLD: no flag reads it; did you mean EP_LIVENESS_THRESHOLD?"}},
		// Far from every flag's variable: a suggestion would be a guess.
		{[]string{"EP_SERVICE_HOST=10.96.0.1", "EP_PORT=tcp://10.96.0.1:443", "EP_VERSION=1"}, []string{
			"EP_PORT: no flag reads it", "EP_SERVICE_HOST: no flag reads it", "EP_VERSION: no flag reads it"}},
		{[]string{"EP_HEALTH_CHECK=readyz", "EP_ENDPOINTS=", "HEALTH_CHEK=1", "ep_health_chek=1", "PATH=/bin"}, nil},
	}
	for _, tt := range tests {
		var got []string
		for _, ig := range unknownVariables(tt.environ) {
			got = append(got, ig.setting+": "+ig.because)
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("%q: got %q; want %q", tt.environ, got, tt.want)
		}
	}
}

func TestEditDistance(t *testing.T) {
	for _, tt := range []struct {
		a, b string
		want int
	}{{"", "", 0}, {"", "abc", 3}, {"abc", "", 3}, {"kitten", "sitting", 3}, {"CHEK", "CHECK", 1}, {"PROT", "PORT", 2}} {
		if got := editDistance(tt.a, tt.b); got != tt.want {
			t.Errorf("editDistance(%q, %q): got %d; want %d", tt.a, tt.b, got, tt.want)
		}
	}
}
