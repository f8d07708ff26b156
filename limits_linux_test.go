package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// The memory limit is the lowest set on the process's cgroup or a cgroup
// above it, in cgroup v2 or in v1's memory controller, walking up to the
// root of the mount, which a cgroup namespace shows as the container's own
// cgroup; "max" and v1's near-2^63 mean none.
func TestCgroupMemoryLimit(t *testing.T) {
	tests := []struct {
		name  string
		self  string
		files map[string]string
		want  uint64
	}{
		{"v2 at its path", "0::/kubepods/pod1/c1\n",
			map[string]string{"kubepods/pod1/c1/memory.max": "134217728\n", "kubepods/pod1/memory.max": "max\n",
				"kubepods/memory.max": "1073741824\n"}, 128 << 20},
		{"v2 lower on a parent", "0::/system.slice/ep.service\n",
			map[string]string{"system.slice/ep.service/memory.max": "max\n", "system.slice/memory.max": "67108864\n"}, 64 << 20},
		{"v2 parent lower than its own", "0::/kubepods/pod1/c1\n",
			map[string]string{"kubepods/pod1/c1/memory.max": "134217728\n", "kubepods/pod1/memory.max": "100663296\n"}, 96 << 20},
		{"v2 path not under the mount, limit at its root", "0::/kubepods/pod1/c1\n",
			map[string]string{"memory.max": "134217728\n"}, 128 << 20},
		{"v2 path cannot leave the mount", "0::/../../etc\n",
			map[string]string{"memory.max": "134217728\n", "etc/memory.max": "max"}, 128 << 20},
		{"v2 in a cgroup namespace", "0::/\n", map[string]string{"memory.max": "134217728\n"}, 128 << 20},
		{"v2 without a limit", "0::/c1\n", map[string]string{"c1/memory.max": "max\n"}, 0},
		{"v1 memory controller", "4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n",
			map[string]string{"memory/docker/abc/memory.limit_in_bytes": "268435456\n"}, 256 << 20},
		{"v1 without a limit", "4:memory:/x\n", map[string]string{"memory/x/memory.limit_in_bytes": "9223372036854771712\n"}, 0},
		{"hybrid: v1 controller, empty v2 line", "4:memory:/x\n0::/\n",
			map[string]string{"memory/x/memory.limit_in_bytes": "67108864\n"}, 64 << 20},
		{"v1 at the mount root", "4:memory:/docker/abc\n", map[string]string{"memory/memory.limit_in_bytes": "67108864"}, 64 << 20},
		{"v1 lower on a parent", "4:memory:/user.slice/u/s\n",
			map[string]string{"memory/user.slice/u/s/memory.limit_in_bytes": "9223372036854771712\n",
				"memory/user.slice/memory.limit_in_bytes": "33554432\n"}, 32 << 20},
		{"v1 and v2 both set: the lower", "4:memory:/x\n0::/y\n",
			map[string]string{"memory/x/memory.limit_in_bytes": "67108864\n", "y/memory.max": "33554432\n"}, 32 << 20},
		{"nothing readable", "0::/c1\n", nil, 0},
		{"garbage", "0::/c1\n", map[string]string{"c1/memory.max": "lots"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			for name, content := range tt.files {
				path := filepath.Join(root, name)
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				writeFile(t, path, content)
			}
			self := filepath.Join(t.TempDir(), "cgroup")
			writeFile(t, self, tt.self)
			if got := cgroupMemoryLimit(self, root); got != tt.want {
				t.Errorf("got %d; want %d", got, tt.want)
			}
		})
	}
}

// memoryLimitEnv makes the copy of the test binary that
// TestMemoryLimitOfRealCgroup starts print memoryLimit and return.
const memoryLimitEnv = "EP_TEST_PRINT_MEMORY_LIMIT"

