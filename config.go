package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/util/validation"
)

// The values of --upstream-selection and --health-check.
const (
	selectRandom  = "random"
	selectLatency = "latency"
	checkTCP      = "tcp"
	checkReadyz   = "readyz"
)

// config is the validated daemon configuration. parseConfig builds it from
// flags and EP_* variables; nothing else writes it.
type config struct {
	BindAddress       string
	BindPort          int
	HealthBindAddress string // defaults to BindAddress
	HealthPort        int
	Endpoints         []string // "host:port", normalized by validate

	HealthInterval, HealthTimeout time.Duration

	EnableDiscovery   bool
	Kubeconfig        string // beyond the spec: run discovery outside a pod
	EndpointCacheFile string // beyond the spec: keep the discovered list across restarts
	HandoverSocket    string // beyond the spec: take the listening sockets over from the running instance

	LogLevel                                          string
	LivenessInterval, LivenessThreshold, DrainTimeout time.Duration
	RebalancePeriod                                   time.Duration // beyond the spec: see rebalance.go

	UpstreamSelection string // selectRandom or selectLatency
	HealthCheck       string // checkTCP or checkReadyz

	// The readyz probe's files and the name its certificates are checked against.
	HealthCheckCAFile, HealthCheckCertFile, HealthCheckKeyFile, HealthCheckTokenFile, HealthCheckServerName string
}

// errVersionShown is returned by parseConfig after --version printed the
// version; the caller exits successfully, as it does for flag.ErrHelp.
var errVersionShown = errors.New("version shown")

// versionFlag is the one flag without an EP_ variable: printing the version
// is a command, not configuration a DaemonSet should carry in its environment.
const versionFlag = "version"

// parseConfig builds the configuration from the command-line arguments
// (without the program name) and the environment read through getenv.
// A flag on the command line wins over its EP_ variable, which wins over
// the default; an empty variable counts as unset. Every bad value is
// reported at once. The --help and --version text goes to out, which then
// gets flag.ErrHelp or errVersionShown back.
func parseConfig(args []string, getenv func(string) string, out io.Writer) (*config, error) {
	cfg := &config{}
	fs, showVersion := newFlagSet(cfg)
	refused := lenient(fs)
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		printUsage(out)
		return nil, flag.ErrHelp
	case err != nil:
		// An unknown flag or one missing its value: what follows may not
		// be what it seems, so no variable is read in its place.
		return nil, errors.Join(refused.take(flagRef), fmt.Errorf("%w (--help lists the flags)", err))
	case fs.NArg() > 0:
		return nil, fmt.Errorf("unexpected argument %q: every setting is a flag", fs.Arg(0))
	case *showVersion:
		fmt.Fprintln(out, versionLine())
		return nil, errVersionShown
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	refusedErr := errors.Join(refused.take(flagRef), applyEnv(fs, getenv, set, refused))
	if !set["health-bind-address"] {
		cfg.HealthBindAddress = cfg.BindAddress
	}
	// Validated after refusals too: every bad value in one run, not some
	// only once the others are fixed.
	if err := errors.Join(refusedErr, cfg.validate(slices.Collect(maps.Keys(refused))...)); err != nil {
		return nil, err
	}
	return cfg, nil
}

