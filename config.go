package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"regexp"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"
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
	Endpoints         []string // "host:port", validated

	HealthInterval time.Duration
	HealthTimeout  time.Duration

	EnableDiscovery   bool
	Kubeconfig        string // beyond the spec: run discovery outside a pod
	EndpointCacheFile string // beyond the spec: keep the discovered list across restarts

	LogLevel          string
	LivenessInterval  time.Duration
	LivenessThreshold time.Duration
	DrainTimeout      time.Duration

	UpstreamSelection string // "random" or "latency"
	HealthCheck       string // "tcp" or "readyz"

	HealthCheckCAFile     string
	HealthCheckCertFile   string
	HealthCheckKeyFile    string
	HealthCheckTokenFile  string
	HealthCheckServerName string
}

// errVersionShown is returned by parseConfig after --version printed the
// version; the caller exits successfully, as it does for flag.ErrHelp.
var errVersionShown = errors.New("version shown")

// versionFlag is the one flag without an EP_ variable: printing the version
// is a command, not configuration a DaemonSet should carry in its environment.
const versionFlag = "version"

// parseConfig builds the configuration from the command-line arguments
// (without the program name) and the environment read through getenv.
// A flag on the command line wins over its EP_ variable, which wins over the
// default; an empty variable counts as unset. The --help and --version
// text goes to out; nothing else does. It returns flag.ErrHelp after --help
// and errVersionShown after --version, which the caller treats as success.
func parseConfig(args []string, getenv func(string) string, out io.Writer) (*config, error) {
	cfg := &config{}
	fs := newFlagSet(cfg)
	showVersion := fs.Bool(versionFlag, false, "Print the version and exit")
	set, complete, argErr := parseArgs(fs, args)
	if errors.Is(argErr, flag.ErrHelp) {
		printUsage(out, fs)
		return nil, flag.ErrHelp
	}
	if argErr == nil && fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q: every setting is a flag", fs.Arg(0))
	}
	if argErr == nil && *showVersion {
		version, revision := versionInfo()
		fmt.Fprintf(out, "extractedprism %s (revision %s)\n", version, revision)
		return nil, errVersionShown
	}
	if !complete {
		// The rest of the command line was not read, so which variables
		// it overrides is not known.
		return nil, argErr
	}
	if err := errors.Join(argErr, applyEnv(fs, getenv, set)); err != nil {
		return nil, err
	}
	if !set["health-bind-address"] {
		cfg.HealthBindAddress = cfg.BindAddress
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// newFlagSet defines every configuration flag on a new flag set that writes
// into cfg. Defaults are the ones in the operator manual.
func newFlagSet(cfg *config) *flag.FlagSet {
	fs := flag.NewFlagSet("extractedprism", flag.ContinueOnError)
	// Parse errors are returned for the caller to print once; left to the
	// flag package, they would be printed twice and buried under the usage.
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
	fs.StringVar(&cfg.LogLevel, "log-level", "info", "Log level (debug, info, warn, error, dpanic, panic, fatal)")
	fs.DurationVar(&cfg.LivenessInterval, "liveness-interval", 5*time.Second, "Heartbeat probe interval for liveness detection")
	fs.DurationVar(&cfg.LivenessThreshold, "liveness-threshold", 15*time.Second, "Maximum time since last heartbeat before liveness fails")
	fs.DurationVar(&cfg.DrainTimeout, "drain-timeout", 30*time.Second, "Grace period for connections to removed endpoints, and with readyz to unready ones while another upstream is ready, before force close (0 closes immediately)")
	fs.StringVar(&cfg.UpstreamSelection, "upstream-selection", selectRandom, "How new connections pick an upstream: random or latency")
	fs.StringVar(&cfg.HealthCheck, "health-check", checkTCP, "Upstream health check: tcp (connect only) or readyz (connect, then prefer upstreams answering 200 on GET /readyz)")
	fs.StringVar(&cfg.HealthCheckCAFile, "health-check-ca-file", "", "CA bundle that verifies the upstream serving certificates; required with readyz")
	fs.StringVar(&cfg.HealthCheckCertFile, "health-check-cert-file", "", "Client certificate for the readyz probe")
	fs.StringVar(&cfg.HealthCheckKeyFile, "health-check-key-file", "", "Client key for the readyz probe; may be the same file as the certificate")
	fs.StringVar(&cfg.HealthCheckTokenFile, "health-check-token-file", "", "Bearer token for the readyz probe")
	fs.StringVar(&cfg.HealthCheckServerName, "health-check-server-name", "kubernetes.default.svc", "Name the upstream serving certificates are verified against")
	return fs
}

// applyEnv sets every flag that is not in set from its EP_ variable, through
// the flag's own parser, and adds it to set. It reports every malformed
// variable, each naming the variable and its flag.
func applyEnv(fs *flag.FlagSet, getenv func(string) string, set map[string]bool) error {
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || f.Name == versionFlag {
			return
		}
		value := getenv(envName(f.Name))
		if value == "" {
			return
		}
		if err := fs.Set(f.Name, value); err != nil {
			// The flag package's own error ("parse error") says nothing
			// useful, so the message names the expected kind instead.
			errs = append(errs, fmt.Errorf("%s (--%s): invalid %s %q", envName(f.Name), f.Name, valueKind(f), value))
			return
		}
		set[f.Name] = true
	})
	return errors.Join(errs...)
}

