package main

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"log/slog"
	"os"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

const testEndpoint = "10.0.0.1:6443"

// envOf returns a getenv that reads the variables in m.
func envOf(m map[string]string) func(string) string {
	return func(name string) string { return m[name] }
}

// specFlags are the flags of the operator manual's table, plus --kubeconfig.
var specFlags = []string{
	"bind-address", "bind-port", "health-port", "health-bind-address",
	"endpoints", "health-interval", "health-timeout", "enable-discovery",
	"log-level", "liveness-interval", "liveness-threshold", "drain-timeout",
	"upstream-selection", "health-check", "health-check-ca-file",
	"health-check-cert-file", "health-check-key-file",
	"health-check-token-file", "health-check-server-name", "kubeconfig",
}

func TestParseConfigDefaults(t *testing.T) {
	got, err := parseConfig([]string{"--endpoints=" + testEndpoint}, envOf(nil), io.Discard)
	if err != nil {
		t.Fatalf("parseConfig: got %v; want nil", err)
	}
	want := &config{
		BindAddress:           "127.0.0.1",
		BindPort:              7445,
		HealthBindAddress:     "127.0.0.1",
		HealthPort:            7446,
		Endpoints:             []string{testEndpoint},
		HealthInterval:        20 * time.Second,
		HealthTimeout:         15 * time.Second,
		EnableDiscovery:       true,
		LogLevel:              "info",
		LivenessInterval:      5 * time.Second,
		LivenessThreshold:     15 * time.Second,
		DrainTimeout:          30 * time.Second,
		UpstreamSelection:     "random",
		HealthCheck:           "tcp",
		HealthCheckServerName: "kubernetes.default.svc",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v; want %+v", got, want)
	}
}

func TestParseConfigPrecedence(t *testing.T) {
	tests := []struct {
		flag        string
		flagValue   string
		envValue    string
		get         func(*config) any
		wantDefault any
		wantEnv     any
		wantFlag    any
	}{
		{
			flag: "bind-address", flagValue: "10.2.2.2", envValue: "10.1.1.1",
			get:         func(c *config) any { return c.BindAddress },
			wantDefault: "127.0.0.1", wantEnv: "10.1.1.1", wantFlag: "10.2.2.2",
		},
		{
			flag: "bind-port", flagValue: "9000", envValue: "8000",
			get:         func(c *config) any { return c.BindPort },
			wantDefault: 7445, wantEnv: 8000, wantFlag: 9000,
		},
		{
			flag: "health-interval", flagValue: "40s", envValue: "30s",
			get:         func(c *config) any { return c.HealthInterval },
			wantDefault: 20 * time.Second, wantEnv: 30 * time.Second, wantFlag: 40 * time.Second,
		},
		{
			flag: "enable-discovery", flagValue: "true", envValue: "false",
			get:         func(c *config) any { return c.EnableDiscovery },
			wantDefault: true, wantEnv: false, wantFlag: true,
		},
		{
			flag: "kubeconfig", flagValue: "/flag/kubeconfig", envValue: "/env/kubeconfig",
			get:         func(c *config) any { return c.Kubeconfig },
			wantDefault: "", wantEnv: "/env/kubeconfig", wantFlag: "/flag/kubeconfig",
		},
		{
			// --endpoints has no default; the base arguments supply one.
			flag: "endpoints", flagValue: "10.0.0.4:6443", envValue: "10.0.0.2:6443,10.0.0.3:6443",
			get:         func(c *config) any { return c.Endpoints },
			wantDefault: []string{testEndpoint},
			wantEnv:     []string{"10.0.0.2:6443", "10.0.0.3:6443"},
			wantFlag:    []string{"10.0.0.4:6443"},
		},
	}
	for _, tt := range tests {
		env := map[string]string{envName(tt.flag): tt.envValue}
		// The endpoints case can only see its variable without the base flag.
		var base []string
		if tt.flag != "endpoints" {
			base = []string{"--endpoints=" + testEndpoint}
		}
		cases := []struct {
			name string
			args []string
			env  map[string]string
			want any
		}{
			{"default", []string{"--endpoints=" + testEndpoint}, nil, tt.wantDefault},
			{"variable beats default", base, env, tt.wantEnv},
			{"flag beats variable", slices.Concat(base, []string{"--" + tt.flag + "=" + tt.flagValue}), env, tt.wantFlag},
		}
		for _, c := range cases {
			t.Run(tt.flag+"/"+c.name, func(t *testing.T) {
				cfg, err := parseConfig(c.args, envOf(c.env), io.Discard)
				if err != nil {
					t.Fatalf("parseConfig: got %v; want nil", err)
				}
				if got := tt.get(cfg); !reflect.DeepEqual(got, c.want) {
					t.Errorf("got %v; want %v", got, c.want)
				}
			})
		}
	}
}

