// Package proc starts and stops the child processes of the end-to-end tests
// (etcd, kube-apiserver, extractedprism) with their output in log files.
//
// Every child gets SIGKILL from the kernel when the test process dies
// (PR_SET_PDEATHSIG), so a test that panics or is killed by `go test
// -timeout` leaves no servers running. The kernel sends that signal when the
// *thread* that forked the child exits, not the process, and Go retires
// threads whose locked goroutine ends (the netns dialer does that when it
// cannot leave a namespace). So all children are forked from one goroutine
// locked to its own thread that lives as long as the process.
package proc

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Process is one running child.
type Process struct {
	Name    string // for messages
	LogPath string // stdout and stderr, combined

	cmd  *exec.Cmd
	done chan struct{} // closed once the process has been waited for
	err  error         // the Wait result, set before done is closed
	log  *os.File
}

var (
	spawnOnce sync.Once
	spawnReqs chan spawnReq
)

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

// spawner forks every child from a thread that never exits. See the
// package comment.
func spawner(reqs <-chan spawnReq) {
	runtime.LockOSThread()
	for r := range reqs {
		r.done <- r.cmd.Start()
	}
}

// Start runs argv with env appended to the test's environment, its output
// appended to logPath.
func Start(name, logPath string, argv []string, env []string) (*Process, error) {
	if len(argv) == 0 {
		return nil, errors.New("empty command")
	}
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(log, "=== %s: %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(argv, " "))
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout = log
	cmd.Stderr = log
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}

	spawnOnce.Do(func() {
		spawnReqs = make(chan spawnReq)
		go spawner(spawnReqs)
	})
	done := make(chan error, 1)
	spawnReqs <- spawnReq{cmd: cmd, done: done}
	if err := <-done; err != nil {
		log.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{Name: name, LogPath: logPath, cmd: cmd, done: make(chan struct{}), log: log}
	go p.wait()
	return p, nil
}

func (p *Process) wait() {
	p.err = p.cmd.Wait()
	fmt.Fprintf(p.log, "=== %s: exited: %v\n", time.Now().Format(time.RFC3339Nano), p.err)
	p.log.Close()
	close(p.done)
}

// Pid is the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed once the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited, and how.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// Signal sends sig unless the process has already exited.
func (p *Process) Signal(sig os.Signal) error {
	if exited, _ := p.Exited(); exited {
		return nil
	}
	return p.cmd.Process.Signal(sig)
}

// Kill sends SIGKILL and waits for the exit.
func (p *Process) Kill() {
	_ = p.Signal(syscall.SIGKILL)
	<-p.done
}

// Stop sends SIGTERM, waits up to grace for the exit, then kills.
func (p *Process) Stop(grace time.Duration) error {
	_ = p.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
		return p.err
	case <-t.C:
		p.Kill()
		return fmt.Errorf("%s did not stop within %s after SIGTERM; killed", p.Name, grace)
	}
}

// Tail returns up to n bytes from the end of the log, for error messages.
func (p *Process) Tail(n int) string {
	return TailFile(p.LogPath, n)
}

// TailFile returns up to n bytes from the end of a file.
func TailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