// parseArgs parses the command line into fs and returns the names of the
// flags it gives, counting those whose value did not parse, so that their
// variables are not read instead. It goes on past a value that does not
// parse, so that every such value is reported at once, but not past an
// unknown flag, after which the rest may not be what it seems; complete is
// false when it stopped early.
func parseArgs(fs *flag.FlagSet, args []string) (set map[string]bool, complete bool, err error) {
	set = make(map[string]bool)
	var errs []error
	complete = true
	for {
		err := fs.Parse(args)
		if err == nil {
			break
		}
		if errors.Is(err, flag.ErrHelp) {
			return nil, false, err
		}
		name, aerr := argError(fs, err)
		errs = append(errs, aerr)
		if name != "" {
			set[name] = true
		}
		if name == "" || len(fs.Args()) >= len(args) {
			complete = false
			break
		}
		args = fs.Args()
	}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set, complete, errors.Join(errs...)
}

// badArgValue matches the flag package's error for a value on the command
// line that the flag does not take.
var badArgValue = regexp.MustCompile(`^invalid (?:boolean )?value (".*") for (?:flag )?-([a-z-]+): `)

// argError rewrites the flag package's error for a bad value on the
// command line ("invalid value "x" for flag -bind-port: parse error") to
// name the flag and its variable and the kind of value wanted, as the
// errors about EP_ variables do, and returns the flag's name with it.
// Other errors pass unchanged, with no name.
func argError(fs *flag.FlagSet, err error) (string, error) {
	if name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: -"); ok {
		return "", fmt.Errorf("unknown flag --%s (--help lists the flags)", name)
	}
	m := badArgValue.FindStringSubmatch(err.Error())
	if m == nil {
		return "", err
	}
	value, uerr := strconv.Unquote(m[1])
	f := fs.Lookup(m[2])
	if uerr != nil || f == nil || f.Name == versionFlag {
		return "", err
	}
	return f.Name, fmt.Errorf("%s: invalid %s %q", flagRef(f.Name), valueKind(f), value)
}

