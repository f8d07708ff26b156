package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// mainArgsEnv carries the arguments for main in the copy of the test binary
// that TestDaemonSurvivesClosedStderr starts, one per line.
const mainArgsEnv = "EP_TEST_MAIN_ARGS"

// passFDsEnv tells that copy how many sockets it was passed.
const passFDsEnv = "EP_TEST_PASSED_FDS"

// mainChild is main running in a copy of the test binary; see startMain.
type mainChild struct {
	cmd        *exec.Cmd
	stdout     bytes.Buffer
	logs       *bufio.Reader // the child's stderr
	closeLogs  func() error
	proxyAddr  string
	healthAddr string
	early      []string // log lines before the start-up line
}

// startMain runs main with args, plus listeners on free loopback ports and
// no discovery, in a copy of the test binary that runs only the test t
// (which must call runMainIfChild first), and waits for its start-up line.
func startMain(t *testing.T, args ...string) *mainChild {
	t.Helper()
	return startMainPassing(t, nil, args...)
}

// startMainPassing is startMain with passed as the child's listening
// sockets from 3 up, with the LISTEN_* variables a service manager sets.
func startMainPassing(t *testing.T, passed []*os.File, args ...string) *mainChild {
	t.Helper()
	mc, err := tryStartMain(t, func(cmd *exec.Cmd) {
		if len(passed) > 0 {
			cmd.ExtraFiles = passed
			cmd.Env = append(cmd.Env, passFDsEnv+"="+strconv.Itoa(len(passed)))
		}
	}, args...)
	if err != nil {
		t.Fatal(err)
	}
	return mc
}

// tryStartMain is startMain with adjust, if not nil, applied to the
// command before it starts. A child that logs no start-up line is waited
// for, and the error holds its log.
func tryStartMain(t *testing.T, adjust func(*exec.Cmd), args ...string) (*mainChild, error) {
	t.Helper()
	bindPort, healthPort := freePort(t), freePort(t)
	args = append([]string{"--enable-discovery=false", "--log-level", "debug",
		"--bind-port", strconv.Itoa(bindPort), "--health-port", strconv.Itoa(healthPort)}, args...)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	mc := &mainChild{
		proxyAddr:  net.JoinHostPort("127.0.0.1", strconv.Itoa(bindPort)),
		healthAddr: net.JoinHostPort("127.0.0.1", strconv.Itoa(healthPort)),
	}
	mc.cmd = exec.CommandContext(ctx, os.Args[0], "-test.run=^"+regexp.QuoteMeta(t.Name())+"$", "-test.v")
	mc.cmd.Env = append(os.Environ(), mainArgsEnv+"="+strings.Join(args, "\n"))
	if adjust != nil {
		adjust(mc.cmd)
	}
	mc.cmd.Stdout = &mc.stdout
	logs, err := mc.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	mc.logs, mc.closeLogs = bufio.NewReader(logs), logs.Close
	if err := mc.cmd.Start(); err != nil {
		return nil, err
	}
	// The start-up line, after what comes before it: warnings of ignored
	// settings, the sockets passed.
	var before []string
	for len(before) < 5 {
		line, err := mc.logs.ReadString('\n')
		if err != nil {
			werr := mc.cmd.Wait()
			return nil, fmt.Errorf("log line %d: %w; exit: %v; before it: %q", len(before)+1, err, werr, before)
		}
		if strings.Contains(line, `"msg":"starting"`) {
			mc.early = before
			return mc, nil
		}
		before = append(before, line)
	}
	_ = mc.cmd.Process.Kill()
	_ = mc.cmd.Wait()
	return nil, fmt.Errorf("no start-up line in the first log lines %q", before)
}

// logSeen returns a channel closed once the child logs a line containing
// text; the rest of its log is then read and dropped, so the child never
// blocks on a full pipe.
func (mc *mainChild) logSeen(text string) <-chan struct{} {
	seen := make(chan struct{})
	go func() {
		for {
			line, err := mc.logs.ReadString('\n')
			if err != nil {
				return
			}
			if strings.Contains(line, text) {
				close(seen)
				_, _ = io.Copy(io.Discard, mc.logs)
				return
			}
		}
	}()
	return seen
}

func (mc *mainChild) signal(t *testing.T, sig os.Signal) {
	t.Helper()
	if err := mc.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

// waitLog waits up to 10 s for seen, from logSeen, after what.
func waitLog(t *testing.T, seen <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-seen:
	case <-time.After(10 * time.Second):
		t.Fatalf("no log line within 10 s of %s", what)
	}
}