// newFlagSet defines every flag on a new flag set that writes into cfg,
// with the defaults of the operator manual, and --version.
func newFlagSet(cfg *config) (*flag.FlagSet, *bool) {
	fs := flag.NewFlagSet("extractedprism", flag.ContinueOnError)
	// Errors are returned for the caller to print once; left to the flag
	// package, they would be printed twice and buried under the usage.
	fs.SetOutput(io.Discard)
	fs.StringVar(&cfg.BindAddress, "bind-address", "127.0.0.1", "Address for the TCP load balancer listener")
	cfg.BindPort, cfg.HealthPort = 7445, 7446
	fs.Var((*portNumber)(&cfg.BindPort), "bind-port", "TCP `port` for the load balancer listener")
	fs.Var((*portNumber)(&cfg.HealthPort), "health-port", "TCP `port` for the health check HTTP server")
	fs.StringVar(&cfg.HealthBindAddress, "health-bind-address", "", "Address for the health check HTTP server (default: the value of --bind-address)")
	fs.Var((*endpointList)(&cfg.Endpoints), "endpoints", "Comma-separated list of API server endpoints (`host:port`); required")
	fs.DurationVar(&cfg.HealthInterval, "health-interval", 20*time.Second, "Interval between upstream health checks")
	fs.DurationVar(&cfg.HealthTimeout, "health-timeout", 15*time.Second, "Timeout for each upstream health check")
	fs.BoolVar(&cfg.EnableDiscovery, "enable-discovery", true, "Enable Kubernetes EndpointSlice discovery (turn off with --enable-discovery=false)")
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "Path to a kubeconfig for discovery outside a pod (default: in-cluster configuration)")
	fs.StringVar(&cfg.EndpointCacheFile, "endpoint-cache-file", "", "File that keeps the last discovered endpoint list across restarts, used until discovery answers (default: off)")
	fs.StringVar(&cfg.HandoverSocket, "handover-socket", "", "Unix socket through which a starting daemon takes the listening sockets over from the one running, in a directory only the daemon's user can enter (default: off)")
	fs.StringVar(&cfg.LogLevel, "log-level", "info", "Log level (debug, info, warn, error, dpanic, panic, fatal)")
	fs.DurationVar(&cfg.LivenessInterval, "liveness-interval", 5*time.Second, "Heartbeat probe interval for liveness detection")
	fs.DurationVar(&cfg.LivenessThreshold, "liveness-threshold", 15*time.Second, "Maximum time since last heartbeat before liveness fails")
	fs.DurationVar(&cfg.DrainTimeout, "drain-timeout", 30*time.Second, "Grace period for connections to removed endpoints, and with readyz to unready ones while another upstream is ready, before force close (0 closes immediately)")
	fs.DurationVar(&cfg.RebalancePeriod, "rebalance-period", defaultRebalancePeriod, "At most one long-lived connection closed per period, with jitter, while they are skewed across the upstreams (0 turns it off)")
	fs.StringVar(&cfg.UpstreamSelection, "upstream-selection", selectRandom, "How new connections pick an upstream: random or latency")
	fs.StringVar(&cfg.HealthCheck, "health-check", checkTCP, "Upstream health check: tcp (connect only) or readyz (connect, then prefer upstreams answering 200 on GET /readyz)")
	fs.StringVar(&cfg.HealthCheckCAFile, "health-check-ca-file", "", "CA bundle that verifies the upstream serving certificates; required with readyz")
	fs.StringVar(&cfg.HealthCheckCertFile, "health-check-cert-file", "", "Client certificate for the readyz probe")
	fs.StringVar(&cfg.HealthCheckKeyFile, "health-check-key-file", "", "Client key for the readyz probe; may be the same file as the certificate")
	fs.StringVar(&cfg.HealthCheckTokenFile, "health-check-token-file", "", "Bearer token for the readyz probe")
	fs.StringVar(&cfg.HealthCheckServerName, "health-check-server-name", "kubernetes.default.svc", "Name the upstream serving certificates are verified against")
	return fs, fs.Bool(versionFlag, false, "Print the version and exit")
}

// settings returns every setting as flag name and effective value pairs,
// for the start-up line.
func (c *config) settings() []any {
	var view config
	fs, _ := newFlagSet(&view)
	view = *c // the flags read view's fields, which now hold c's values
	var out []any
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name != versionFlag {
			out = append(out, f.Name, f.Value.String())
		}
	})
	return out
}

// refusals records, by flag name, what each flag refused, as
// "invalid <kind> <value>".
type refusals map[string]string

// lenientValue is a flag's value that takes any text: a value its flag
// refuses is recorded in refusals instead of failing, so that parsing goes
// on and every bad value is reported at once in the daemon's words rather
// than the flag package's ("parse error"). The last value given counts.
type lenientValue struct {
	flag.Value
	name, kind string // kind is the kind of value the flag takes
	r          refusals
}

func (v *lenientValue) Set(s string) error {
	delete(v.r, v.name)
	if err := v.Value.Set(s); err != nil {
		v.r[v.name] = fmt.Sprintf("invalid %s %q", v.kind, s)
	}
	return nil
}

// IsBoolFlag lets a boolean flag stand alone, as it does unwrapped.
func (v *lenientValue) IsBoolFlag() bool { return v.kind == "boolean" }