// envName is the variable that sets the flag name: EP_ and the name in upper
// snake case, so --health-check-ca-file is EP_HEALTH_CHECK_CA_FILE.
func envName(name string) string {
	return "EP_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// valueKind names what a value of flag f must be, for error messages.
func valueKind(f *flag.Flag) string {
	switch name, _ := flag.UnquoteUsage(f); name {
	case "": // UnquoteUsage leaves the name of boolean flags empty
		return "boolean"
	case "int":
		return "integer"
	default:
		return name
	}
}

// printUsage writes the --help text to w: one line per flag of fs with its
// variable, description and default.
func printUsage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintf(w, "Usage: %s [flags]\n\n", fs.Name())
	fmt.Fprintln(w, "Per-node TCP load balancer for the Kubernetes API server.")
	fmt.Fprintln(w, "Each flag can also be set by the EP_ variable shown next to it;")
	fmt.Fprintln(w, "a flag on the command line wins over its variable.")
	fmt.Fprintln(w)
	fs.VisitAll(func(f *flag.Flag) { fmt.Fprintln(w, usageLine(f)) })
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Usage: %s status [--health-address host:port] [--json]\n\n", fs.Name())
	fmt.Fprintln(w, "Prints the upstream table of a running daemon, from its /upstreams endpoint.")
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Usage: %s check [flags]\n\n", fs.Name())
	fmt.Fprintln(w, "Reads the flags and EP_ variables as a start would and exits 0 if the daemon")
	fmt.Fprintln(w, "would start with them, or 1 with the message it would stop with; binds nothing.")
}

// usageLine describes flag f in one line, for example
// "  --health-interval duration  (EP_HEALTH_INTERVAL) Interval between upstream health checks (default 20s)".
func usageLine(f *flag.Flag) string {
	typeName, description := flag.UnquoteUsage(f)
	line := "  --" + f.Name
	if typeName != "" {
		line += " " + typeName
	}
	line += " "
	if f.Name != versionFlag {
		line += " (" + envName(f.Name) + ")"
	}
	line += " " + description
	// An empty or false default means "not set" and says nothing.
	if f.DefValue != "" && f.DefValue != "false" {
		line += " (default " + f.DefValue + ")"
	}
	return line
}

// endpointList is the flag.Value behind --endpoints and EP_ENDPOINTS: a
// comma-separated list whose entries it only splits and trims. Entries are
// judged in validate, so that every problem with them is reported naming
// both the flag and the variable.
type endpointList []string

// String returns the list as it would be written on the command line.
func (l *endpointList) String() string {
	if l == nil {
		return ""
	}
	return strings.Join(*l, ",")
}

// Set replaces the list, so a repeated --endpoints keeps its last value.
// A blank value is an empty list; an empty entry, as in "a,,b" or "a,", is
// kept as "" for validate to reject.
func (l *endpointList) Set(s string) error {
	if strings.TrimSpace(s) == "" {
		*l = nil
		return nil
	}
	entries := strings.Split(s, ",")
	for i, e := range entries {
		entries[i] = strings.TrimSpace(e)
	}
	*l = entries
	return nil
}

// portNumber is a port written in decimal. flag.IntVar would also take
// 0x1d1d, and read 07445 as octal 3877: a listener on a port nobody expects.
type portNumber int

func (p *portNumber) String() string {
	if p == nil {
		return "0"
	}
	return strconv.Itoa(int(*p))
}

// Set accepts decimal digits alone; validate checks the range.
func (p *portNumber) Set(s string) error {
	if s == "" || strings.Trim(s, "0123456789") != "" {
		return errors.New("not a decimal number")
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return errors.New("out of range")
	}
	*p = portNumber(n)
	return nil
}

