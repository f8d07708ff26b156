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
