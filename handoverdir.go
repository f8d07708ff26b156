package main

// The hand-over socket's directory, made and checked through descriptors.
// handover-dir runs as root on a path a kubelet or an operator names; by
// path, a symlink put in the directory's place, or swapped in between the
// check and the chown (renameat2 RENAME_EXCHANGE), would have root chown
// whatever it points to. Each component is opened without following a
// link and the chown and chmod land on the directory opened, so no later
// rename can redirect them, and a parent directory that a user other than
// root (or the daemon's own) could write is refused: such a user could put
// anything in the directory's place.

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// ownDir makes dir, the hand-over socket's directory, if missing, and
// checks that only this process's user can enter it: a directory of that
// user's is tightened to 0700, any other owner is an error.
func ownDir(dir string) error {
	f, st, err := openOwnDir(dir)
	if err != nil {
		return fmt.Errorf("hand-over socket directory: %w", err)
	}
	defer f.Close()
	mode := os.FileMode(st.Mode) & os.ModePerm
	switch {
	case int(st.Uid) != os.Geteuid():
		return fmt.Errorf("hand-over socket directory %s is owned by uid %d (mode %04o); want uid %d, this daemon's user, "+
			"so that no other user can take the node's listening sockets (extractedprism handover-dir sets it up)",
			dir, st.Uid, mode, os.Geteuid())
	case mode&0o077 != 0:
		if err := f.Chmod(0o700); err != nil {
			return fmt.Errorf("hand-over socket directory: %w", err)
		}
	}
	return nil
}

// openOwnDir opens dir, made mode 0700 if missing, in a parent directory
// that no user but root and this process's can write, following no
// symbolic link on the way. It returns the directory with its stat.
func openOwnDir(dir string) (*os.File, *unix.Stat_t, error) {
	parent, name := filepath.Split(filepath.Clean(dir))
	if name == "" || name == "." || name == ".." {
		return nil, nil, fmt.Errorf("%s names no directory to make", dir)
	}
	pfd, err := openNoFollow(parent)
	if err != nil {
		return nil, nil, err
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return nil, nil, fmt.Errorf("stat %s: %w", parent, err)
	}
	if (st.Uid != 0 && int(st.Uid) != os.Geteuid()) || st.Mode&0o022 != 0 {
		return nil, nil, fmt.Errorf("parent directory %s is owned by uid %d, mode %04o; want one that no user but root and uid %d (this process's) can write, "+
			"else another can put a link or a directory of theirs in place of %s", parent, st.Uid, st.Mode&0o7777, os.Geteuid(), name)
	}
	if err := unix.Mkdirat(pfd, name, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, nil, fmt.Errorf("mkdir %s: %w", dir, err)
	}
	fd, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
		return nil, nil, fmt.Errorf("%s is not a directory (%w); want a directory, not a link to one", dir, err)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("open %s: %w", dir, err)
	}
	f := os.NewFile(uintptr(fd), dir)
	if err := unix.Fstat(fd, &st); err != nil {
		_ = f.Close()
		return nil, nil, fmt.Errorf("stat %s: %w", dir, err)
	}
	return f, &st, nil
}

// openNoFollow opens the directory path one component at a time, each
// relative to the one before and none a symbolic link. Not openat2's
// RESOLVE_NO_SYMLINKS: the walk gives the same guarantee on every kernel
// and system the daemon builds for, with one path through the code.
func openNoFollow(path string) (int, error) {
	path = filepath.Clean(path)
	start := "."
	if filepath.IsAbs(path) {
		start = "/"
	}
	fd, err := unix.Open(start, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", start, err)
	}
	walked := strings.TrimSuffix(start, ".")
	for name := range strings.SplitSeq(path, "/") {
		if name == "" || name == "." {
			continue
		}
		walked = filepath.Join(walked, name)
		next, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		_ = unix.Close(fd)
		if err != nil {
			return -1, fmt.Errorf("open %s without following links: %w", walked, err)
		}
		fd = next
	}
	return fd, nil
}

// handoverDir is "extractedprism handover-dir": run as root before a daemon
// that runs as another user, it makes the hand-over socket's directory
// that user's, mode 0700, as the daemon wants it. A kubelet creates a
// hostPath directory root's, mode 0755.
func handoverDir(args []string, stdout io.Writer) error {
	fl := flag.NewFlagSet("extractedprism handover-dir", flag.ContinueOnError)
	fl.SetOutput(stdout)
	uid := fl.Int("uid", -1, "user ID the daemon runs as; required")
	gid := fl.Int("gid", -1, "group ID the daemon runs as; required")
	fl.Usage = func() {
		fmt.Fprintln(stdout, "Usage: extractedprism handover-dir --uid UID --gid GID DIRECTORY")
		fl.PrintDefaults()
	}
	if err := fl.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fl.NArg() != 1 || *uid < 0 || *gid < 0 {
		return errors.New("handover-dir: want --uid, --gid and one directory")
	}
	dir := fl.Arg(0)
	f, _, err := openOwnDir(dir)
	if err != nil {
		return fmt.Errorf("handover-dir: %w", err)
	}
	defer f.Close()
	// Mode first: root owns a directory the kubelet made, and chmod needs
	// no capability on one's own.
	if err := errors.Join(f.Chmod(0o700), f.Chown(*uid, *gid)); err != nil {
		return fmt.Errorf("handover-dir: %w", err)
	}
	fmt.Fprintf(stdout, "extractedprism handover-dir: %s is owned by %d:%d, mode 0700\n", dir, *uid, *gid)
	return nil
}