// validate checks every rule of the configuration and replaces Endpoints
// with their normalized form. It reports all violations, one line each,
// naming the flag and its variable and saying what is allowed.
func (c *config) validate() error { //nolint:cyclop,gocognit // every cross-field rule in one place, as STYLE.md asks
	var errs []error
	if !validHost(c.BindAddress) {
		errs = append(errs, flagError("bind-address", "must be an IP address or RFC 1123 hostname: got %q", c.BindAddress))
	}
	// An unset --health-bind-address copies --bind-address, whose error
	// above already covers it.
	if c.HealthBindAddress != c.BindAddress && !validHost(c.HealthBindAddress) {
		errs = append(errs, flagError("health-bind-address", "must be an IP address or RFC 1123 hostname: got %q", c.HealthBindAddress))
	}
	if endpoints, err := normalizeEndpoints(c.Endpoints); err != nil {
		errs = append(errs, err)
	} else {
		c.Endpoints = endpoints
		errs = append(errs, c.checkOwnListener())
	}
	if c.BindPort < 1 || c.BindPort > 65535 {
		errs = append(errs, flagError("bind-port", "must be in 1-65535: got %d", c.BindPort))
	}
	if c.HealthPort < 1 || c.HealthPort > 65535 {
		errs = append(errs, flagError("health-port", "must be in 1-65535: got %d", c.HealthPort))
	}
	if c.HealthPort == c.BindPort {
		errs = append(errs, flagError("health-port", "must differ from %s: both are %d", flagRef("bind-port"), c.BindPort))
	}
	if c.HealthInterval < time.Second {
		errs = append(errs, flagError("health-interval", "must be at least 1s: got %v", c.HealthInterval))
	}
	if c.HealthTimeout < time.Second {
		errs = append(errs, flagError("health-timeout", "must be at least 1s: got %v", c.HealthTimeout))
	}
	if c.HealthTimeout >= c.HealthInterval {
		errs = append(errs, flagError("health-timeout", "must be less than %s: got %v >= %v", flagRef("health-interval"), c.HealthTimeout, c.HealthInterval))
	}
	if _, err := parseLogLevel(c.LogLevel); err != nil {
		errs = append(errs, flagError("log-level", "must be one of debug, info, warn, error, dpanic, panic, fatal: got %q", c.LogLevel))
	}
	if c.LivenessInterval < time.Second {
		errs = append(errs, flagError("liveness-interval", "must be at least 1s: got %v", c.LivenessInterval))
	}
	if c.LivenessThreshold < time.Second {
		errs = append(errs, flagError("liveness-threshold", "must be at least 1s: got %v", c.LivenessThreshold))
	}
	if c.LivenessThreshold <= c.LivenessInterval {
		errs = append(errs, flagError("liveness-threshold", "must be greater than %s: got %v <= %v", flagRef("liveness-interval"), c.LivenessThreshold, c.LivenessInterval))
	}
	if c.DrainTimeout < 0 {
		errs = append(errs, flagError("drain-timeout", "must not be negative: got %v", c.DrainTimeout))
	}
	if c.UpstreamSelection != selectRandom && c.UpstreamSelection != selectLatency {
		errs = append(errs, flagError("upstream-selection", "must be random or latency: got %q", c.UpstreamSelection))
	}
	if c.HealthCheck != checkTCP && c.HealthCheck != checkReadyz {
		errs = append(errs, flagError("health-check", "must be tcp or readyz: got %q", c.HealthCheck))
	}
	if c.HealthCheck == checkReadyz && c.HealthCheckCAFile == "" {
		errs = append(errs, flagError("health-check-ca-file", "is required with %s set to readyz", flagRef("health-check")))
	}
	if (c.HealthCheckCertFile == "") != (c.HealthCheckKeyFile == "") {
		errs = append(errs, flagError("health-check-cert-file", "and %s must be set together: got cert %q, key %q", flagRef("health-check-key-file"), c.HealthCheckCertFile, c.HealthCheckKeyFile))
	}
	if !validHost(c.HealthCheckServerName) {
		errs = append(errs, flagError("health-check-server-name", "must be an IP address or RFC 1123 hostname: got %q", c.HealthCheckServerName))
	} else if a, err := netip.ParseAddr(c.HealthCheckServerName); err == nil && a.Zone() != "" {
		// A zone names a local interface; certificates know nothing of it.
		errs = append(errs, flagError("health-check-server-name", "must not have an IPv6 zone: got %q", c.HealthCheckServerName))
	}
	return errors.Join(errs...)
}

// ignoredSetting is a setting given a value that the rest of the
// configuration makes irrelevant.
type ignoredSetting struct {
	flag    string
	because string
}