// lenient makes every flag of fs a lenientValue recording into the result.
func lenient(fs *flag.FlagSet) refusals {
	r := refusals{}
	fs.VisitAll(func(f *flag.Flag) {
		// UnquoteUsage names no type for a boolean flag, and one for every other.
		kind, _ := flag.UnquoteUsage(f)
		f.Value = &lenientValue{Value: f.Value, name: f.Name, kind: cmp.Or(kind, "boolean"), r: r}
	})
	return r
}

// take returns an error for each value refused since the last take,
// naming its flag with ref. The flag stays in r, without text, for
// validate to leave alone.
func (r refusals) take(ref func(string) string) error {
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(r)) {
		if r[name] != "" {
			errs = append(errs, fmt.Errorf("%s: %s", ref(name), r[name]))
			r[name] = ""
		}
	}
	return errors.Join(errs...)
}

// applyEnv sets every flag not in set from its EP_ variable, through the
// flag's own parser, and reports the values refused.
func applyEnv(fs *flag.FlagSet, getenv func(string) string, set map[string]bool, r refusals) error {
	fs.VisitAll(func(f *flag.Flag) {
		if env := envName(f.Name); env != "" && !set[f.Name] && getenv(env) != "" {
			_ = fs.Set(f.Name, getenv(env)) // a lenientValue: a refusal lands in r
			set[f.Name] = true
		}
	})
	return r.take(envRef)
}

// envName is the variable that sets the flag name: EP_ and the name in upper
// snake case, so --health-check-ca-file is EP_HEALTH_CHECK_CA_FILE; none
// ("") for --version.
func envName(name string) string {
	if name == versionFlag {
		return ""
	}
	return "EP_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// flagRef names a flag the way every configuration error does: the flag and
// the variable that also sets it. envRef names the variable first, for a
// value that came from it.
func flagRef(name string) string { return "--" + name + " (" + envName(name) + ")" }
func envRef(name string) string  { return envName(name) + " (--" + name + ")" }

// flagError is a validation error about the flag name; format says what is
// allowed and what was given.
func flagError(name, format string, args ...any) error {
	return fmt.Errorf("%s %s", flagRef(name), fmt.Sprintf(format, args...))
}

// printUsage writes the --help text to w: a line per flag with its
// variable, description and default, then the subcommands.
func printUsage(w io.Writer) {
	fs, _ := newFlagSet(&config{})
	fmt.Fprint(w, "Usage: extractedprism [flags]\n\nPer-node TCP load balancer for the Kubernetes API server.\n"+
		"Each flag can also be set by the EP_ variable shown next to it;\n"+
		"a flag on the command line wins over its variable.\n\n")
	fs.VisitAll(func(f *flag.Flag) { fmt.Fprintln(w, usageText(f, envName(f.Name))) })
	fmt.Fprint(w, "\nUsage: extractedprism status [--health-address host:port] [--env-file path] [--json]\n\n"+
		"Prints the upstreams of a running daemon, from its /upstreams endpoint; exits 0 when\n"+
		"all are usable, 1 degraded, 2 none usable, 3 the daemon could not be asked.\n"+
		"\nUsage: extractedprism check [flags]\n\n"+
		"Reads the flags and EP_ variables as a start would and exits 0 if the daemon\n"+
		"would start with them, or 1 with the message it would stop with; binds nothing.\n"+
		"What a start would warn of, it prints as warnings, which do not fail it.\n"+
		"\nUsage: extractedprism handover-dir --uid UID --gid GID DIRECTORY\n\n"+
		"Run as root: makes DIRECTORY, for --handover-socket, the daemon user's, mode 0700.\n")
}

// usageText describes flag f in one line, with env as its variable, none
// if empty, for example
// "  --health-interval duration  (EP_HEALTH_INTERVAL) Interval between upstream health checks (default 20s)".
// An empty or false default means "not set" and is not shown.
func usageText(f *flag.Flag, env string) string {
	typeName, description := flag.UnquoteUsage(f)
	line := strings.TrimRight("  --"+f.Name+" "+typeName, " ") + " "
	if env != "" {
		line += " (" + env + ")"
	}
	if line += " " + description; f.DefValue != "" && f.DefValue != "false" {
		line += " (default " + f.DefValue + ")"
	}
	return line
}

// endpointList is the flag.Value behind --endpoints: a comma-separated list
// whose entries it only splits and trims; validate judges them. A blank
// value is an empty list; an empty entry ("a,,b") is kept for validate to
// refuse. A repeated flag keeps its last value.
type endpointList []string

func (l *endpointList) String() string { return strings.Join(*l, ",") }

func (l *endpointList) Set(s string) error {
	*l = nil
	if strings.TrimSpace(s) != "" {
		for e := range strings.SplitSeq(s, ",") {
			*l = append(*l, strings.TrimSpace(e))
		}
	}
	return nil
}

// portNumber is a port written in decimal. flag.IntVar would also take
// 0x1d1d, and read 07445 as octal 3877: a listener on a port nobody expects.
type portNumber int

func (p *portNumber) String() string { return strconv.Itoa(int(*p)) }

// Set accepts decimal digits alone; validate checks the range.
func (p *portNumber) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil || strings.Trim(s, "0123456789") != "" {
		return errors.New("not a decimal number")
	}
	*p = portNumber(n)
	return nil
}

