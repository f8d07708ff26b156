//go:build linux

package main

import (
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
// reaches as well. 0 means no limit or none found.
func cgroupMemoryLimit(selfCgroup, root string) uint64 {
	b, err := os.ReadFile(selfCgroup) //nolint:gosec // a fixed kernel file, or a test's
	if err != nil {
		return 0
	}
	var limit uint64
	for line := range strings.SplitSeq(string(b), "\n") {
		id, rest, _ := strings.Cut(line, ":")
		controllers, path, ok := strings.Cut(rest, ":")
		switch {
		case !ok:
		case id == "0" && controllers == "":
			limit = lowerLimit(limit, lowestOnPath(root, path, "memory.max"))
		case slices.Contains(strings.Split(controllers, ","), "memory"):
			limit = lowerLimit(limit, lowestOnPath(filepath.Join(root, "memory"), path, "memory.limit_in_bytes"))
		}
	}
	return limit
}

// lowestOnPath returns the lowest limit that file holds in the directory of
// the cgroup path under root and in each directory above it up to root, 0
// if none sets one. The path is cleaned as an absolute one first, so it
// cannot lead out of root.
func lowestOnPath(root, path, file string) uint64 {
	root = filepath.Clean(root)
	var limit uint64
	for dir := filepath.Join(root, filepath.Clean("/"+path)); ; dir = filepath.Dir(dir) {
		limit = lowerLimit(limit, readMemoryLimit(filepath.Join(dir, file)))
		if len(dir) <= len(root) {
			return limit
		}
	}
}

// lowerLimit returns the lower of two memory limits, where 0 is none.
func lowerLimit(a, b uint64) uint64 {
	if a == 0 || (b != 0 && b < a) {
		return b
	}
	return a
}

// readMemoryLimit reads a cgroup memory limit file: "max", or a number of
// bytes, which v1 sets near 2^63 for no limit. 0 means none, or a file
// that cannot be read.
func readMemoryLimit(path string) uint64 {
	// A file that cannot be read is as good as no limit: its empty
	// contents do not parse.
	b, _ := os.ReadFile(path) //nolint:gosec // a cgroup file under the cgroup root
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || v >= 1<<62 {
		return 0
	}
	return v
}