// TestMemoryLimitOfRealCgroup runs a copy of the test binary in a real
// cgroup without a limit of its own, under one limited to 64 MiB, as a
// systemd slice's MemoryMax would be: memoryLimit must find the parent's.
// It needs root and a memory controller it can make cgroups in.
func TestMemoryLimitOfRealCgroup(t *testing.T) {
	if os.Getenv(memoryLimitEnv) != "" {
		fmt.Printf("memory limit: %d\n", memoryLimit())
		return
	}
	parent, child, file := makeMemoryCgroups(t)
	const limit = 64 << 20
	if err := os.WriteFile(filepath.Join(parent, file), []byte(strconv.Itoa(limit)), 0o600); err != nil {
		t.Fatalf("set the parent's limit: %v", err)
	}
	cmd := exec.CommandContext(t.Context(), "/bin/sh", "-c", `echo $$ > "$1/cgroup.procs" && exec "$2" -test.run='^TestMemoryLimitOfRealCgroup$'`,
		"sh", child, os.Args[0])
	cmd.Env = append(os.Environ(), memoryLimitEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`memory limit: (\d+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("child printed no limit:\n%s", out)
	}
	if got := string(m[1]); got != strconv.Itoa(limit) {
		t.Errorf("memoryLimit in a child of a cgroup limited to %d: got %s", limit, got)
	}
}

// makeMemoryCgroups makes a cgroup and a child of it in the memory
// controller (cgroup v2, or v1's memory hierarchy), removed when t ends,
// and returns their directories and the name of the limit file. It skips t
// where that cannot be done.
func makeMemoryCgroups(t *testing.T) (parent, child, file string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to make cgroups")
	}
	root, file := "/sys/fs/cgroup/memory", "memory.limit_in_bytes"
	if b, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		if !strings.Contains(string(b), "memory") {
			t.Skip("cgroup v2 without the memory controller")
		}
		root, file = "/sys/fs/cgroup", "memory.max"
	} else if _, err := os.Stat(filepath.Join(root, file)); err != nil {
		t.Skipf("no cgroup memory controller found: %v", err)
	}
	parent = filepath.Join(root, fmt.Sprintf("extractedprism-test-%d", os.Getpid()))
	child = filepath.Join(parent, "child")
	if err := os.Mkdir(parent, 0o755); err != nil {
		t.Skipf("cannot make a cgroup: %v", err)
	}
	t.Cleanup(func() { _ = os.Remove(parent) })
	if file == "memory.max" {
		if err := os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), []byte("+memory"), 0o600); err != nil {
			t.Skipf("cannot enable the memory controller below %s: %v", parent, err)
		}
	}
	if err := os.Mkdir(child, 0o755); err != nil {
		t.Fatalf("make the child cgroup: %v", err)
	}
	t.Cleanup(func() { _ = os.Remove(child) })
	return parent, child, file
}

// Whatever /proc/self/cgroup and the limit files hold, the limit found is
// one that a file under the cgroup root holds, or none: a path in the
// cgroup file never leads out of the root, where a lower limit waits.
func FuzzCgroupMemoryLimit(f *testing.F) {
	for _, s := range [][2]string{
		{"0::/kubepods/pod1/c1\n", "134217728\n"}, {"4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n", "max\n"},
		{"0::/../../etc\n", "67108864"}, {"4:memory:/../..\n0::/\n", "9223372036854771712\n"},
		{"0::/memory\n", "lots"}, {"::\n0:\n:memory:\n", ""}, {"0::/c1", " 1 "}, {"0::/..\n", "max"}, {"4:memory:/../..\n", "2"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, self, limit string) {
		outer := t.TempDir()
		root := filepath.Join(outer, "root")
		for dir, content := range map[string]string{outer: "1", root: limit} {
			for _, file := range []string{"memory.max", "memory.limit_in_bytes", "memory/memory.limit_in_bytes"} {
				path := filepath.Join(dir, file)
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
		}
		selfFile := filepath.Join(outer, "self")
		if err := os.WriteFile(selfFile, []byte(self), 0o600); err != nil {
			t.Fatal(err)
		}
		want, _ := strconv.ParseUint(strings.TrimSpace(limit), 10, 64)
		if got := cgroupMemoryLimit(selfFile, root); got != 0 && got != want {
			t.Errorf("cgroupMemoryLimit with %q and limit %q: got %d; want 0 or %d", self, limit, got, want)
		}
	})
}