// violations collects the errors of validate; nil ones are dropped.
type violations []error

// addf records the error flagError(name, format, args...) when bad.
func (v *violations) addf(bad bool, name, format string, args ...any) {
	if bad {
		*v = append(*v, flagError(name, format, args...))
	}
}

// hostRule is what validate says of an address or name that is neither.
const hostRule = "must be an IP address or RFC 1123 hostname: got %q"

// validate checks every rule of the configuration and normalizes
// Endpoints. It reports every violation, one line each, naming the flag and
// its variable and saying what is allowed, except of the refused flags: a
// refused flag holds its default, not what was given, and "--health-timeout
// must be less than --health-interval" against a default the operator never
// chose would mislead.
func (c *config) validate(refused ...string) error {
	var v violations
	c.validateAddresses(&v)
	c.validateTimings(&v)
	c.validateModes(&v)
	return errors.Join(slices.DeleteFunc(v, func(err error) bool {
		return err == nil || slices.ContainsFunc(refused, func(name string) bool { return strings.Contains(err.Error(), flagRef(name)) })
	})...)
}

func (c *config) validateAddresses(v *violations) {
	v.addf(!validHost(c.BindAddress), "bind-address", hostRule, c.BindAddress)
	// An unset --health-bind-address copies --bind-address, judged above.
	v.addf(c.HealthBindAddress != c.BindAddress && !validHost(c.HealthBindAddress), "health-bind-address", hostRule, c.HealthBindAddress)
	endpoints, err := normalizeEndpoints(c.Endpoints)
	if err == nil {
		c.Endpoints = endpoints
		err = c.checkOwnListener()
	}
	*v = append(*v, err) // nil if both passed
	v.addf(c.BindPort < 1 || c.BindPort > 65535, "bind-port", "must be in 1-65535: got %d", c.BindPort)
	v.addf(c.HealthPort < 1 || c.HealthPort > 65535, "health-port", "must be in 1-65535: got %d", c.HealthPort)
	// sun_path holds 108 bytes with the NUL, and a hand-over socket is first
	// made under the name plus a 9-byte suffix (handover.go).
	v.addf(c.HandoverSocket != "" && (!filepath.IsAbs(c.HandoverSocket) || len(c.HandoverSocket) > 98 || strings.HasSuffix(c.HandoverSocket, "/")),
		"handover-socket", "must be an absolute file path of at most 98 bytes: got %q", c.HandoverSocket)
	v.addf(c.HealthPort == c.BindPort, "health-port", "must differ from %s: both are %d", flagRef("bind-port"), c.BindPort)
}

func (c *config) validateTimings(v *violations) {
	const minRule = "must be at least 1s: got %v"
	v.addf(c.HealthInterval < time.Second, "health-interval", minRule, c.HealthInterval)
	v.addf(c.HealthTimeout < time.Second, "health-timeout", minRule, c.HealthTimeout)
	v.addf(c.LivenessInterval < time.Second, "liveness-interval", minRule, c.LivenessInterval)
	v.addf(c.LivenessThreshold < time.Second, "liveness-threshold", minRule, c.LivenessThreshold)
	v.addf(c.HealthTimeout >= c.HealthInterval, "health-timeout", "must be less than %s: got %v >= %v",
		flagRef("health-interval"), c.HealthTimeout, c.HealthInterval)
	v.addf(c.LivenessThreshold <= c.LivenessInterval, "liveness-threshold", "must be greater than %s: got %v <= %v",
		flagRef("liveness-interval"), c.LivenessThreshold, c.LivenessInterval)
	v.addf(c.DrainTimeout < 0, "drain-timeout", "must not be negative: got %v", c.DrainTimeout)
	// A shorter period would move connections faster than the settle time
	// and the quiet wait can judge them.
	v.addf(c.RebalancePeriod != 0 && c.RebalancePeriod < 10*time.Second, "rebalance-period", "must be 0 (off) or at least 10s: got %v", c.RebalancePeriod)
}

