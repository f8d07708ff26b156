package main

// Beyond the spec: "extractedprism check", the one implementation of
// validation that the Helm chart runs as a pre-install hook, so a bad value
// fails the install with the daemon's own message before any node is
// touched.

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
)

// check reads the flags and EP_ variables exactly as a start would and
// returns what a start would stop with, binding nothing. What a start would
// warn of is listed as warnings, which do not fail the check: settings
// without effect, EP_ variables no flag reads, and a kubeconfig that does
// not load here. So is a readyz CA that does not load here, which fails a
// start: the chart's check runs in a pod of its own, where the node's
// files may be missing, so a missing file cannot fail it.
func check(args []string, getenv func(string) string, environ func() []string, stdout io.Writer) error {
	cfg, err := parseConfig(args, getenv, stdout)
	if err != nil {
		return configError(err, environ)
	}
	for _, ig := range append(cfg.warnings(environ), cfg.kubeconfigWarning()...) {
		fmt.Fprintln(stdout, "warning:", ig)
	}
	if err := cfg.caError(); err != nil {
		fmt.Fprintln(stdout, "warning: a start here would stop:", err)
	}
	fmt.Fprintln(stdout, "extractedprism check: configuration is valid")
	return nil
}

// configError is what a start, or check, returns for parseConfig's error
// err: nil after --help or --version, else err and the unknown EP_
// variables, as one of them may be why: EP_ENDPOINT, a typo, leaves
// --endpoints empty.
func configError(err error, environ func() []string) error {
	if errors.Is(err, flag.ErrHelp) || errors.Is(err, errVersionShown) {
		return nil
	}
	errs := []error{err}
	for _, ig := range unknownVariables(environ()) {
		errs = append(errs, errors.New(ig.String()))
	}
	return errors.Join(errs...)
}

// kubeconfigWarning says why --kubeconfig does not load here, as a start
// logs it, which retries it. Credentials from the service account are not
// looked for: they belong to the daemon's pod, not to the configuration,
// and the chart's check runs without them.
func (c *config) kubeconfigWarning() []ignoredSetting {
	if !c.EnableDiscovery || c.Kubeconfig == "" {
		return nil
	}
	kc := kubeProviderConfig{LocalAddr: net.JoinHostPort(dialableHost(c.BindAddress), strconv.Itoa(c.BindPort)), Kubeconfig: c.Kubeconfig}
	restConfig, err := kubeRESTConfig(kc, defaultServiceAccountDir)
	if err == nil {
		_, err = newRESTSliceClient(restConfig)
	}
	if err == nil {
		return nil
	}
	return []ignoredSetting{{flagRef("kubeconfig"), "it does not load here: " + err.Error() + "; a start retries it, serving the static endpoints meanwhile"}}
}

// caError says why the readyz CA does not load. Readyz probes need it from
// the first probe, unlike a credential, which may appear later, so it stops
// a start. Probes still re-read it, so it can rotate.
func (c *config) caError() error {
	if c.HealthCheck != checkReadyz {
		return nil
	}
	if _, _, err := (&readyzProbe{caFile: c.HealthCheckCAFile}).tlsConfig(); err != nil {
		return fmt.Errorf("%s: %w", flagRef("health-check-ca-file"), err)
	}
	return nil
}

// ignoredSetting is a setting given a value that has no effect: setting
// is a flag and its variable (flagRef), or a variable.
type ignoredSetting struct{ setting, because string }

func (ig ignoredSetting) String() string { return ig.setting + " has no effect: " + ig.because }

// warnings lists what a start warns of before it listens: the settings
// that have a value but no effect, by flag name, then the EP_ variables no
// flag reads. The settings are warnings, not errors: turning discovery off,
// or readyz probes back to tcp, is an emergency change, which must not also
// need the settings that go with them removed before the daemon starts
// again.
func (c *config) warnings(environ func() []string) []ignoredSetting {
	var ignored []ignoredSetting
	values := map[string]string{
		"kubeconfig": c.Kubeconfig, "endpoint-cache-file": c.EndpointCacheFile,
		"health-check-ca-file": c.HealthCheckCAFile, "health-check-cert-file": c.HealthCheckCertFile,
		"health-check-key-file": c.HealthCheckKeyFile, "health-check-token-file": c.HealthCheckTokenFile,
	}
	for _, name := range slices.Sorted(maps.Keys(values)) {
		switch {
		case values[name] == "":
		case strings.HasPrefix(name, "health-check-") && c.HealthCheck != checkReadyz:
			ignored = append(ignored, ignoredSetting{flagRef(name), flagRef("health-check") + " is " + c.HealthCheck})
		case !strings.HasPrefix(name, "health-check-") && !c.EnableDiscovery:
			ignored = append(ignored, ignoredSetting{flagRef(name), flagRef("enable-discovery") + " is false"})
		}
	}
	return append(ignored, unknownVariables(environ())...)
}

// unknownVariables lists the EP_ variables in environ ("NAME=value") that
// no flag reads, each with the one it may be a typo of: EP_HEALTH_CHEK=readyz
// would otherwise leave the probes at tcp in silence.
func unknownVariables(environ []string) []ignoredSetting {
	var known []string // and "", the variable of --version
	fs, _ := newFlagSet(&config{})
	fs.VisitAll(func(f *flag.Flag) { known = append(known, envName(f.Name)) })
	var unknown []ignoredSetting
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "EP_") || slices.Contains(known, name) {
			continue
		}
		because := "no flag reads it"
		if near := closest(name, known); near != "" {
			because += "; did you mean " + near + "?"
		}
		unknown = append(unknown, ignoredSetting{name, because})
	}
	slices.SortFunc(unknown, func(a, b ignoredSetting) int { return strings.Compare(a.setting, b.setting) })
	return unknown
}

// closest returns the name among known nearest to name, if near enough to
// be a typo of it: at most 2 edits, or a third of name's length after EP_.
// Farther, a suggestion would be a guess.
func closest(name string, known []string) string {
	best, bound := "", max(2, (len(name)-3)/3)
	for _, k := range known {
		if d := editDistance(name, k); d <= bound {
			best, bound = k, d-1
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b, in bytes: the fewest
// insertions, deletions and substitutions that turn one into the other.
func editDistance(a, b string) int {
	row := make([]int, len(b)+1) // row[j]: the distance of a[:i] and b[:j]
	for j := range row {
		row[j] = j
	}
	for i := range len(a) {
		diagonal := row[0]
		row[0] = i + 1
		for j := range len(b) {
			cost := 1
			if a[i] == b[j] {
				cost = 0
			}
			diagonal, row[j+1] = row[j+1], min(row[j+1]+1, row[j]+1, diagonal+cost)
		}
	}
	return row[len(b)]
}
