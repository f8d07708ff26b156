package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Socket activation as systemd runs it across restarts, with
// systemd-socket-activate (Debian's systemd package) in systemd's place:
// it opens the two listening sockets and execs a shell that holds them and
// starts the daemon again whenever it exits, as Restart=always does. Each
// start sets LISTEN_PID to the daemon's own pid, as systemd does between
// fork and exec. Sending the daemon SIGTERM is then `systemctl restart`.

// activationLoop is the holding shell's script; "$@" is the daemon's
// command line.
const activationLoop = `while :; do /bin/sh -c 'export LISTEN_PID=$$; exec "$0" "$@"' "$@"; done`

// activatedArgv wraps the daemon's command line in the socket holder.
func activatedArgv(args []string, bindPort, healthPort int) []string {
	return append([]string{"systemd-socket-activate",
		"--listen", "127.0.0.1:" + strconv.Itoa(bindPort), "--listen", "127.0.0.1:" + strconv.Itoa(healthPort),
		"--fdname", "extractedprism:extractedprism",
		"/bin/sh", "-c", activationLoop, "sh"}, args...)
}

// daemonChild is the running daemon under the socket holder, the holder's
// one child; 0 while none runs (between a stop and the next start).
func (d *Daemon) daemonChild() int {
	holder := d.proc.Pid()
	paths, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range paths {
		pid, err := strconv.Atoi(filepath.Base(p))
		if err != nil {
			continue
		}
		if running, ppid := procStat(pid); running && ppid == holder {
			return pid
		}
	}
	return 0
}

// stopActivated ends the holder, so nothing starts the daemon again, then
// stops the daemon with SIGTERM.
func (d *Daemon) stopActivated() error {
	child := d.daemonChild()
	d.proc.Kill()
	if child == 0 {
		return nil
	}
	if err := syscall.Kill(child, syscall.SIGTERM); err != nil {
		return nil //nolint:nilerr // it exited meanwhile
	}
	deadline := time.Now().Add(20 * time.Second)
	for processRunning(child) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(child, syscall.SIGKILL)
			return fmt.Errorf("extractedprism (pid %d) did not stop within 20s after SIGTERM; killed", child)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// processRunning reports whether pid exists and is not a zombie.
func processRunning(pid int) bool {
	running, _ := procStat(pid)
	return running
}

// procStat reads whether pid runs (exists, not a zombie) and its parent.
func procStat(pid int) (running bool, ppid int) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false, 0
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 2 {
		return false, 0
	}
	ppid, _ = strconv.Atoi(f[1])
	return f[0] != "Z", ppid
}
