package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// timeWaitTo counts TIME_WAIT sockets in /proc/net/tcp that involve port.
func timeWaitTo(t *testing.T, port int) int {
	t.Helper()
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		t.Skipf("no /proc/net/tcp: %v", err)
	}
	defer f.Close()
	hexPort := fmt.Sprintf(":%04X", port)
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		// local_address rem_address st ...; TIME_WAIT is state 06.
		if len(fields) > 3 && fields[3] == "06" &&
			(strings.HasSuffix(fields[1], hexPort) || strings.HasSuffix(fields[2], hexPort)) {
			n++
		}
	}
	return n
}

func TestTCPCheckLeavesNoTimeWait(t *testing.T) {
	up := startUpstream(t, echo)
	port := up.ln.Addr().(*net.TCPAddr).Port
	// Connections of earlier tests to an earlier listener on the same port
	// may still linger in TIME_WAIT; they only ever go away.
	before := timeWaitTo(t, port)
	for range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		res := tcpCheck(ctx, up.addr)
		cancel()
		if res.err != nil {
			t.Fatal(res.err)
		}
		if res.rtt <= 0 || res.probed {
			t.Errorf("check result: got %+v; want a connect time and no probe", res)
		}
	}
	waitFor(t, "the upstream to see every check end", func() bool { return up.openCount() == 0 })
	if n := timeWaitTo(t, port); n > before {
		t.Errorf("TIME_WAIT sockets after 20 checks: got %d; want at most the %d from before", n, before)
	}
}

func TestTCPCheckFailsOnRefusedAndTimeout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if res := tcpCheck(ctx, deadAddr(t)); res.err == nil {
		t.Error("check of a closed port: got nil error")
	}
	expired, cancel2 := context.WithTimeout(context.Background(), 0)
	defer cancel2()
	if res := tcpCheck(expired, "127.0.0.1:1"); res.err == nil {
		t.Error("check with an expired deadline: got nil error")
	}
}