// stopCleanly sends SIGTERM and checks that the child ran main and exited 0.
func (mc *mainChild) stopCleanly(t *testing.T, after string) {
	t.Helper()
	mc.signal(t, syscall.SIGTERM)
	if err := mc.cmd.Wait(); err != nil {
		t.Fatalf("after %s, SIGTERM: got %v; want a clean exit\n%s", after, err, mc.stdout.String())
	}
	if !strings.Contains(mc.stdout.String(), "--- PASS: "+t.Name()) {
		t.Errorf("the copy did not run main:\n%s", mc.stdout.String())
	}
}

// runMainIfChild runs main and reports true in the copy startMain starts.
func runMainIfChild() bool {
	args := os.Getenv(mainArgsEnv)
	if args == "" {
		return false
	}
	// As a service manager does between fork and exec: LISTEN_PID names
	// the process the sockets are for, known only once it runs.
	if n := os.Getenv(passFDsEnv); n != "" {
		_ = os.Setenv("LISTEN_FDS", n)
		_ = os.Setenv("LISTEN_PID", strconv.Itoa(os.Getpid()))
	}
	// The harness's variables are not the daemon's, which warns of an EP_
	// variable no flag reads.
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "EP_TEST_") {
			_ = os.Unsetenv(name)
		}
	}
	os.Args = append([]string{"extractedprism"}, strings.Split(args, "\n")...)
	main()
	return true
}

// TestDaemonSurvivesClosedStderr closes the reading end of main's stderr,
// makes the daemon log, and checks that it still serves and then stops
// cleanly on SIGTERM: a log shipper that goes away must not take the
// node's API path with it (Go's default for a write to a closed stderr is
// death by SIGPIPE).
func TestDaemonSurvivesClosedStderr(t *testing.T) {
	if runMainIfChild() {
		return
	}
	mc := startMain(t, "--endpoints", deadAddr(t))
	_ = mc.closeLogs() // the log reader goes away

	// Each client finds no upstream, which the daemon logs at debug level
	// to the closed pipe.
	for range 3 {
		if c, err := net.DialTimeout("tcp", mc.proxyAddr, 5*time.Second); err == nil {
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			_, _ = c.Read(make([]byte, 1))
			_ = c.Close()
		}
	}
	waitFor(t, "/healthz after logging to a closed stderr", func() bool {
		code, _ := httpGet("http://" + mc.healthAddr + "/healthz")
		return code == http.StatusOK
	})
	mc.stopCleanly(t, "logging to a closed stderr")
}

// TestSecondSignalEndsShutdown: while the first SIGTERM's shutdown waits
// for a health client that never finishes its request, a second SIGTERM
// ends the process at once instead of being swallowed.
func TestSecondSignalEndsShutdown(t *testing.T) {
	if runMainIfChild() {
		return
	}
	mc := startMain(t, "--endpoints", deadAddr(t))
	slow, err := net.DialTimeout("tcp", mc.healthAddr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	// Half a request keeps the health server's shutdown waiting for up to
	// its 5 s grace period.
	if _, err := io.WriteString(slow, "GET /healthz HTTP/1.1\r\n"); err != nil {
		t.Fatal(err)
	}
	shuttingDown := mc.logSeen(`"msg":"shutting down"`)
	mc.signal(t, syscall.SIGTERM)
	waitLog(t, shuttingDown, "SIGTERM")
	exited := make(chan error, 1)
	go func() { exited <- mc.cmd.Wait() }()
	// The handler is gone soon after the shutdown starts; until the
	// process ends, signal it again every 100 ms, for at most 3 s (its
	// shutdown alone would take 5 s).
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(3 * time.Second)
	for {
		_ = mc.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			exit, ok := errors.AsType[*exec.ExitError](err)
			if !ok {
				t.Fatalf("after a second SIGTERM: got %v; want the process killed by it\n%s", err, mc.stdout.String())
			}
			if ws, _ := exit.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
				t.Errorf("after a second SIGTERM: process ended with %v; want killed by SIGTERM", exit)
			}
			return
		case <-deadline:
			t.Fatal("still running 3 s into its shutdown despite repeated SIGTERMs")
		case <-tick.C:
		}
	}
}