func (c *config) validateModes(v *violations) {
	_, known := logLevels()[c.LogLevel]
	v.addf(!known, "log-level", "must be one of debug, info, warn, error, dpanic, panic, fatal: got %q", c.LogLevel)
	v.addf(c.UpstreamSelection != selectRandom && c.UpstreamSelection != selectLatency, "upstream-selection", "must be random or latency: got %q", c.UpstreamSelection)
	v.addf(c.HealthCheck != checkTCP && c.HealthCheck != checkReadyz, "health-check", "must be tcp or readyz: got %q", c.HealthCheck)
	v.addf(c.HealthCheck == checkReadyz && c.HealthCheckCAFile == "", "health-check-ca-file", "is required with %s set to readyz", flagRef("health-check"))
	v.addf((c.HealthCheckCertFile == "") != (c.HealthCheckKeyFile == ""), "health-check-cert-file", "and %s must be set together: got cert %q, key %q",
		flagRef("health-check-key-file"), c.HealthCheckCertFile, c.HealthCheckKeyFile)
	v.addf(!validHost(c.HealthCheckServerName), "health-check-server-name", hostRule, c.HealthCheckServerName)
	// A zone names a local interface; certificates know nothing of it.
	a, err := netip.ParseAddr(c.HealthCheckServerName)
	v.addf(err == nil && a.Zone() != "", "health-check-server-name", "must not have an IPv6 zone: got %q", c.HealthCheckServerName)
}

// normalizeEndpoints checks the --endpoints entries and returns them
// normalized, each once in the order first given, or one error listing
// every bad entry.
func normalizeEndpoints(entries []string) ([]string, error) {
	if len(entries) == 0 {
		return nil, flagError("endpoints", "must not be empty: want a comma-separated list of host:port")
	}
	var normalized, problems []string
	for _, e := range entries {
		n, err := normalizeEndpoint(e)
		switch {
		case err != nil:
			problems = append(problems, err.Error())
		case !slices.Contains(normalized, n):
			normalized = append(normalized, n)
		}
	}
	if len(problems) > 0 {
		return nil, flagError("endpoints", "must list host:port pairs with an IP address or RFC 1123 hostname and a port in 1-65535: %s", strings.Join(problems, "; "))
	}
	return normalized, nil
}

// normalizeEndpoint checks one "host:port" endpoint and returns its canonical
// form, so that one upstream written two ways is one upstream: IP addresses
// as net/netip prints them (IPv4-mapped ones as IPv4, as EndpointSlices list
// them), hostnames in lower case, the port without leading zeros. IPv6
// addresses must be bracketed, as in [fd00::1]:6443.
func normalizeEndpoint(s string) (string, error) {
	host, port, err := splitEndpoint(s)
	if err != nil {
		return "", err
	}
	if addr, err := netip.ParseAddr(host); err == nil {
		return net.JoinHostPort(addr.Unmap().String(), strconv.FormatUint(port, 10)), nil
	}
	if !validHostname(host) {
		return "", fmt.Errorf("endpoint %s: host %s is not an IP address or RFC 1123 hostname", quoteShort(s), quoteShort(host))
	}
	return net.JoinHostPort(strings.ToLower(host), strconv.FormatUint(port, 10)), nil
}

