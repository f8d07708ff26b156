package main

import (
	"os"
	"path/filepath"
	"testing"
)

// The memory limit is read from the process's own cgroup, in cgroup v2 or
// in v1's memory controller, at its path or at the root of a mount that a
// cgroup namespace shows as the root; "max" and v1's near-2^63 mean none.
func TestCgroupMemoryLimit(t *testing.T) {
	tests := []struct {
		name  string
		self  string
		files map[string]string
		want  uint64
	}{
		{"v2 at its path", "0::/kubepods/pod1/c1\n",
			map[string]string{"kubepods/pod1/c1/memory.max": "134217728\n", "memory.max": "999"}, 128 << 20},
		{"v2 in a cgroup namespace", "0::/\n", map[string]string{"memory.max": "134217728\n"}, 128 << 20},
		{"v2 without a limit", "0::/c1\n", map[string]string{"c1/memory.max": "max\n"}, 0},
		{"v1 memory controller", "4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n",
			map[string]string{"memory/docker/abc/memory.limit_in_bytes": "268435456\n"}, 256 << 20},
		{"v1 without a limit", "4:memory:/x\n", map[string]string{"memory/x/memory.limit_in_bytes": "9223372036854771712\n"}, 0},
		{"hybrid: v1 controller, empty v2 line", "4:memory:/x\n0::/\n",
			map[string]string{"memory/x/memory.limit_in_bytes": "67108864\n"}, 64 << 20},
		{"v1 at the mount root", "4:memory:/docker/abc\n", map[string]string{"memory/memory.limit_in_bytes": "67108864"}, 64 << 20},
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
				if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			self := filepath.Join(t.TempDir(), "cgroup")
			if err := os.WriteFile(self, []byte(tt.self), 0o600); err != nil {
				t.Fatal(err)
			}
			if got := cgroupMemoryLimit(self, root); got != tt.want {
				t.Errorf("got %d; want %d", got, tt.want)
			}
		})
	}
}
