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

func envOf(m map[string]string) func(string) string {
	return func(name string) string { return m[name] }
}

// environOf is os.Environ for the environment m, as envOf is os.Getenv.
func environOf(m map[string]string) func() []string {
	return func() []string {
		var env []string
		for name, value := range m {
			env = append(env, name+"="+value)
		}
		return env
	}
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

// TestParseConfigValues: what a valid command line and environment give,
// each case as its changes to the defaults. Nothing is printed.
func TestParseConfigValues(t *testing.T) {
	tests := []struct {
		name string
		args []string // after --endpoints
		env  map[string]string
		set  func(*config) // the changes to the defaults; nil for none
	}{
		{name: "defaults"},
		{name: "an empty variable is unset", env: map[string]string{"EP_BIND_PORT": "", "EP_LOG_LEVEL": "", "EP_HEALTH_CHECK_SERVER_NAME": ""}},
		{name: "EP_VERSION is no variable", env: map[string]string{"EP_VERSION": "true"}},
		// The flag wins, so its variable is never parsed.
		{"a flag hides its malformed variable", []string{"--health-interval=30s"}, map[string]string{"EP_HEALTH_INTERVAL": "abc"},
			func(c *config) { c.HealthInterval = 30 * time.Second }},
		// Of a flag given twice the last value counts, as the flag package
		// has it; a boolean flag stands alone, not taking the next argument.
		{"the last value counts", []string{"--bind-port=seven", "--enable-discovery=maybe", "--bind-port=7000", "--enable-discovery", "--health-port=7001"},
			map[string]string{"EP_ENABLE_DISCOVERY": "false"}, func(c *config) { c.BindPort, c.HealthPort = 7000, 7001 }},
		// flag.IntVar would read 07445 as octal 3877.
		{"ports are decimal", []string{"--bind-port=07445"}, map[string]string{"EP_HEALTH_PORT": "08080"},
			func(c *config) { c.HealthPort = 8080 }},
		{"health bind address follows --bind-address", []string{"--bind-address=::1"}, nil,
			func(c *config) { c.BindAddress, c.HealthBindAddress = "::1", "::1" }},
		{"health bind address follows EP_BIND_ADDRESS", nil, map[string]string{"EP_BIND_ADDRESS": "10.0.0.5"},
			func(c *config) { c.BindAddress, c.HealthBindAddress = "10.0.0.5", "10.0.0.5" }},
		{"health bind address flag", []string{"--health-bind-address=0.0.0.0"}, nil, func(c *config) { c.HealthBindAddress = "0.0.0.0" }},
		{"health bind address variable", nil, map[string]string{"EP_HEALTH_BIND_ADDRESS": "node-1"}, func(c *config) { c.HealthBindAddress = "node-1" }},
		{"empty health bind address variable follows the bind address", []string{"--bind-address=10.0.0.5"},
			map[string]string{"EP_HEALTH_BIND_ADDRESS": ""}, func(c *config) { c.BindAddress, c.HealthBindAddress = "10.0.0.5", "10.0.0.5" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			got, err := parseConfig(append([]string{"--endpoints=" + testEndpoint}, tt.args...), envOf(tt.env), &out)
			if err != nil {
				t.Fatalf("parseConfig: got %v; want nil", err)
			}
			want := &config{
				BindAddress: "127.0.0.1", BindPort: 7445, HealthBindAddress: "127.0.0.1", HealthPort: 7446,
				Endpoints: []string{testEndpoint}, HealthInterval: 20 * time.Second, HealthTimeout: 15 * time.Second,
				EnableDiscovery: true, LogLevel: "info", LivenessInterval: 5 * time.Second, LivenessThreshold: 15 * time.Second,
				DrainTimeout: 30 * time.Second, RebalancePeriod: time.Minute, UpstreamSelection: "random", HealthCheck: "tcp", HealthCheckServerName: "kubernetes.default.svc",
			}
			if tt.set != nil {
				tt.set(want)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got %+v; want %+v", got, want)
			}
			if out.Len() != 0 {
				t.Errorf("output: got %q; want nothing", out.String())
			}
		})
	}
}

// TestParseConfigErrors: the exact error of a bad command line or
// environment, with nothing printed. A bad value gets the same kind of
// message as a flag and as an EP_ variable: the flag, its variable, the
// kind of value and the value. Every bad value and every violated rule is
// reported at once, not one per run; a flag whose value did not parse still
// hides its variable, and after an unknown flag the variables are not read
// either, as the rest of the line, unread, may set their flags.
func TestParseConfigErrors(t *testing.T) {
	tests := []struct {
		args []string // after --endpoints
		env  map[string]string
		want string
	}{
		{nil, map[string]string{"EP_HEALTH_INTERVAL": "abc"}, `EP_HEALTH_INTERVAL (--health-interval): invalid duration "abc"`},
		{nil, map[string]string{"EP_BIND_PORT": "seven"}, `EP_BIND_PORT (--bind-port): invalid port "seven"`},
		{nil, map[string]string{"EP_HEALTH_PORT": "0x1d1d"}, `EP_HEALTH_PORT (--health-port): invalid port "0x1d1d"`},
		{nil, map[string]string{"EP_ENABLE_DISCOVERY": "maybe"}, `EP_ENABLE_DISCOVERY (--enable-discovery): invalid boolean "maybe"`},
		{[]string{"--health-interval=abc"}, nil, `--health-interval (EP_HEALTH_INTERVAL): invalid duration "abc"`},
		{[]string{"--bind-port=seven"}, nil, `--bind-port (EP_BIND_PORT): invalid port "seven"`},
		{[]string{"--bind-port=-1"}, nil, `--bind-port (EP_BIND_PORT): invalid port "-1"`},
		{[]string{"--bind-port=0x1d1d"}, nil, `--bind-port (EP_BIND_PORT): invalid port "0x1d1d"`},
		{[]string{"--health-port=99999999999999999999"}, nil, `--health-port (EP_HEALTH_PORT): invalid port "99999999999999999999"`},
		{[]string{"--enable-discovery=maybe"}, nil, `--enable-discovery (EP_ENABLE_DISCOVERY): invalid boolean "maybe"`},
		{[]string{`--health-timeout=say "1s"`}, nil, `--health-timeout (EP_HEALTH_TIMEOUT): invalid duration "say \"1s\""`},
		{[]string{"--no-such-flag"}, nil, "flag provided but not defined: -no-such-flag (--help lists the flags)"},
		{[]string{"-no-such-flag=1"}, nil, "flag provided but not defined: -no-such-flag (--help lists the flags)"},
		{[]string{"--bind-port"}, nil, "flag needs an argument: -bind-port (--help lists the flags)"},
		{[]string{"--bind-port=7000", "--bind-port=seven"}, nil, `--bind-port (EP_BIND_PORT): invalid port "seven"`},
		{[]string{"extra"}, nil, `unexpected argument "extra": every setting is a flag`},
		// Given on the command line, an empty address is a mistake, not a default.
		{[]string{"--health-bind-address="}, nil,
			`--health-bind-address (EP_HEALTH_BIND_ADDRESS) must be an IP address or RFC 1123 hostname: got ""`},
		{[]string{"--health-timeout=20s"}, nil,
			"--health-timeout (EP_HEALTH_TIMEOUT) must be less than --health-interval (EP_HEALTH_INTERVAL): got 20s >= 20s"},
		{nil, map[string]string{"EP_HANDOVER_SOCKET": "run/handover.sock"},
			`--handover-socket (EP_HANDOVER_SOCKET) must be an absolute file path of at most 98 bytes: got "run/handover.sock"`},
		{[]string{"--handover-socket=/run/extractedprism/"}, nil,
			`--handover-socket (EP_HANDOVER_SOCKET) must be an absolute file path of at most 98 bytes: got "/run/extractedprism/"`},
		{[]string{"--bind-port=0", "--drain-timeout=-1s"}, nil,
			"--bind-port (EP_BIND_PORT) must be in 1-65535: got 0\n--drain-timeout (EP_DRAIN_TIMEOUT) must not be negative: got -1s"},
		{[]string{"--bind-port=seven", "--health-interval", "abc", "--drain-timeout=1s"}, map[string]string{"EP_HEALTH_PORT": "http", "EP_BIND_PORT": "also-bad"},
			`--bind-port (EP_BIND_PORT): invalid port "seven"` + "\n" + `--health-interval (EP_HEALTH_INTERVAL): invalid duration "abc"` + "\n" +
				`EP_HEALTH_PORT (--health-port): invalid port "http"`},
		// Refused values and broken rules, in one pass; the rule against
		// --health-interval, refused and so at its default, is left out.
		{[]string{"--bind-port=seven", "--log-level=verbose"},
			map[string]string{"EP_HEALTH_INTERVAL": "5", "EP_ENABLE_DISCOVERY": "yes", "EP_HEALTH_CHECK": "readz", "EP_HEALTH_TIMEOUT": "30s"},
			`--bind-port (EP_BIND_PORT): invalid port "seven"` + "\n" + `EP_ENABLE_DISCOVERY (--enable-discovery): invalid boolean "yes"` + "\n" +
				`EP_HEALTH_INTERVAL (--health-interval): invalid duration "5"` + "\n" +
				`--log-level (EP_LOG_LEVEL) must be one of debug, info, warn, error, dpanic, panic, fatal: got "verbose"` + "\n" +
				`--health-check (EP_HEALTH_CHECK) must be tcp or readyz: got "readz"`},
		{[]string{"--bind-port=seven", "--no-such-flag", "--health-interval=abc"}, map[string]string{"EP_HEALTH_PORT": "x"},
			`--bind-port (EP_BIND_PORT): invalid port "seven"` + "\n" + "flag provided but not defined: -no-such-flag (--help lists the flags)"},
	}
	for _, tt := range tests {
		var out bytes.Buffer
		_, err := parseConfig(append([]string{"--endpoints=" + testEndpoint}, tt.args...), envOf(tt.env), &out)
		if err == nil || err.Error() != tt.want {
			t.Errorf("%q, %v: got %v; want\n%s", tt.args, tt.env, err, tt.want)
		}
		if out.Len() != 0 {
			t.Errorf("%q, %v: output %q; want nothing", tt.args, tt.env, out.String())
		}
	}
}

func TestParseConfigPrecedence(t *testing.T) {
	tests := []struct {
		flag, flagValue, envValue      string
		get                            func(*config) any
		wantDefault, wantEnv, wantFlag any
	}{
		{"bind-address", "10.2.2.2", "10.1.1.1", func(c *config) any { return c.BindAddress }, "127.0.0.1", "10.1.1.1", "10.2.2.2"},
		{"bind-port", "9000", "8000", func(c *config) any { return c.BindPort }, 7445, 8000, 9000},
		{"health-interval", "40s", "30s", func(c *config) any { return c.HealthInterval }, 20 * time.Second, 30 * time.Second, 40 * time.Second},
		{"enable-discovery", "true", "false", func(c *config) any { return c.EnableDiscovery }, true, false, true},
		{"kubeconfig", "/flag/kubeconfig", "/env/kubeconfig", func(c *config) any { return c.Kubeconfig }, "", "/env/kubeconfig", "/flag/kubeconfig"},
		// --endpoints has no default; the base arguments supply one.
		{"endpoints", "10.0.0.4:6443", "10.0.0.2:6443,10.0.0.3:6443", func(c *config) any { return c.Endpoints },
			[]string{testEndpoint}, []string{"10.0.0.2:6443", "10.0.0.3:6443"}, []string{"10.0.0.4:6443"}},
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
		{name: "endpoint trailing comma", flag: "endpoints", value: "10.0.0.1:6443,"},
		{name: "endpoints doubled comma", flag: "endpoints", value: "10.0.0.1:6443,,10.0.0.2:6443"},
		{name: "endpoints only commas", flag: "endpoints", value: ","},
		{name: "endpoint unbracketed IPv6", flag: "endpoints", value: "10.0.0.1:6443,fd00::1:6443"},
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

func TestWarningsIgnoredSettings(t *testing.T) {
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
			var got, want []string
			for _, ig := range cfg.warnings(func() []string { return nil }) {
				got = append(got, ig.setting)
				if !strings.HasPrefix(ig.because, "--") || !strings.Contains(ig.because, " (EP_") {
					t.Errorf("reason for %s: got %q; want it to name a flag and its variable", ig.setting, ig.because)
				}
			}
			for _, name := range tt.want {
				want = append(want, flagRef(name))
			}
			if !slices.Equal(got, want) {
				t.Errorf("ignored: got %v; want %v", got, want)
			}
		})
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
		name, value string
		want        []string
	}{
		{"one", "10.0.0.1:6443", []string{"10.0.0.1:6443"}},
		{"spaces and mixed families", " 10.0.0.1:6443 , [fd00::1]:6443,API.example.com:6443 ",
			[]string{"10.0.0.1:6443", "[fd00::1]:6443", "api.example.com:6443"}},
		{"one upstream written three ways", "10.0.0.2:6443,10.0.0.1:06443,[::ffff:10.0.0.1]:6443,10.0.0.1:6443",
			[]string{"10.0.0.2:6443", "10.0.0.1:6443"}},
	}
	for _, tt := range tests {
		cfg, err := parseConfig([]string{"--endpoints=" + tt.value}, envOf(nil), io.Discard)
		if err != nil {
			t.Errorf("%s: got %v; want nil", tt.name, err)
		} else if !reflect.DeepEqual(cfg.Endpoints, tt.want) {
			t.Errorf("%s: got %q; want %q", tt.name, cfg.Endpoints, tt.want)
		}
	}
}

// TestValidHost: the hosts testdata/hosts.txt cannot hold (TestHostCorpus
// has the rest).
func TestValidHost(t *testing.T) {
	for _, host := range []string{"", "node 1", "[::1]"} {
		if validHost(host) {
			t.Errorf("validHost(%q): got true; want false", host)
		}
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

func TestLogLevels(t *testing.T) {
	tests := []struct {
		in      string
		want    slog.Level
		unknown bool
	}{
		{in: "debug", want: slog.LevelDebug},
		{in: "info", want: slog.LevelInfo},
		{in: "warn", want: slog.LevelWarn},
		{in: "error", want: slog.LevelError},
		{in: "dpanic", want: levelDPanic},
		{in: "panic", want: levelPanic},
		{in: "fatal", want: levelFatal},
		{in: "verbose", unknown: true},
		{in: "", unknown: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, known := logLevels()[tt.in]
			if known == tt.unknown {
				t.Fatalf("known: got %v; want %v", known, !tt.unknown)
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