// ignoredSettings lists the settings that have a value but no effect. They
// are warnings, not errors: turning discovery off, or readyz probes back to
// tcp, is the change an operator makes in an emergency, and it must not
// also need the settings that go with them removed before the daemon
// starts again.
func (c *config) ignoredSettings() []ignoredSetting {
	var ignored []ignoredSetting
	noDiscovery := flagRef("enable-discovery") + " is false"
	for name, value := range map[string]string{"kubeconfig": c.Kubeconfig, "endpoint-cache-file": c.EndpointCacheFile} {
		if value != "" && !c.EnableDiscovery {
			ignored = append(ignored, ignoredSetting{name, noDiscovery})
		}
	}
	noReadyz := flagRef("health-check") + " is " + c.HealthCheck
	for name, value := range map[string]string{
		"health-check-ca-file": c.HealthCheckCAFile, "health-check-cert-file": c.HealthCheckCertFile,
		"health-check-key-file": c.HealthCheckKeyFile, "health-check-token-file": c.HealthCheckTokenFile,
	} {
		if value != "" && c.HealthCheck != checkReadyz {
			ignored = append(ignored, ignoredSetting{name, noReadyz})
		}
	}
	slices.SortFunc(ignored, func(a, b ignoredSetting) int { return strings.Compare(a.flag, b.flag) })
	return ignored
}

// flagRef names a flag the way every configuration error does: the flag and
// the variable that also sets it.
func flagRef(name string) string {
	return "--" + name + " (" + envName(name) + ")"
}

// flagError is a validation error about the flag name; format says what is
// allowed and what was given.
func flagError(name, format string, args ...any) error {
	return fmt.Errorf("%s %s", flagRef(name), fmt.Sprintf(format, args...))
}

// checkOwnListener refuses --endpoints entries that are the proxy's own
// listener, when --bind-address is an IP address or localhost: the
// daemon drops such entries from every source (see withoutOwnListener),
// and a static one is a configuration error better reported at once.
func (c *config) checkOwnListener() error {
	var listens []string
	port := strconv.Itoa(c.BindPort)
	if isLocalhost(c.BindAddress) {
		listens = []string{net.JoinHostPort("127.0.0.1", port), net.JoinHostPort("::1", port)}
	} else if _, err := netip.ParseAddr(c.BindAddress); err == nil {
		listens = []string{net.JoinHostPort(c.BindAddress, port)}
	}
	local := localAddrs()
	var own []string
	for _, e := range c.Endpoints {
		if slices.ContainsFunc(listens, func(l string) bool { return ownListener(e, l, local) }) {
			own = append(own, e)
		}
	}
	if len(own) == 0 {
		return nil
	}
	return flagError("endpoints", "must not name this proxy's own listener %s (%s, %s), which would make it its own upstream: %s",
		net.JoinHostPort(c.BindAddress, port), flagRef("bind-address"), flagRef("bind-port"), strings.Join(own, ", "))
}

// ownListener reports whether dialling endpoint would reach the listener at
// listen (an IP:port), making the proxy its own upstream: a loop that takes
// a connection slot at every hop until none is left. local are the
// addresses of this node's interfaces, which a wildcard listener answers
// on as well. A hostname other than localhost is not resolved, and is never
// reported.
func ownListener(endpoint, listen string, local []netip.Addr) bool {
	l, err := netip.ParseAddrPort(listen)
	if err != nil {
		return false
	}
	host, port, err := net.SplitHostPort(endpoint)
	if err != nil || port != strconv.Itoa(int(l.Port())) {
		return false
	}
	var ips []netip.Addr
	if isLocalhost(host) {
		ips = []netip.Addr{netip.IPv6Loopback(), netip.AddrFrom4([4]byte{127, 0, 0, 1})}
	} else if ip, err := netip.ParseAddr(host); err == nil {
		ips = []netip.Addr{ip.Unmap()}
	}
	return slices.ContainsFunc(ips, func(ip netip.Addr) bool { return reaches(ip, l.Addr().Unmap(), local) })
}

