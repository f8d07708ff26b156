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
	"slices"
	"strings"
)

// check reads the flags and EP_ variables exactly as a start would and
// returns what a start would stop with, binding nothing. Settings that
// would have no effect are listed as warnings; they do not fail the check.
// Files the settings name are read at start, not here: they may exist only
// on the node.
func check(args []string, getenv func(string) string, stdout io.Writer) error {
	cfg, err := parseConfig(args, getenv, stdout)
	if errors.Is(err, flag.ErrHelp) || errors.Is(err, errVersionShown) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, ig := range cfg.ignoredSettings() {
		fmt.Fprintf(stdout, "warning: %s has no effect: %s\n", flagRef(ig.flag), ig.because)
	}
	fmt.Fprintln(stdout, "extractedprism check: configuration is valid")
	return nil
}

// ignoredSetting is a setting given a value that the rest of the
// configuration makes irrelevant.
type ignoredSetting struct{ flag, because string }

// ignoredSettings lists the settings that have a value but no effect. They
// are warnings, not errors: turning discovery off, or readyz probes back to
// tcp, is an emergency change, which must not also need the settings that
// go with them removed before the daemon starts again.
func (c *config) ignoredSettings() []ignoredSetting {
	var ignored []ignoredSetting
	for name, value := range map[string]string{
		"kubeconfig": c.Kubeconfig, "endpoint-cache-file": c.EndpointCacheFile,
		"health-check-ca-file": c.HealthCheckCAFile, "health-check-cert-file": c.HealthCheckCertFile,
		"health-check-key-file": c.HealthCheckKeyFile, "health-check-token-file": c.HealthCheckTokenFile,
	} {
		switch {
		case value == "":
		case strings.HasPrefix(name, "health-check-") && c.HealthCheck != checkReadyz:
			ignored = append(ignored, ignoredSetting{name, flagRef("health-check") + " is " + c.HealthCheck})
		case !strings.HasPrefix(name, "health-check-") && !c.EnableDiscovery:
			ignored = append(ignored, ignoredSetting{name, flagRef("enable-discovery") + " is false"})
		}
	}
	slices.SortFunc(ignored, func(a, b ignoredSetting) int { return strings.Compare(a.flag, b.flag) })
	return ignored
}
