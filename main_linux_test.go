package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// mainArgsEnv carries the arguments for main in the copy of the test binary
// that TestDaemonSurvivesClosedStderr starts, one per line.
const mainArgsEnv = "EP_TEST_MAIN_ARGS"

// TestDaemonSurvivesClosedStderr runs main in a copy of the test binary
// whose stderr is a pipe, closes the pipe's reading end, makes the daemon
// log, and checks that it still serves and then stops cleanly on SIGTERM:
// a log shipper that goes away must not take the node's API path with it
// (Go's default for a write to a closed stderr is death by SIGPIPE).
func TestDaemonSurvivesClosedStderr(t *testing.T) {
	if args := os.Getenv(mainArgsEnv); args != "" {
		os.Args = append([]string{"extractedprism"}, strings.Split(args, "\n")...)
		main()
		return
	}
	bindPort, healthPort := freePort(t), freePort(t)
	args := []string{
		"--endpoints", deadAddr(t), "--enable-discovery=false", "--log-level", "debug",
		"--bind-port", strconv.Itoa(bindPort), "--health-port", strconv.Itoa(healthPort),
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestDaemonSurvivesClosedStderr$", "-test.v")
	cmd.Env = append(os.Environ(), mainArgsEnv+"="+strings.Join(args, "\n"))
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	logs, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	first, err := bufio.NewReader(logs).ReadString('\n')
	if err != nil {
		t.Fatalf("first log line: %v", err)
	}
	if !strings.Contains(first, `"msg":"starting"`) {
		t.Errorf("first log line: got %q; want the start-up line", first)
	}
	_ = logs.Close() // the log reader goes away

	// Each client finds no upstream, which the daemon logs at debug level
	// to the closed pipe.
	healthz := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(healthPort)) + "/healthz"
	for range 3 {
		if c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(bindPort)), 5*time.Second); err == nil {
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			_, _ = c.Read(make([]byte, 1))
			_ = c.Close()
		}
	}
	waitFor(t, "/healthz after logging to a closed stderr", func() bool {
		code, _ := httpGet(healthz)
		return code == http.StatusOK
	})
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	if exit, ok := errors.AsType[*exec.ExitError](err); ok {
		t.Fatalf("daemon ended with %v after its stderr closed; want a clean exit on SIGTERM\n%s", exit, stdout.String())
	}
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout.String(), "--- PASS: TestDaemonSurvivesClosedStderr") {
		t.Errorf("the copy did not run main:\n%s", stdout.String())
	}
}