// reaches reports whether a connection to ip reaches a listener on listen,
// the port being the same.
func reaches(ip, listen netip.Addr, local []netip.Addr) bool {
	switch {
	case ip == listen:
		return true
	case ip.IsUnspecified():
		// Linux connects a dial to 0.0.0.0 or :: to this host.
		return listen.IsLoopback() || listen.IsUnspecified() || slices.Contains(local, listen)
	case listen.IsUnspecified():
		return ip.IsLoopback() || slices.Contains(local, ip)
	}
	return false
}

// localAddrs returns the addresses of this node's network interfaces, none
// if they cannot be listed.
func localAddrs() []netip.Addr {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var ips []netip.Addr
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			ips = append(ips, p.Addr().Unmap())
		}
	}
	return ips
}

// normalizeEndpoints checks the --endpoints entries and returns them
// normalized, each once in the order first given, or one error listing
// every bad entry.
func normalizeEndpoints(entries []string) ([]string, error) {
	if len(entries) == 0 {
		return nil, flagError("endpoints", "must not be empty: want a comma-separated list of host:port")
	}
	normalized := make([]string, 0, len(entries))
	var problems []string
	for _, e := range entries {
		n, err := normalizeEndpoint(e)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		if !slices.Contains(normalized, n) {
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
// as net/netip prints them, hostnames in lower case, the port without leading
// zeros. IPv6 addresses must be bracketed, as in [fd00::1]:6443.
func normalizeEndpoint(s string) (string, error) {
	host, port, err := splitEndpoint(s)
	if err != nil {
		return "", err
	}
	if addr, err := netip.ParseAddr(host); err == nil {
		// EndpointSlices list IPv4 API servers as plain IPv4, so an
		// IPv4-mapped address would otherwise count as a second upstream.
		return net.JoinHostPort(addr.Unmap().String(), strconv.FormatUint(port, 10)), nil
	}
	if !validHostname(host) {
		return "", fmt.Errorf("endpoint %s: host %s is not an IP address or RFC 1123 hostname", quoteShort(s), quoteShort(host))
	}
	return net.JoinHostPort(strings.ToLower(host), strconv.FormatUint(port, 10)), nil
}

// quoteShort quotes s for an error message, cut to its first 64 bytes
// (see cutText), so that a huge bad value, from a file or a variable, does
// not make a huge log line.
func quoteShort(s string) string {
	const limit = 64
	if len(s) <= limit {
		return strconv.Quote(s)
	}
	return strconv.Quote(cutText(s, limit)) + "..."
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

// splitEndpoint splits s into a non-empty host and a port in 1-65535, with
// errors that say how to write the endpoint instead.
func splitEndpoint(s string) (host string, port uint64, err error) {
	if s == "" {
		return "", 0, errors.New("empty entry (doubled or trailing comma?)")
	}
	host, portText, err := net.SplitHostPort(s)
	if err != nil {
		if addr, parseErr := netip.ParseAddr(s); parseErr == nil && addr.Is6() {
			return "", 0, fmt.Errorf("endpoint %s: an IPv6 address needs brackets and a port, as in [fd00::1]:6443", quoteShort(s))
		}
		if strings.Contains(s, "://") {
			return "", 0, fmt.Errorf("endpoint %s: want host:port without a scheme", quoteShort(s))
		}
		return "", 0, fmt.Errorf("endpoint %s: want host:port", quoteShort(s))
	}
	if host == "" {
		return "", 0, fmt.Errorf("endpoint %s: empty host", quoteShort(s))
	}
	if strings.HasPrefix(s, "[") && !strings.Contains(host, ":") {
		return "", 0, fmt.Errorf("endpoint %s: brackets are only for IPv6 addresses, as in [fd00::1]:6443", quoteShort(s))
	}
	port, err = strconv.ParseUint(portText, 10, 16)
	if err != nil || port == 0 {
		return "", 0, fmt.Errorf("endpoint %s: port must be a number in 1-65535, got %s", quoteShort(s), quoteShort(portText))
	}
	return host, port, nil
}

// isLocalhost reports whether host names localhost, fully qualified or not.
func isLocalhost(host string) bool {
	return strings.EqualFold(strings.TrimSuffix(host, "."), "localhost")
}

// validHost reports whether s is an IP address or an RFC 1123 hostname.
func validHost(s string) bool {
	if _, err := netip.ParseAddr(s); err == nil {
		return true
	}
	return validHostname(s)
}

// validHostname reports whether s is an RFC 1123 hostname: at most 253
// characters of dot-separated labels, in any case. One trailing dot, which
// marks a fully qualified name (RFC 1035), is allowed.
func validHostname(s string) bool {
	s = strings.TrimSuffix(s, ".")
	if s == "" || len(s) > 253 {
		return false
	}
	labels := strings.Split(s, ".")
	for _, label := range labels {
		if !validLabel(label) {
			return false
		}
	}
	// RFC 1123 section 2.1: the highest-level label is never all digits,
	// so a name cannot look like dotted decimal. This keeps a mistyped IPv4
	// address such as 10.0.0.256 from passing as a hostname and failing only
	// when it is dialed.
	return strings.Trim(labels[len(labels)-1], "0123456789") != ""
}

// validLabel reports whether label is 1-63 letters, digits and hyphens that
// neither start nor end with a hyphen.
func validLabel(label string) bool {
	if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
		return false
	}
	for _, r := range label {
		letter := 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z'
		if !letter && (r < '0' || r > '9') && r != '-' {
			return false
		}
	}
	return true
}

// versionInfo returns the version and revision stamped into the binary with
// -ldflags "-X main.Version=... -X main.Revision=...", or failing that the
// ones the go command recorded in the build info, or "devel" and "unknown".
func versionInfo() (version, revision string) {
	version, revision = Version, Revision
	if info, ok := debug.ReadBuildInfo(); ok {
		if version == "" && info.Main.Version != "(devel)" {
			version = info.Main.Version
		}
		for _, s := range info.Settings {
			if revision == "" && s.Key == "vcs.revision" {
				revision = s.Value
			}
		}
	}
	if version == "" {
		version = "devel"
	}
	if revision == "" {
		revision = "unknown"
	}
	return version, revision
}

// Levels above slog.LevelError for the three zap level names --log-level
// accepts besides slog's four. Each is "error or worse": setting --log-level
// to one of them keeps only records at that level or above, so panic and
// fatal also silence ordinary errors. They are two apart, as slog's own
// levels are four apart, to leave room between them.
//
//	debug  -> slog.LevelDebug (-4)
//	info   -> slog.LevelInfo (0)
//	warn   -> slog.LevelWarn (4)
//	error  -> slog.LevelError (8)
//	dpanic -> levelDPanic (10)
//	panic  -> levelPanic (12)
//	fatal  -> levelFatal (14)
const (
	levelDPanic = slog.LevelError + 2
	levelPanic  = slog.LevelError + 4
	levelFatal  = slog.LevelError + 6
)

// parseLogLevel maps a --log-level name to its slog level, as listed above.
func parseLogLevel(s string) (slog.Level, error) {
	switch s {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	case "dpanic":
		return levelDPanic, nil
	case "panic":
		return levelPanic, nil
	case "fatal":
		return levelFatal, nil
	}
	return 0, fmt.Errorf("unknown log level %q", s)
}

// newLogger returns a logger writing JSON records of at least level to w.
func newLogger(level slog.Level, w io.Writer) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{
		Level:       level,
		ReplaceAttr: nameLevel,
	}))
}

