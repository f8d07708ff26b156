package main

import (
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
)

func TestOwnListener(t *testing.T) {
	local := []netip.Addr{netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("fd00::5")}
	tests := []struct {
		endpoint, listen string
		want             bool
	}{
		{"127.0.0.1:7445", "127.0.0.1:7445", true},
		{"127.0.0.1:7446", "127.0.0.1:7445", false},
		{"127.0.0.2:7445", "127.0.0.1:7445", false}, // refused, not a loop
		{"0.0.0.0:7445", "127.0.0.1:7445", true},    // Linux dials 0.0.0.0 as this host
		{"localhost:7445", "127.0.0.1:7445", true},
		{"localhost.:7445", "127.0.0.1:7445", true}, // fully qualified
		{"LOCALHOST:7445", "[::1]:7445", true},
		{"[::ffff:127.0.0.1]:7445", "127.0.0.1:7445", true},
		{"[::1]:7445", "[::]:7445", true},
		{"127.0.0.1:7445", "0.0.0.0:7445", true},
		{"10.1.2.3:7445", "0.0.0.0:7445", true}, // a wildcard listener answers on every interface
		{"[fd00::5]:7445", "[::]:7445", true},
		{"10.1.2.4:7445", "0.0.0.0:7445", false},
		{"10.1.2.3:7445", "10.1.2.3:7445", true},
		{"10.1.2.3:7445", "127.0.0.1:7445", false},
		{"0.0.0.0:7445", "10.1.2.3:7445", true},
		{"api.example.com:7445", "0.0.0.0:7445", false}, // not resolved
		{"10.0.0.1:6443", "not an address", false},
	}
	for _, tt := range tests {
		if got := ownListener(tt.endpoint, tt.listen, local); got != tt.want {
			t.Errorf("ownListener(%q, %q) = %v; want %v", tt.endpoint, tt.listen, got, tt.want)
		}
	}
}

// An --endpoints entry that is the proxy's own listener is refused before
// anything listens: the proxy would be its own upstream.
func TestParseConfigRefusesOwnListener(t *testing.T) {
	for _, args := range [][]string{
		{"--endpoints=10.0.0.1:6443,127.0.0.1:7445"},
		{"--endpoints=localhost:7445"},
		{"--endpoints=[::1]:9000", "--bind-address=::", "--bind-port=9000", "--health-port=9001"},
		{"--endpoints=127.0.0.1:9000", "--bind-address=localhost", "--bind-port=9000", "--health-port=9001"},
	} {
		_, err := parseConfig(args, envOf(nil), io.Discard)
		if err == nil || !strings.Contains(err.Error(), "own listener") {
			t.Errorf("%q: got %v; want the endpoint refused as the proxy's own listener", args, err)
		}
	}
	if _, err := parseConfig([]string{"--endpoints=127.0.0.1:7445", "--bind-port=7000"}, envOf(nil), io.Discard); err != nil {
		t.Errorf("an endpoint on another port of the same address: %v", err)
	}
}

// An endpoint cache naming the proxy's own listener (written by someone
// else, or left from another configuration) does not make the proxy its
// own upstream: the entry is dropped with a warning, and the rest serves.
func TestRunIgnoresOwnListenerInCache(t *testing.T) {
	alive := startUpstream(t, echo)
	ownPort := strconv.Itoa(freePort(t))
	own := net.JoinHostPort("127.0.0.1", ownPort)
	cachePath := t.TempDir() + "/endpoints.json"
	c := &endpointCache{path: cachePath, log: slog.New(slog.DiscardHandler)}
	if err := c.store([]string{own, alive.addr}); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, nil, "--endpoints", deadAddr(t), "--enable-discovery=true",
		"--kubeconfig", uselessKubeconfig(t), "--endpoint-cache-file", cachePath, "--bind-port", ownPort)
	for i := range 10 {
		if err := roundTrip(dialProxy(t, own), []byte("not through a loop")); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
	}
	if _, body := httpGet(d.healthBase + "/upstreams"); strings.Contains(body, own) {
		t.Errorf("/upstreams lists the proxy's own listener %s:\n%s", own, body)
	}
	d.waitForLog(t, "ignoring endpoints that are this proxy's own listener")
}
