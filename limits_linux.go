//go:build linux

package main

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// openFilesLimit returns the soft RLIMIT_NOFILE. Go raises it to the hard
// limit at start-up, so this is usually the hard limit.
func openFilesLimit() uint64 {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return 1024
	}
	return rl.Cur
}

// memoryLimit returns the memory limit of the process's cgroup in bytes, 0
// if it has none or it cannot be read.
func memoryLimit() uint64 { return cgroupMemoryLimit("/proc/self/cgroup", "/sys/fs/cgroup") }

// cgroupMemoryLimit returns the memory limit in force for the cgroup that
// selfCgroup (in the format of /proc/self/cgroup) names, under the cgroup
// file system at root: the lowest memory.max (v2) or memory.limit_in_bytes
// (v1) of that cgroup and of each cgroup above it, as a parent's limit
// (a systemd slice's MemoryMax) bounds its children too. A container with
// its own cgroup namespace sees its cgroup at the root, which the walk up
// reaches as well. 0 means no limit or none found; v1 sets near 2^63 for
// none.
func cgroupMemoryLimit(selfCgroup, root string) uint64 {
	// A file that cannot be read names no cgroup: its empty contents hold
	// no line.
	b, _ := os.ReadFile(selfCgroup) //nolint:gosec // a fixed kernel file, or a test's
	limit := uint64(math.MaxUint64)
	for line := range strings.SplitSeq(string(b), "\n") {
		id, rest, _ := strings.Cut(line, ":")
		controllers, path, ok := strings.Cut(rest, ":")
		switch {
		case !ok:
		case id == "0" && controllers == "":
			limit = min(limit, lowestOnPath(root, path, "memory.max"))
		case slices.Contains(strings.Split(controllers, ","), "memory"):
			limit = min(limit, lowestOnPath(filepath.Join(root, "memory"), path, "memory.limit_in_bytes"))
		}
	}
	if limit >= 1<<62 {
		return 0
	}
	return limit
}

// lowestOnPath returns the lowest limit that file holds in the directory of
// the cgroup path under root and in each directory above it up to root,
// math.MaxUint64 if none sets one. The path is cleaned as an absolute one
// first, so it cannot lead out of root. A file holds "max" or a number of
// bytes; one that cannot be read is as good as no limit: its empty
// contents do not parse. 0 is no limit either.
func lowestOnPath(root, path, file string) uint64 {
	root = filepath.Clean(root)
	limit := uint64(math.MaxUint64)
	for dir := filepath.Join(root, filepath.Clean("/"+path)); ; dir = filepath.Dir(dir) {
		b, _ := os.ReadFile(filepath.Join(dir, file)) //nolint:gosec // a cgroup file under the cgroup root
		if v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err == nil && v > 0 {
			limit = min(limit, v)
		}
		if len(dir) <= len(root) {
			return limit
		}
	}
}