// logQueueRecords bounds the records a logSink holds for a log reader that
// is not reading. The daemon logs state changes at info and per-connection
// events only at debug, so 4096 records outlast a reader stalled for
// minutes; at a few hundred bytes a record (errors are cut to maxLogError)
// the full queue holds about 1 MiB.
const logQueueRecords = 4096

// logFlushTimeout bounds how long run waits on exit for queued log lines:
// long enough for a working stderr to take the final error or "stopped"
// line, short enough that a stuck one cannot hold up a restart.
const logFlushTimeout = 2 * time.Second

// logSink sits between the logger and stderr so that logging never blocks
// the daemon. A write to stderr blocks while its reader (journald, a
// container log shim) is not reading, and the pool logs while holding its
// lock: one stalled write used to freeze new connections, the liveness
// beat and shutdown. Write queues a copy of each record without blocking,
// dropping and counting it when the queue is full; run, the one writer,
// writes the queue to out in order.
type logSink struct {
	out     io.Writer
	notice  *slog.Logger // writes the drop warning straight to out, from run
	records chan []byte  // the queue; at most logQueueRecords
	dropped atomic.Int64 // records lost to a full queue since the last warning
	stop    chan struct{}
	done    chan struct{} // closed when run returns
}

func newLogSink(out io.Writer) *logSink {
	return &logSink{
		out: out,
		// At warn whatever --log-level says: the lines it accounts
		// for may be errors.
		notice:  newLogger(slog.LevelWarn, out),
		records: make(chan []byte, logQueueRecords),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
}

// Write queues a copy of p (slog reuses its buffer) and never blocks. It
// reports success even for a dropped record: the logger has nothing better
// to do with an error.
func (s *logSink) Write(p []byte) (int, error) {
	select {
	case s.records <- bytes.Clone(p):
	default:
		s.dropped.Add(1)
	}
	return len(p), nil
}

// run writes queued records to out until close is called, then writes what
// is left and returns. Write errors are ignored: EPIPE is expected once the
// reader has gone (SIGPIPE is caught), and nobody else could report them.
func (s *logSink) run() {
	defer close(s.done)
	for {
		select {
		case r := <-s.records:
			s.write(r)
		case <-s.stop:
			s.flush()
			return
		}
	}
}

// flush writes the records queued so far.
func (s *logSink) flush() {
	for {
		select {
		case r := <-s.records:
			s.write(r)
		default:
			return
		}
	}
}

// write writes r and then, once out takes lines again, the count of those
// dropped meanwhile, again for any dropped while the warning was written.
func (s *logSink) write(r []byte) {
	_, _ = s.out.Write(r)
	for n := s.dropped.Swap(0); n > 0; n = s.dropped.Swap(0) {
		s.notice.Warn("log lines dropped: the log reader was not keeping up", "dropped", n)
	}
}

// close makes run write what is queued and return, and waits for it at
// most timeout. It reports whether run returned: a writer stuck on out
// cannot be interrupted, and the process ending is what ends it then.
func (s *logSink) close(timeout time.Duration) bool {
	close(s.stop)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-s.done:
		return true
	case <-t.C:
		return false
	}
}

// maxLogError bounds the text of an error in a log line. Errors carry text
// from peers, such as the names in an upstream's certificate, which can run
// to tens of kilobytes.
const maxLogError = 2 << 10

// nameLevel is a slog.HandlerOptions.ReplaceAttr that prints the levels
// above Error by name ("FATAL") instead of as an offset ("ERROR+6"),
// durations as text ("30s"), where JSON would have nanoseconds, and errors
// cut to maxLogError bytes.
func nameLevel(groups []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
		return a
	}
	if err, ok := a.Value.Any().(error); ok && a.Value.Kind() == slog.KindAny {
		if text := err.Error(); len(text) > maxLogError {
			a.Value = slog.StringValue(cutText(text, maxLogError) + "...")
		}
		return a
	}
	if len(groups) > 0 || a.Key != slog.LevelKey {
		return a
	}
	level, ok := a.Value.Any().(slog.Level)
	if !ok {
		return a
	}
	switch level {
	case levelDPanic:
		a.Value = slog.StringValue("DPANIC")
	case levelPanic:
		a.Value = slog.StringValue("PANIC")
	case levelFatal:
		a.Value = slog.StringValue("FATAL")
	default: // slog's own levels print as they are
	}
	return a
}
