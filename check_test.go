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
	err := run(context.Background(), append([]string{cmd}, args...), envOf(env), &out, &out)
	return out.String(), err
}

// check accepts what a start would accept, lists the settings that would
// have no effect as warnings, and binds nothing: it passes with both ports
// held by someone else, where a start fails.
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
		// Files are read at start, on the node; the chart's hook runs
		// elsewhere.
		{"files not read", []string{"--endpoints", testEndpoint, "--health-check", "readyz",
			"--health-check-ca-file", "/nonexistent/ca.crt"}, nil, valid},
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
	err := run(context.Background(), append([]string{"--endpoints", testEndpoint}, ports...), envOf(nil), &bytes.Buffer{}, &bytes.Buffer{})
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
			startErr := run(context.Background(), args, envOf(tt.env), &bytes.Buffer{}, &bytes.Buffer{})
			if startErr == nil || startErr.Error() != err.Error() {
				t.Errorf("check and start disagree: check %q; start %v", err, startErr)
			}
		})
	}
}
