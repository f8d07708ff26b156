package main

// Hostile paths for handover-dir, which runs as root: a directory or a
// link of another user's on the way to the hand-over directory, and a link
// swapped in for the directory while it works.

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// hostileUID is the other user of the hostile tests: nobody, the UID the
// chart ran as before, which other pods on a node may share.
const hostileUID = 65534

// ownerMode returns path's owner and mode, not following a link.
func ownerMode(t *testing.T, path string) (uint32, os.FileMode) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Uid, fi.Mode()
}

// TestHostileHandoverDirSymlink: handover-dir as root must not chown or
// chmod anything but a directory it made or found in a parent only root
// can write. A parent of nobody's holds a link to a root-owned directory,
// in place of the directory and on the way to it; a parent nobody can
// write holds a directory; and a link is swapped for the directory
// (renameat2 RENAME_EXCHANGE) while handover-dir runs, again and again.
func TestHostileHandoverDirSymlink(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("handover-dir's chown and another user's directory need root")
	}
	base := t.TempDir()
	target := filepath.Join(base, "root-owned")
	evil := filepath.Join(base, "nobodys")
	wide := filepath.Join(base, "wide")
	for dir, mode := range map[string]os.FileMode{target: 0o755, evil: 0o755, wide: 0o777} {
		if err := errors.Join(os.Mkdir(dir, mode), os.Chmod(dir, mode)); err != nil {
			t.Fatal(err)
		}
	}
	if err := errors.Join(os.Mkdir(filepath.Join(target, "run"), 0o755), os.Chown(evil, hostileUID, hostileUID),
		os.Symlink(target, filepath.Join(evil, "link")), os.Mkdir(filepath.Join(wide, "run"), 0o755),
		os.Mkdir(filepath.Join(evil, "run"), 0o755)); err != nil {
		t.Fatal(err)
	}
	args := func(dir string) []string { return []string{"--uid", "65534", "--gid", "65534", dir} }
	cases := map[string]string{
		"link in place":        filepath.Join(evil, "link"),
		"link on the way":      filepath.Join(evil, "link", "run"),
		"in nobody's parent":   filepath.Join(evil, "run"),
		"in a writable parent": filepath.Join(wide, "run"),
	}
	refused := 0
	for name, dir := range cases {
		err := handoverDir(args(dir), io.Discard)
		if err != nil {
			refused++
		}
		t.Logf("%s: %s: %v", name, dir, err)
		if err == nil {
			t.Errorf("%s: handover-dir %s: no error; want it refused", name, dir)
		}
	}
	for _, p := range []string{target, filepath.Join(target, "run")} {
		if uid, mode := ownerMode(t, p); uid != 0 || mode.Perm() != 0o755 {
			t.Errorf("%s after the attacks: uid %d, mode %v; want root's, 0755, untouched", p, uid, mode)
		}
	}
	hits, tried, chowned := raceHandoverDir(t, base)
	t.Logf("figures: %d of %d hostile paths refused; swap race: %d runs, %d chowned the directory, %d touched the root-owned setuid file",
		refused, len(cases), tried, chowned, hits)
	if hits != 0 {
		t.Errorf("swap race: handover-dir changed the root-owned setuid file %d times of %d", hits, tried)
	}
	if chowned == 0 {
		t.Errorf("swap race: handover-dir never chowned the directory in %d runs; want it to, between swaps", tried)
	}
}

// raceHandoverDir runs handover-dir on base/race/run while swapRun swaps
// that directory with a link to a root-owned setuid file, for up to
// 100,000 runs or 2 s: by path, about one run in 100 chmodded the file.
// It returns how many runs changed the file, how many ran, and how many
// succeeded, each leaving the real directory nobody's.
func raceHandoverDir(t *testing.T, base string) (hits, tried, chowned int) {
	parent := filepath.Join(base, "race")
	dir, swap, file := filepath.Join(parent, "run"), filepath.Join(parent, "swap"), filepath.Join(base, "setuid")
	if err := errors.Join(os.Mkdir(parent, 0o755), os.Mkdir(dir, 0o755), os.WriteFile(file, nil, 0o755),
		os.Chmod(file, os.ModeSetuid|0o755), os.Symlink(file, swap)); err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Go(func() { swapRun(&stop, dir, swap) })
	deadline := time.Now().Add(2 * time.Second)
	for ; tried < 100000 && time.Now().Before(deadline); tried++ {
		if err := handoverDir([]string{"--uid", "65534", "--gid", "65534", dir}, io.Discard); err == nil {
			chowned++
		}
		if uid, mode := ownerMode(t, file); uid != 0 || mode != os.ModeSetuid|0o755 {
			hits++
			_ = errors.Join(os.Chown(file, 0, 0), os.Chmod(file, os.ModeSetuid|0o755))
		}
	}
	stop.Store(true)
	wg.Wait()
	return hits, tried, chowned
}

// swapRun exchanges a and b, a directory and a link, until stop is set:
// what an attacker who can write their parent would do.
func swapRun(stop *atomic.Bool, a, b string) {
	for !stop.Load() {
		_ = unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE)
	}
}
