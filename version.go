package main

// Beyond the spec: --version, and the build_info metric's labels.

import (
	"cmp"
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version and Revision are written by the linker alone, at release:
// -ldflags "-X main.Version=... -X main.Revision=...". Without them
// versionInfo falls back to what the go command recorded in the build.
var Version, Revision string

// versionInfo returns the stamped version and revision, or else those of
// the build info (a module version under go install, the VCS tag and
// commit in a checkout), or "devel" and "unknown".
func versionInfo() (version, revision string) {
	version, revision = Version, Revision
	if info, ok := debug.ReadBuildInfo(); ok {
		if info.Main.Version != "(devel)" {
			version = cmp.Or(version, info.Main.Version)
		}
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" {
				revision = cmp.Or(revision, s.Value)
			}
		}
	}
	return cmp.Or(version, "devel"), cmp.Or(revision, "unknown")
}

// versionLine is what --version prints.
func versionLine() string {
	version, revision := versionInfo()
	return fmt.Sprintf("extractedprism %s (revision %s, %s)", version, revision, runtime.Version())
}