// splitEndpoint splits s into a non-empty host and a port in 1-65535, with
// errors that say how to write the endpoint instead.
func splitEndpoint(s string) (host string, port uint64, err error) {
	if s == "" {
		return "", 0, errors.New("empty entry (doubled or trailing comma?)")
	}
	host, portText, err := net.SplitHostPort(s)
	switch addr, addrErr := netip.ParseAddr(s); {
	case err != nil && addrErr == nil && addr.Is6():
		return "", 0, fmt.Errorf("endpoint %s: an IPv6 address needs brackets and a port, as in [fd00::1]:6443", quoteShort(s))
	case err != nil && strings.Contains(s, "://"):
		return "", 0, fmt.Errorf("endpoint %s: want host:port without a scheme", quoteShort(s))
	case err != nil:
		return "", 0, fmt.Errorf("endpoint %s: want host:port", quoteShort(s))
	case host == "":
		return "", 0, fmt.Errorf("endpoint %s: empty host", quoteShort(s))
	case strings.HasPrefix(s, "[") && !strings.Contains(host, ":"):
		return "", 0, fmt.Errorf("endpoint %s: brackets are only for IPv6 addresses, as in [fd00::1]:6443", quoteShort(s))
	}
	port, err = strconv.ParseUint(portText, 10, 16)
	if err != nil || port == 0 {
		return "", 0, fmt.Errorf("endpoint %s: port must be a number in 1-65535, got %s", quoteShort(s), quoteShort(portText))
	}
	return host, port, nil
}

// quoteShort quotes s for a message, cut to its first 64 bytes, so that a
// huge bad value from a file or a variable does not make a huge log line.
func quoteShort(s string) string {
	if short := cutText(s, 64); len(short) < len(s) {
		return strconv.Quote(short) + "..."
	}
	return strconv.Quote(s)
}

// cutText returns s cut to at most n bytes, at a character boundary.
func cutText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// validHost reports whether s is an IP address or an RFC 1123 hostname.
func validHost(s string) bool {
	_, err := netip.ParseAddr(s)
	return err == nil || validHostname(s)
}

// validHostname reports whether s is an RFC 1123 hostname: at most 253
// characters of dot-separated labels of 1-63 letters, digits and hyphens
// that neither start nor end with a hyphen, in any case. One trailing dot,
// which marks a fully qualified name (RFC 1035), is allowed.
func validHostname(s string) bool {
	s = strings.TrimSuffix(s, ".")
	labels := strings.Split(s, ".")
	if len(s) > 253 || slices.ContainsFunc(labels, func(l string) bool {
		return len(l) > 63 || len(validation.IsDNS1123Label(strings.ToLower(l))) > 0
	}) {
		return false
	}
	// RFC 1123 section 2.1: the highest-level label is never all digits,
	// so a mistyped IPv4 address such as 10.0.0.256 does not pass as a
	// hostname to fail only when it is dialled.
	return strings.Trim(labels[len(labels)-1], "0123456789") != ""
}

// Levels above slog.LevelError for the three zap level names --log-level
// accepts besides slog's four. Each is "error or worse": --log-level panic
// keeps only records at panic or fatal. They are two apart, as slog's own
// levels are four apart, to leave room between them.
const (
	levelDPanic = slog.LevelError + 2
	levelPanic  = slog.LevelError + 4
	levelFatal  = slog.LevelError + 6
)

// logLevels maps every --log-level name to its slog level.
func logLevels() map[string]slog.Level {
	return map[string]slog.Level{
		"debug": slog.LevelDebug, "info": slog.LevelInfo, "warn": slog.LevelWarn, "error": slog.LevelError,
		"dpanic": levelDPanic, "panic": levelPanic, "fatal": levelFatal,
	}
}

// readFileAtMost reads a file the operator names (the endpoint cache, the
// readyz probe's credentials), refusing one larger than limit bytes. It
// opens without blocking and refuses anything but a regular file: opening
// a FIFO that no one writes waits for ever, and a device may never end,
// while neither may hold up the start or a probe.
func readFileAtMost(path string, limit int) ([]byte, error) {
	file, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0) //nolint:gosec // a path the operator configured
	if err != nil {
		return nil, err
	}
	defer file.Close()
	info, err := file.Stat()
	if err != nil {
		return nil, err
	}
	if !info.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file but %s", path, fileKind(info.Mode()))
	}
	b, err := io.ReadAll(io.LimitReader(file, int64(limit)+1))
	if err == nil && len(b) > limit {
		err = fmt.Errorf("%s is larger than %d bytes", path, limit)
	}
	return b, err
}

// fileKind names what a file that is not a regular one is, for an error.
func fileKind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	}
	return "of type " + m.Type().String()
}