// TestHangupIsIgnored: SIGHUP, whose default action ends a process, is
// read by the run loop, which logs it; the daemon goes on proxying, and
// SIGTERM still stops it cleanly.
func TestHangupIsIgnored(t *testing.T) {
	if runMainIfChild() {
		return
	}
	up := startUpstream(t, echo)
	mc := startMain(t, "--endpoints", up.addr)
	logged := mc.logSeen(`"level":"WARN","msg":"SIGHUP ignored: the configuration is read only at start-up`)
	mc.signal(t, syscall.SIGHUP)
	mc.signal(t, syscall.SIGHUP)
	waitLog(t, logged, "SIGHUP")
	c := dialProxy(t, mc.proxyAddr)
	if err := roundTrip(c, []byte("after SIGHUP")); err != nil {
		t.Errorf("proxying after SIGHUP: %v", err)
	}
	if code, _ := httpGet("http://" + mc.healthAddr + "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz after SIGHUP: got %d; want 200", code)
	}
	mc.stopCleanly(t, "SIGHUP")
}

// TestMainExitStatus: main exits 0 when run succeeds and 1 when it fails,
// with run's error as the one line on stderr. The chart's pre-install hook
// runs "extractedprism check" and relies on both.
func TestMainExitStatus(t *testing.T) {
	if runMainIfChild() {
		return
	}
	for _, tt := range []struct {
		args           []string
		code           int
		stdout, stderr string
	}{
		{[]string{"check", "--endpoints", testEndpoint}, 0, "extractedprism check: configuration is valid\n", ""},
		{[]string{"check", "--endpoints", testEndpoint, "--health-port", "7445"}, 1, "",
			"extractedprism: --health-port (EP_HEALTH_PORT) must differ from --bind-port (EP_BIND_PORT): both are 7445\n"},
	} {
		cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^"+regexp.QuoteMeta(t.Name())+"$")
		cmd.Env = append(os.Environ(), mainArgsEnv+"="+strings.Join(tt.args, "\n"))
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil && cmd.ProcessState == nil {
			t.Fatal(err)
		}
		if got := cmd.ProcessState.ExitCode(); got != tt.code {
			t.Errorf("%q: exit status %d; want %d\n%s", tt.args, got, tt.code, stdout.String())
		}
		if !strings.Contains(stdout.String(), tt.stdout) || stderr.String() != tt.stderr {
			t.Errorf("%q: stdout %q, stderr %q; want stdout with %q, stderr %q", tt.args, stdout.String(), stderr.String(), tt.stdout, tt.stderr)
		}
	}
}

// TestRunExportsProcessMetrics checks the standard process_ and go_ series
// on /metrics against what the process is doing: the daemon runs in this
// test's process, so held connections show in its open descriptors and
// goroutines, and the descriptor limit is this process's.
func TestRunExportsProcessMetrics(t *testing.T) {
	// exhEcho, not echo: echo's io.Copy splices, and its pooled pipes would
	// come and go with the garbage collector while the test counts.
	up := startUpstream(t, exhEcho)
	d := startDaemon(t, nil, "--endpoints", up.addr)
	d.waitOK(t, "/readyz")
	// Earlier tests leave such pipes behind: a collection between the two
	// scrapes once took 556 descriptors away. Let them go first.
	quietCounts(t)
	_, before := httpGet(d.healthBase + "/metrics")
	const held = 5
	for range held {
		d.echoThrough(t, "held")
	}
	_, during := httpGet(d.healthBase + "/metrics")

	// Each held connection is a client socket here, two in the proxy and
	// one in the upstream, and two copy goroutines in the proxy.
	for _, tt := range []struct {
		series   string
		minDelta float64
	}{
		{"process_open_fds", 4 * held},
		{"go_goroutines", 2 * held},
	} {
		b, a := exhMetric(before, tt.series), exhMetric(during, tt.series)
		if b <= 0 || a-b < tt.minDelta {
			t.Errorf("%s: %v before and %v with %d connections held; want it positive and up by %v or more", tt.series, b, a, held, tt.minDelta)
		}
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if got := exhMetric(during, "process_max_fds"); got != float64(lim.Cur) {
		t.Errorf("process_max_fds %v; want the open-files limit %d", got, lim.Cur)
	}
	for _, series := range []string{"process_resident_memory_bytes", "process_cpu_seconds_total", "go_memstats_heap_inuse_bytes"} {
		if v := exhMetric(during, series); v <= 0 {
			t.Errorf("%s is %v; want a positive value", series, v)
		}
	}
}