func TestParseConfigEmptyVariableIsUnset(t *testing.T) {
	env := map[string]string{"EP_BIND_PORT": "", "EP_LOG_LEVEL": "", "EP_HEALTH_CHECK_SERVER_NAME": ""}
	cfg, err := parseConfig([]string{"--endpoints=" + testEndpoint}, envOf(env), io.Discard)
	if err != nil {
		t.Fatalf("parseConfig: got %v; want nil", err)
	}
	if cfg.BindPort != 7445 {
		t.Errorf("BindPort: got %v; want %v", cfg.BindPort, 7445)
	}
	if cfg.LogLevel != "info" {
		t.Errorf("LogLevel: got %v; want %v", cfg.LogLevel, "info")
	}
	if cfg.HealthCheckServerName != "kubernetes.default.svc" {
		t.Errorf("HealthCheckServerName: got %v; want %v", cfg.HealthCheckServerName, "kubernetes.default.svc")
	}
}

func TestParseConfigMalformedVariable(t *testing.T) {
	tests := []struct {
		name  string
		value string
		want  string
	}{
		{"EP_HEALTH_INTERVAL", "abc", `EP_HEALTH_INTERVAL (--health-interval): invalid duration "abc"`},
		{"EP_BIND_PORT", "seven", `EP_BIND_PORT (--bind-port): invalid port "seven"`},
		{"EP_HEALTH_PORT", "0x1d1d", `EP_HEALTH_PORT (--health-port): invalid port "0x1d1d"`},
		{"EP_ENABLE_DISCOVERY", "maybe", `EP_ENABLE_DISCOVERY (--enable-discovery): invalid boolean "maybe"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := map[string]string{tt.name: tt.value}
			_, err := parseConfig([]string{"--endpoints=" + testEndpoint}, envOf(env), io.Discard)
			if err == nil || err.Error() != tt.want {
				t.Errorf("got %v; want %v", err, tt.want)
			}
		})
	}
}

func TestParseConfigMalformedVariableOverriddenByFlag(t *testing.T) {
	// The flag wins, so its variable is never parsed.
	env := map[string]string{"EP_HEALTH_INTERVAL": "abc"}
	args := []string{"--endpoints=" + testEndpoint, "--health-interval=30s"}
	cfg, err := parseConfig(args, envOf(env), io.Discard)
	if err != nil {
		t.Fatalf("parseConfig: got %v; want nil", err)
	}
	if cfg.HealthInterval != 30*time.Second {
		t.Errorf("got %v; want %v", cfg.HealthInterval, 30*time.Second)
	}
}

func TestValidationRules(t *testing.T) {
	tests := []struct {
		name    string
		flag    string   // the flag whose value breaks the rule
		value   string   // given once as the flag, once as its variable
		extra   []string // other flags the case needs
		mention []string // flags the error must name, each with its variable
	}{
		{name: "bind address not a host", flag: "bind-address", value: "not a host!"},
		{name: "health bind address not a host", flag: "health-bind-address", value: "-node"},
		{name: "endpoints empty", flag: "endpoints", value: ""},
		{name: "endpoint without port", flag: "endpoints", value: "10.0.0.1"},
		{name: "endpoint port 0", flag: "endpoints", value: "10.0.0.1:0"},
		{name: "endpoint trailing comma", flag: "endpoints", value: "10.0.0.1:6443,"},
		{name: "bind port 0", flag: "bind-port", value: "0"},
		{name: "bind port 65536", flag: "bind-port", value: "65536"},
		{name: "health port 0", flag: "health-port", value: "0"},
		{name: "health port 65536", flag: "health-port", value: "65536"},
		{name: "health port equals bind port", flag: "health-port", value: "7445", mention: []string{"bind-port"}},
		{name: "health interval below 1s", flag: "health-interval", value: "500ms"},
		{name: "health timeout below 1s", flag: "health-timeout", value: "500ms"},
		{name: "health timeout equals interval", flag: "health-timeout", value: "20s", mention: []string{"health-interval"}},
		{name: "health interval below timeout", flag: "health-interval", value: "10s", mention: []string{"health-timeout"}},
		{name: "log level unknown", flag: "log-level", value: "verbose"},
		{name: "liveness interval below 1s", flag: "liveness-interval", value: "500ms"},
		{name: "liveness threshold below 1s", flag: "liveness-threshold", value: "500ms"},
		{name: "liveness threshold equals interval", flag: "liveness-threshold", value: "5s", mention: []string{"liveness-interval"}},
		{name: "liveness interval above threshold", flag: "liveness-interval", value: "20s", mention: []string{"liveness-threshold"}},
		{name: "drain timeout negative", flag: "drain-timeout", value: "-1s"},
		{name: "upstream selection unknown", flag: "upstream-selection", value: "fastest"},
		{name: "health check unknown", flag: "health-check", value: "http"},
		{name: "readyz without CA", flag: "health-check", value: "readyz", mention: []string{"health-check-ca-file"}},
		{name: "cert without key", flag: "health-check-cert-file", value: "/tls/client.crt", mention: []string{"health-check-key-file"}},
		{name: "key without cert", flag: "health-check-key-file", value: "/tls/client.key", mention: []string{"health-check-cert-file"}},
		// A blank, not an empty, value: an empty variable counts as unset.
		{name: "server name blank", flag: "health-check-server-name", value: " "},
		// A trailing blank, easy to pick up from YAML, would make every
		// probe URL invalid and every upstream unready.
		{name: "server name with a trailing blank", flag: "health-check-server-name", value: "kubernetes.default.svc "},
		{name: "server name with a path", flag: "health-check-server-name", value: "kubernetes/readyz"},
		{name: "server name with an IPv6 zone", flag: "health-check-server-name", value: "fe80::1%eth0"},
	}
	for _, tt := range tests {
		var base []string
		if tt.flag != "endpoints" {
			base = []string{"--endpoints=" + testEndpoint}
		}
		byFlag := slices.Concat(base, tt.extra, []string{"--" + tt.flag + "=" + tt.value})
		byVariable := slices.Concat(base, tt.extra)
		modes := []struct {
			name string
			args []string
			env  map[string]string
		}{
			{"flag", byFlag, nil},
			{"variable", byVariable, map[string]string{envName(tt.flag): tt.value}},
		}
		for _, m := range modes {
			t.Run(tt.name+"/"+m.name, func(t *testing.T) {
				_, err := parseConfig(m.args, envOf(m.env), io.Discard)
				if err == nil {
					t.Fatalf("got nil error; want a violation of %s", flagRef(tt.flag))
				}
				for _, f := range append([]string{tt.flag}, tt.mention...) {
					if !strings.Contains(err.Error(), flagRef(f)) {
						t.Errorf("got %q; want it to name %s", err, flagRef(f))
					}
				}
				assertEveryLineNamesAFlag(t, err)
			})
		}
	}
}

// assertEveryLineNamesAFlag checks that each line of a validation error
// starts with a flag and its variable.
func assertEveryLineNamesAFlag(t *testing.T, err error) {
	t.Helper()
	for line := range strings.SplitSeq(err.Error(), "\n") {
		if !strings.HasPrefix(line, "--") || !strings.Contains(line, " (EP_") {
			t.Errorf("error line %q: got no flag and variable; want both", line)
		}
	}
}

func TestIgnoredSettings(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want []string // the ignored flags, sorted
	}{
		{"none", []string{"--kubeconfig=/kc", "--endpoint-cache-file=/c", "--health-check=readyz", "--health-check-ca-file=/ca"}, nil},
		{"discovery off", []string{"--enable-discovery=false", "--kubeconfig=/kc", "--endpoint-cache-file=/c"},
			[]string{"endpoint-cache-file", "kubeconfig"}},
		{"tcp checks", []string{"--health-check-ca-file=/ca", "--health-check-cert-file=/c", "--health-check-key-file=/k", "--health-check-token-file=/t"},
			[]string{"health-check-ca-file", "health-check-cert-file", "health-check-key-file", "health-check-token-file"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := parseConfig(append([]string{"--endpoints=" + testEndpoint}, tt.args...), envOf(nil), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, ig := range cfg.ignoredSettings() {
				got = append(got, ig.flag)
				if !strings.HasPrefix(ig.because, "--") || !strings.Contains(ig.because, " (EP_") {
					t.Errorf("reason for %s: got %q; want it to name a flag and its variable", ig.flag, ig.because)
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("ignored: got %v; want %v", got, tt.want)
			}
		})
	}
}

func TestValidateMessage(t *testing.T) {
	args := []string{"--endpoints=" + testEndpoint, "--health-timeout=20s"}
	_, err := parseConfig(args, envOf(nil), io.Discard)
	want := "--health-timeout (EP_HEALTH_TIMEOUT) must be less than --health-interval (EP_HEALTH_INTERVAL): got 20s >= 20s"
	if err == nil || err.Error() != want {
		t.Errorf("got %v; want %v", err, want)
	}
}

func TestValidateReportsEveryViolation(t *testing.T) {
	args := []string{"--endpoints=" + testEndpoint, "--bind-port=0", "--drain-timeout=-1s"}
	_, err := parseConfig(args, envOf(nil), io.Discard)
	if err == nil {
		t.Fatal("got nil error; want two violations")
	}
	if got := strings.Count(err.Error(), "\n") + 1; got != 2 {
		t.Errorf("lines in %q: got %v; want %v", err, got, 2)
	}
}

func TestNormalizeEndpoint(t *testing.T) {
	tests := []struct {
		in      string
		want    string
		wantErr bool
	}{
		{in: "10.0.0.1:6443", want: "10.0.0.1:6443"},
		{in: "[fd00::1]:6443", want: "[fd00::1]:6443"},
		{in: "[FD00:0:0::1]:6443", want: "[fd00::1]:6443"},
		{in: "[::ffff:10.0.0.1]:6443", want: "10.0.0.1:6443"},
		{in: "[fe80::1%eth0]:6443", want: "[fe80::1%eth0]:6443"},
		{in: "cp-1:6443", want: "cp-1:6443"},
		{in: "API.Example.COM:6443", want: "api.example.com:6443"},
		{in: "api.example.com.:6443", want: "api.example.com.:6443"}, // fully qualified
		{in: "api.example.com..:6443", wantErr: true},
		{in: ".:6443", wantErr: true},
		{in: "[10.0.0.1]:6443", wantErr: true}, // brackets are for IPv6
		{in: "[api.example.com]:6443", wantErr: true},
		{in: "10.0.0.1:06443", want: "10.0.0.1:6443"},
		{in: "10.0.0.1:65535", want: "10.0.0.1:65535"},
		{in: "10.0.0.1:1", want: "10.0.0.1:1"},
		{in: "fd00::1:6443", wantErr: true},
		{in: "fd00::1", wantErr: true},
		{in: "[fd00::1]", wantErr: true},
		{in: "10.0.0.1:0", wantErr: true},
		{in: "10.0.0.1:65536", wantErr: true},
		{in: "10.0.0.1:-1", wantErr: true},
		{in: "10.0.0.1:https", wantErr: true},
		{in: "10.0.0.1:", wantErr: true},
		{in: "10.0.0.1", wantErr: true},
		{in: ":6443", wantErr: true},
		{in: "", wantErr: true},
		{in: "https://10.0.0.1:6443", wantErr: true},
		{in: "10.0.0.256:6443", wantErr: true},
		{in: "-cp.example.com:6443", wantErr: true},
		{in: "cp_1.example.com:6443", wantErr: true},
		{in: "cp 1:6443", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := normalizeEndpoint(tt.in)
			if gotErr := err != nil; gotErr != tt.wantErr {
				t.Fatalf("error: got %v; want error %v", err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("got %q; want %q", got, tt.want)
			}
		})
	}
}

func TestParseConfigEndpointList(t *testing.T) {
	tests := []struct {
		name    string
		value   string
		want    []string
		wantErr bool
	}{
		{name: "one", value: "10.0.0.1:6443", want: []string{"10.0.0.1:6443"}},
		{
			name:  "spaces and mixed families",
			value: " 10.0.0.1:6443 , [fd00::1]:6443,API.example.com:6443 ",
			want:  []string{"10.0.0.1:6443", "[fd00::1]:6443", "api.example.com:6443"},
		},
		{
			name:  "one upstream written three ways",
			value: "10.0.0.2:6443,10.0.0.1:06443,[::ffff:10.0.0.1]:6443,10.0.0.1:6443",
			want:  []string{"10.0.0.2:6443", "10.0.0.1:6443"},
		},
		{name: "trailing comma", value: "10.0.0.1:6443,", wantErr: true},
		{name: "doubled comma", value: "10.0.0.1:6443,,10.0.0.2:6443", wantErr: true},
		{name: "only commas", value: ",", wantErr: true},
		{name: "unbracketed IPv6", value: "10.0.0.1:6443,fd00::1:6443", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := parseConfig([]string{"--endpoints=" + tt.value}, envOf(nil), io.Discard)
			if tt.wantErr {
				if err == nil || !strings.Contains(err.Error(), flagRef("endpoints")) {
					t.Errorf("got %v; want an error naming %s", err, flagRef("endpoints"))
				}
				return
			}
			if err != nil {
				t.Fatalf("parseConfig: got %v; want nil", err)
			}
			if !reflect.DeepEqual(cfg.Endpoints, tt.want) {
				t.Errorf("got %q; want %q", cfg.Endpoints, tt.want)
			}
		})
	}
}

func TestValidHost(t *testing.T) {
	label63 := strings.Repeat("a", 63)
	tests := []struct {
		in   string
		want bool
	}{
		{"127.0.0.1", true},
		{"::1", true},
		{"fd00::1", true},
		{"fe80::1%eth0", true},
		{"localhost", true},
		{"Node-1.Example.COM", true},
		{"1node.example.com", true},
		{label63 + ".example.com", true},
		{strings.Repeat(label63+".", 3) + strings.Repeat("a", 61), true},  // 253 characters
		{strings.Repeat(label63+".", 3) + strings.Repeat("a", 62), false}, // 254 characters
		{label63 + "a.example.com", false},
		{"", false},
		{"-node", false},
		{"node-", false},
		{"a..b", false},
		{"example.com.", true}, // fully qualified
		{"example.com..", false},
		{".", false},
		{"node_1", false},
		{"node 1", false},
		{"[::1]", false},
		{"10.0.0.256", false},
		{"6443", false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			if got := validHost(tt.in); got != tt.want {
				t.Errorf("got %v; want %v", got, tt.want)
			}
		})
	}
}

// TestHostCorpus holds the daemon to testdata/hosts.txt, the list the Helm
// chart's checks are held to as well (tools/deploytest): each host is
// accepted or refused both as a listen address and as an endpoint's host.
func TestHostCorpus(t *testing.T) {
	data, err := os.ReadFile("testdata/hosts.txt")
	if err != nil {
		t.Fatal(err)
	}
	cases := 0
	for line := range strings.Lines(string(data)) {
		line = strings.TrimSuffix(line, "\n")
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		verdict, host, ok := strings.Cut(line, "\t")
		if !ok || verdict != "accept" && verdict != "reject" {
			t.Fatalf("testdata/hosts.txt: bad line %q", line)
		}
		want := verdict == "accept"
		endpoint := host + ":6443"
		if strings.Contains(host, ":") {
			endpoint = "[" + host + "]:6443"
		}
		if got := validHost(host); got != want {
			t.Errorf("validHost(%q) = %v; want %v", host, got, want)
		}
		if _, err := normalizeEndpoint(endpoint); (err == nil) != want {
			t.Errorf("normalizeEndpoint(%q): err = %v; want accepted %v", endpoint, err, want)
		}
		cases++
	}
	if cases < 40 {
		t.Errorf("testdata/hosts.txt has %d hosts; want the whole list (40 or more)", cases)
	}
}

func TestHealthBindAddress(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		env      map[string]string
		wantBind string
		want     string
	}{
		{name: "defaults", wantBind: "127.0.0.1", want: "127.0.0.1"},
		{name: "IPv6 loopback bind address", args: []string{"--bind-address=::1"}, wantBind: "::1", want: "::1"},
		{name: "follows bind address variable", env: map[string]string{"EP_BIND_ADDRESS": "10.0.0.5"}, wantBind: "10.0.0.5", want: "10.0.0.5"},
		{name: "own flag", args: []string{"--health-bind-address=0.0.0.0"}, wantBind: "127.0.0.1", want: "0.0.0.0"},
		{name: "own variable", env: map[string]string{"EP_HEALTH_BIND_ADDRESS": "node-1"}, wantBind: "127.0.0.1", want: "node-1"},
		{
			name:     "empty variable follows bind address",
			args:     []string{"--bind-address=10.0.0.5"},
			env:      map[string]string{"EP_HEALTH_BIND_ADDRESS": ""},
			wantBind: "10.0.0.5", want: "10.0.0.5",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"--endpoints=" + testEndpoint}, tt.args...)
			cfg, err := parseConfig(args, envOf(tt.env), io.Discard)
			if err != nil {
				t.Fatalf("parseConfig: got %v; want nil", err)
			}
			if cfg.BindAddress != tt.wantBind {
				t.Errorf("BindAddress: got %v; want %v", cfg.BindAddress, tt.wantBind)
			}
			if cfg.HealthBindAddress != tt.want {
				t.Errorf("HealthBindAddress: got %v; want %v", cfg.HealthBindAddress, tt.want)
			}
		})
	}
}

func TestParseConfigExplicitEmptyHealthBindAddress(t *testing.T) {
	// Given on the command line, an empty address is a mistake, not a default.
	args := []string{"--endpoints=" + testEndpoint, "--health-bind-address="}
	_, err := parseConfig(args, envOf(nil), io.Discard)
	if err == nil || !strings.Contains(err.Error(), flagRef("health-bind-address")) {
		t.Errorf("got %v; want an error naming %s", err, flagRef("health-bind-address"))
	}
}

func TestParseConfigHelp(t *testing.T) {
	for _, arg := range []string{"--help", "-h"} {
		t.Run(arg, func(t *testing.T) {
			var out bytes.Buffer
			_, err := parseConfig([]string{arg}, envOf(nil), &out)
			if !errors.Is(err, flag.ErrHelp) {
				t.Fatalf("got %v; want %v", err, flag.ErrHelp)
			}
			lines := strings.Split(out.String(), "\n")
			for _, name := range specFlags {
				if !hasUsageLine(lines, name, "("+envName(name)+")") {
					t.Errorf("usage: got no line for --%s with (%s); want one", name, envName(name))
				}
			}
			fs, _ := newFlagSet(&config{})
			fs.VisitAll(func(f *flag.Flag) {
				_, description := flag.UnquoteUsage(f)
				if f.Name != versionFlag && !hasUsageLine(lines, f.Name, "("+envName(f.Name)+") "+description) {
					t.Errorf("usage: got no line for --%s with its variable and description; want one", f.Name)
				}
			})
			if !hasUsageLine(lines, "version", "Print the version") {
				t.Errorf("usage: got no line for --version; want one")
			}
			want := "  --health-interval duration  (EP_HEALTH_INTERVAL) Interval between upstream health checks (default 20s)"
			if !strings.Contains(out.String(), want+"\n") {
				t.Errorf("usage: got\n%s\nwant a line %q", out.String(), want)
			}
		})
	}
}

// hasUsageLine reports whether one of lines describes --name and contains s.
func hasUsageLine(lines []string, name, s string) bool {
	for _, line := range lines {
		if (strings.HasPrefix(line, "  --"+name+" ") || line == "  --"+name) && strings.Contains(line, s) {
			return true
		}
	}
	return false
}

func TestParseConfigVersion(t *testing.T) {
	oldVersion, oldRevision := Version, Revision
	t.Cleanup(func() { Version, Revision = oldVersion, oldRevision })
	Version, Revision = "v1.2.3", "abc1234"

	var out bytes.Buffer
	// --version needs no other flag and ignores broken configuration.
	env := map[string]string{"EP_HEALTH_INTERVAL": "abc"}
	_, err := parseConfig([]string{"--version"}, envOf(env), &out)
	if !errors.Is(err, errVersionShown) {
		t.Fatalf("got %v; want %v", err, errVersionShown)
	}
	if want := "extractedprism v1.2.3 (revision abc1234, " + runtime.Version() + ")\n"; out.String() != want {
		t.Errorf("got %q; want %q", out.String(), want)
	}
}

func TestVersionInfoFallback(t *testing.T) {
	oldVersion, oldRevision := Version, Revision
	t.Cleanup(func() { Version, Revision = oldVersion, oldRevision })
	Version, Revision = "", ""

	version, revision := versionInfo()
	if version == "" || version == "(devel)" {
		t.Errorf("version: got %q; want a build version or %q", version, "devel")
	}
	if revision == "" {
		t.Errorf("revision: got %q; want a VCS revision or %q", revision, "unknown")
	}
}

func TestParseConfigRejectsArguments(t *testing.T) {
	_, err := parseConfig([]string{"--endpoints=" + testEndpoint, "extra"}, envOf(nil), io.Discard)
	if err == nil || !strings.Contains(err.Error(), `"extra"`) {
		t.Errorf("got %v; want an error naming %q", err, "extra")
	}
}

func TestParseLogLevel(t *testing.T) {
	tests := []struct {
		in      string
		want    slog.Level
		wantErr bool
	}{
		{in: "debug", want: slog.LevelDebug},
		{in: "info", want: slog.LevelInfo},
		{in: "warn", want: slog.LevelWarn},
		{in: "error", want: slog.LevelError},
		{in: "dpanic", want: levelDPanic},
		{in: "panic", want: levelPanic},
		{in: "fatal", want: levelFatal},
		{in: "verbose", wantErr: true},
		{in: "", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseLogLevel(tt.in)
			if gotErr := err != nil; gotErr != tt.wantErr {
				t.Fatalf("error: got %v; want error %v", err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("got %v; want %v", got, tt.want)
			}
		})
	}
	if slog.LevelError >= levelDPanic || levelDPanic >= levelPanic || levelPanic >= levelFatal {
		t.Errorf("order: got %v, %v, %v; want each above the last and above %v", levelDPanic, levelPanic, levelFatal, slog.LevelError)
	}
}

// A bad value on the command line gets the same kind of message as one in
// an EP_ variable: the flag, its variable, the kind of value and the value.
func TestParseConfigMalformedFlag(t *testing.T) {
	tests := []struct{ arg, want string }{
		{"--health-interval=abc", `--health-interval (EP_HEALTH_INTERVAL): invalid duration "abc"`},
		{"--bind-port=seven", `--bind-port (EP_BIND_PORT): invalid port "seven"`},
		{"--bind-port=-1", `--bind-port (EP_BIND_PORT): invalid port "-1"`},
		{"--health-port=99999999999999999999", `--health-port (EP_HEALTH_PORT): invalid port "99999999999999999999"`},
		{"--enable-discovery=maybe", `--enable-discovery (EP_ENABLE_DISCOVERY): invalid boolean "maybe"`},
		{`--health-timeout=say "1s"`, `--health-timeout (EP_HEALTH_TIMEOUT): invalid duration "say \"1s\""`},
		{"--no-such-flag", "flag provided but not defined: -no-such-flag (--help lists the flags)"},
		{"-no-such-flag=1", "flag provided but not defined: -no-such-flag (--help lists the flags)"},
		{"--bind-port", "flag needs an argument: -bind-port (--help lists the flags)"},
	}
	for _, tt := range tests {
		_, err := parseConfig([]string{"--endpoints=" + testEndpoint, tt.arg}, envOf(nil), io.Discard)
		if err == nil || err.Error() != tt.want {
			t.Errorf("%s: got %v; want %s", tt.arg, err, tt.want)
		}
	}
}

// Of a flag given twice the last value counts, good or bad, as the flag
// package has it; a boolean flag stands alone, without taking the next
// argument as its value.
func TestParseConfigLastValueCounts(t *testing.T) {
	env := envOf(map[string]string{"EP_ENABLE_DISCOVERY": "false"})
	cfg, err := parseConfig([]string{"--endpoints=" + testEndpoint, "--bind-port=seven", "--enable-discovery=maybe",
		"--bind-port=7000", "--enable-discovery", "--health-port=7001"}, env, io.Discard)
	if err != nil {
		t.Fatalf("parseConfig: got %v; want nil", err)
	}
	if cfg.BindPort != 7000 || cfg.HealthPort != 7001 || !cfg.EnableDiscovery {
		t.Errorf("got ports %d, %d, discovery %v; want 7000, 7001, true", cfg.BindPort, cfg.HealthPort, cfg.EnableDiscovery)
	}
	_, err = parseConfig([]string{"--endpoints=" + testEndpoint, "--bind-port=7000", "--bind-port=seven"}, envOf(nil), io.Discard)
	if want := `--bind-port (EP_BIND_PORT): invalid port "seven"`; err == nil || err.Error() != want {
		t.Errorf("a good value, then a bad one: got %v; want %s", err, want)
	}
}

// Ports are decimal: flag.IntVar would read 07445 as octal 3877 and take
// 0x1d1d, so the listener would open on a port nobody expects.
func TestParseConfigPortsAreDecimal(t *testing.T) {
	args := []string{"--endpoints=" + testEndpoint, "--bind-port=07445"}
	cfg, err := parseConfig(args, envOf(map[string]string{"EP_HEALTH_PORT": "08080"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.BindPort != 7445 || cfg.HealthPort != 8080 {
		t.Errorf("ports %d, %d; want 7445, 8080", cfg.BindPort, cfg.HealthPort)
	}
	if _, err := parseConfig([]string{"--endpoints=" + testEndpoint, "--bind-port=0x1d1d"}, envOf(nil), io.Discard); err == nil {
		t.Error("--bind-port=0x1d1d: got no error; want one")
	}
}

func TestParseConfigBadFlagPrintsNothing(t *testing.T) {
	var out bytes.Buffer
	_, err := parseConfig([]string{"--health-interval=abc"}, envOf(nil), &out)
	if err == nil || !strings.Contains(err.Error(), "health-interval") {
		t.Errorf("got %v; want an error naming health-interval", err)
	}
	if out.Len() != 0 {
		t.Errorf("output: got %q; want nothing", out.String())
	}
}

func TestParseConfigVersionHasNoVariable(t *testing.T) {
	var out bytes.Buffer
	env := map[string]string{"EP_VERSION": "true"}
	_, err := parseConfig([]string{"--endpoints=" + testEndpoint}, envOf(env), &out)
	if err != nil {
		t.Errorf("got %v; want nil", err)
	}
	if out.Len() != 0 {
		t.Errorf("output: got %q; want nothing", out.String())
	}
}

// Every value that does not parse is reported at once, on the command line
// and in EP_ variables, not one per run. A flag whose value did not parse
// still hides its variable, and parsing stops at an unknown flag, after
// which the rest of the line may not be what it seems.
func TestParseConfigReportsEveryBadValue(t *testing.T) {
	env := envOf(map[string]string{"EP_HEALTH_PORT": "http", "EP_BIND_PORT": "also-bad"})
	args := []string{"--bind-port=seven", "--endpoints=" + testEndpoint, "--health-interval", "abc", "--drain-timeout=1s"}
	_, err := parseConfig(args, env, io.Discard)
	want := `--bind-port (EP_BIND_PORT): invalid port "seven"` + "\n" +
		`--health-interval (EP_HEALTH_INTERVAL): invalid duration "abc"` + "\n" +
		`EP_HEALTH_PORT (--health-port): invalid port "http"`
	if err == nil || err.Error() != want {
		t.Errorf("got %v; want\n%s", err, want)
	}

	// After an unknown flag the variables are not read either: the rest
	// of the line, unread, may set their flags.
	args = []string{"--bind-port=seven", "--no-such-flag", "--health-interval=abc"}
	_, err = parseConfig(args, envOf(map[string]string{"EP_HEALTH_PORT": "x"}), io.Discard)
	want = `--bind-port (EP_BIND_PORT): invalid port "seven"` + "\n" + "flag provided but not defined: -no-such-flag (--help lists the flags)"
	if err == nil || err.Error() != want {
		t.Errorf("got %v; want\n%s", err, want)
	}
}
