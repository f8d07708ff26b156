package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode"

	"github.com/prometheus/client_golang/prometheus"
)

// tableCells splits the table writeStatus wrote, after its summary line,
// into rows of cells: tabwriter puts at least two spaces between columns,
// and no cell here holds two spaces in a row.
func tableCells(t *testing.T, out string) [][]string {
	t.Helper()
	_, table, _ := strings.Cut(out, "\n")
	var rows [][]string
	for line := range strings.Lines(table) {
		rows = append(rows, regexp.MustCompile(` {2,}`).Split(strings.TrimSuffix(line, "\n"), -1))
	}
	return rows
}

var tableHeader = []string{"UPSTREAM", "SOURCES", "STATE", "FOR", "STREAK", "RTT", "TIER", "CONNS", "LONG", "DRAIN", "LAST CHECK", "LAST ERROR"}

func TestWriteStatus(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) *time.Time { return new(now.Add(-d)) }
	doc := upstreamsDoc{Version: "extractedprism v1.2.3", HealthCheck: checkReadyz, UpstreamSelection: selectLatency,
		Summary: upstreamsSummary{Total: 5, Usable: 2, Healthy: 3, Ready: new(1)}, Upstreams: []upstreamStatus{
			{Address: "10.0.0.1:6443", Sources: []string{"static", "kubernetes"}, State: stateReady, StateSince: at(4*time.Minute + 2*time.Second),
				Healthy: true, Ready: new(true), RTTSeconds: new(0.0012345), Tier: new(0), Connections: 3, LongLived: 2, LastCheck: at(2 * time.Second)},
			{Address: "10.0.0.2:6443", Sources: []string{"kubernetes"}, State: stateDraining, StateSince: at(time.Second), FailStreak: 2,
				Connections: 1, Draining: true, DrainDeadline: new(now.Add(30 * time.Second)), LastCheck: at(3 * time.Second),
				LastError: "dial tcp 10.0.0.2:6443: connect: connection refused", LastErrorAt: at(3 * time.Second)},
			{Address: "[fd00::3]:6443", State: stateReady, Healthy: true, Ready: new(true), AwaitingProbe: true, Tier: new(1)},
			{Address: "10.0.0.4:6443", State: stateNotReady, StateSince: at(time.Minute), Healthy: true, Ready: new(false)},
			{Address: "10.0.0.5:6443", State: stateUnhealthy}, // never checked: a dash for every empty cell
		}}
	want := [][]string{
		tableHeader,
		{"10.0.0.1:6443", "static,kubernetes", "ready", "4m2s", "0", "1.23ms", "0", "3", "2", "-", "2s ago", "-"},
		{"10.0.0.2:6443", "kubernetes", "draining", "1s", "2", "-", "-", "1", "0", "ends in 30s", "3s ago",
			"dial tcp 10.0.0.2:6443: connect: connection refused (3s ago)"},
		{"[fd00::3]:6443", "-", "ready-awaiting-probe", "-", "0", "-", "1", "0", "0", "-", "-", "-"},
		{"10.0.0.4:6443", "-", "not-ready", "1m0s", "0", "-", "-", "0", "0", "-", "-", "-"},
		{"10.0.0.5:6443", "-", "unhealthy", "-", "0", "-", "-", "0", "0", "-", "-", "-"},
	}
	var out bytes.Buffer
	if err := writeStatus(&out, doc, now); err != nil {
		t.Fatal(err)
	}
	summary, _, _ := strings.Cut(out.String(), "\n")
	if want := "extractedprism v1.2.3: 2 of 5 upstreams usable (3 healthy, 1 ready); health check readyz, selection latency"; summary != want {
		t.Errorf("summary: got %q; want %q", summary, want)
	}
	got := tableCells(t, out.String())
	if len(got) != len(want) {
		t.Fatalf("rows: got %d; want %d:\n%s", len(got), len(want), out.String())
	}
	for i := range want {
		if !slices.Equal(got[i], want[i]) {
			t.Errorf("row %d: got %q; want %q", i, got[i], want[i])
		}
	}
	// The columns line up: every cell of a column starts where its
	// header does.
	lines := strings.Split(out.String(), "\n")[1:]
	for _, col := range []string{"STATE", "DRAIN", "LAST ERROR"} {
		at := strings.Index(lines[0], col)
		for i, line := range lines[1 : len(lines)-1] {
			if at >= len(line) || line[at-1] != ' ' || line[at] == ' ' {
				t.Errorf("row %d: column %s does not start at %d:\n%s", i+1, col, at, out.String())
			}
		}
	}
}

// serveUpstreams serves body as /upstreams with status code, and returns
// the server's host:port.
func serveUpstreams(t *testing.T, code int, body string) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /upstreams", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(code)
		_, _ = w.Write([]byte(body))
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func docJSON(t *testing.T, doc upstreamsDoc) string {
	t.Helper()
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The document comes over the network, from whatever answers on the
// address: its text is cleaned before it reaches a terminal, so it can
// neither send escapes nor forge rows.
func TestStatusCleansHostileDocument(t *testing.T) {
	longError := "boom\r\nfake row\tinjected" + strings.Repeat("x", 2*maxErrorText)
	doc := docJSON(t, upstreamsDoc{Version: "v\x1b[2J", HealthCheck: "tcp", Summary: upstreamsSummary{Total: 1, Usable: 1, Healthy: 1},
		Upstreams: []upstreamStatus{{
			Address: "10.0.0.1:6443\x1b]0;owned\x07", Sources: []string{"static\n10.6.6.6:6443", "kube\u202ernetes"},
			State: stateHealthy, Healthy: true, LastError: longError,
		}}})
	out, err := runSub("status", []string{"--health-address", serveUpstreams(t, http.StatusOK, doc)}, nil)
	if err != nil {
		t.Fatalf("status: got %v; want nil", err)
	}
	for i, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		for _, r := range line {
			if !unicode.IsPrint(r) {
				t.Errorf("line %d: got the unprintable %U; want none:\n%q", i, r, line)
			}
		}
	}
	rows := tableCells(t, out)
	if len(rows) != 2 {
		t.Fatalf("rows: got %d; want the header and one row:\n%s", len(rows), out)
	}
	cut := "boom\uFFFD\uFFFDfake row\uFFFDinjected" + strings.Repeat("x", maxErrorText-len("boom\r\nfake row\tinjected")) + "..."
	want := []string{"10.0.0.1:6443\uFFFD]0;owned\uFFFD", "static\uFFFD10.6.6.6:6443,kube\uFFFDrnetes", "healthy",
		"-", "0", "-", "-", "0", "0", "-", "-", cut}
	if !slices.Equal(rows[1], want) {
		t.Errorf("row: got %q; want %q", rows[1], want)
	}
}

// --json prints the daemon's document as it came, for a script to read,
// with the fields a later version added.
func TestStatusJSONPassesDocumentThrough(t *testing.T) {
	doc := `{"version":"v","health_check":"tcp","summary":{"total":1,"usable":1,"healthy":1},` +
		`"upstreams":[{"address":"10.0.0.1:6443","state":"healthy","healthy":true,"added_in_a_later_version":{"x":1}}]}` + "\n"
	out, err := runSub("status", []string{"--json", "--health-address", serveUpstreams(t, http.StatusOK, doc)}, nil)
	if err != nil || out != doc {
		t.Errorf("status --json: got %q, %v; want %q, nil", out, err, doc)
	}
}

// TestStatusExitCodes: 0 when every upstream is in its good state, 1 when
// one is not but another is usable, 2 when none is usable, 3 when the
// daemon cannot be asked; --json exits the same way.
func TestStatusExitCodes(t *testing.T) {
	up := func(state string, healthy bool) upstreamStatus {
		return upstreamStatus{Address: "10.0.0.1:6443", State: state, Healthy: healthy, Draining: state == stateDraining}
	}
	doc := func(usable int, states ...upstreamStatus) string {
		d := newUpstreamsDoc(&config{HealthCheck: checkTCP}, append([]upstreamStatus{}, states...))
		if d.Summary.Usable != usable {
			t.Fatalf("%d usable of %v; want %d", d.Summary.Usable, states, usable)
		}
		return docJSON(t, d)
	}
	for _, tt := range []struct {
		name, addr string
		code       int
		want       string // in the error
	}{
		{"all ready", serveUpstreams(t, http.StatusOK, doc(2, up(stateReady, true), up(stateHealthy, true))), statusGood, ""},
		{"one not ready", serveUpstreams(t, http.StatusOK, doc(2, up(stateReady, true), up(stateNotReady, true))), statusDegraded, "degraded: 10.0.0.1:6443 is not-ready"},
		{"one draining", serveUpstreams(t, http.StatusOK, doc(1, up(stateReady, true), up(stateDraining, true))), statusDegraded, "is draining"},
		{"none usable", serveUpstreams(t, http.StatusOK, doc(0, up(stateUnhealthy, false))), statusNone, "no upstream usable of 1"},
		{"no upstreams", serveUpstreams(t, http.StatusOK, doc(0)), statusNone, "no upstream usable of 0"},
		{"nothing listens", deadAddr(t), statusUnknown, "connection refused"},
		{"not the daemon", serveUpstreams(t, http.StatusNotFound, "no"), statusUnknown, "404 Not Found"},
		{"not JSON", serveUpstreams(t, http.StatusOK, "<html>"), statusUnknown, "/upstreams: invalid character"},
		{"an array, as before", serveUpstreams(t, http.StatusOK, "[]"), statusUnknown, "/upstreams: json: cannot unmarshal array"},
	} {
		for _, extra := range [][]string{nil, {"--json"}} {
			_, err := runSub("status", append([]string{"--health-address", tt.addr}, extra...), nil)
			if code := exitCode(err); code != tt.code || tt.code == statusGood && err != nil {
				t.Errorf("%s %v: exit code %d (%v); want %d", tt.name, extra, code, err, tt.code)
			}
			if tt.want != "" && (err == nil || !strings.HasPrefix(err.Error(), "status: ") || !strings.Contains(err.Error(), tt.want)) {
				t.Errorf("%s %v: got %v; want a status error with %q", tt.name, extra, err, tt.want)
			}
		}
	}
	for _, args := range [][]string{{"--no-such-flag"}, {"extra"}, {"--env-file", t.TempDir() + "/missing.env"}} {
		if _, err := runSub("status", args, nil); exitCode(err) != statusUnknown {
			t.Errorf("status %v: got %v; want exit code %d", args, err, statusUnknown)
		}
	}
}

// TestStatusHelp: --help prints the daemon's flag style and the exit codes.
func TestStatusHelp(t *testing.T) {
	out, err := runSub("status", []string{"--help"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Usage: extractedprism status [flags]", "  --health-address host:port  ", "  --json  Print",
		"  --env-file string  systemd EnvironmentFile", "(default " + defaultEnvFile + ")", "2 no upstream usable"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
}

// Without --health-address, status finds the health server where the
// daemon's own variables put it, so it works in the daemon's container
// unchanged; a wildcard address is dialled on loopback.
func TestStatusDefaultAddress(t *testing.T) {
	for _, tt := range []struct {
		env  map[string]string
		want string
	}{
		{nil, "127.0.0.1:7446"},
		{map[string]string{"EP_BIND_ADDRESS": "10.0.0.5"}, "10.0.0.5:7446"},
		{map[string]string{"EP_BIND_ADDRESS": "10.0.0.5", "EP_HEALTH_BIND_ADDRESS": "10.0.0.6"}, "10.0.0.6:7446"},
		{map[string]string{"EP_HEALTH_BIND_ADDRESS": "fd00::1", "EP_HEALTH_PORT": "9000"}, "[fd00::1]:9000"},
		{map[string]string{"EP_BIND_ADDRESS": "0.0.0.0"}, "127.0.0.1:7446"},
		{map[string]string{"EP_HEALTH_BIND_ADDRESS": "::"}, "[::1]:7446"},
		{map[string]string{"EP_HEALTH_BIND_ADDRESS": "", "EP_BIND_ADDRESS": "::1"}, "[::1]:7446"},
	} {
		if got, _, err := parseStatusFlags([]string{"--env-file="}, envOf(tt.env), nil); got != tt.want || err != nil {
			t.Errorf("%v: got %s, %v; want %s", tt.env, got, err, tt.want)
		}
	}
	// And status uses it, from the environment.
	host, port, _ := net.SplitHostPort(serveUpstreams(t, http.StatusOK, docJSON(t, newUpstreamsDoc(&config{HealthCheck: checkTCP}, []upstreamStatus{}))))
	out, err := runSub("status", []string{"--env-file", ""}, map[string]string{"EP_BIND_ADDRESS": host, "EP_HEALTH_PORT": port})
	if exitCode(err) != statusNone || len(tableCells(t, out)) != 1 {
		t.Errorf("status with the address from the environment: got %q, %v; want the header alone, exit %d", out, err, statusNone)
	}
}

// TestStatusReadsEnvironmentFile: the systemd example's EnvironmentFile
// tells status where the daemon listens; the environment wins over it, and
// --health-address over both.
func TestStatusReadsEnvironmentFile(t *testing.T) {
	host, port, _ := net.SplitHostPort(serveUpstreams(t, http.StatusOK, docJSON(t, newUpstreamsDoc(&config{HealthCheck: checkTCP}, []upstreamStatus{}))))
	path := t.TempDir() + "/extractedprism.env"
	text := "# comment\n; another\nEP_ENDPOINTS=192.0.2.11:6443\nEP_HEALTH_BIND_ADDRESS=\"" + host + "\"\n  EP_HEALTH_PORT = '" + port + "'\nOTHER=1\n"
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	vars, err := readEnvFile(path)
	if err != nil || vars["EP_HEALTH_BIND_ADDRESS"] != host || vars["EP_HEALTH_PORT"] != port || len(vars) != 3 {
		t.Fatalf("readEnvFile: got %v, %v", vars, err)
	}
	if _, err := runSub("status", []string{"--env-file", path}, nil); exitCode(err) != statusNone {
		t.Errorf("status from the file: got %v; want the daemon reached (exit %d)", err, statusNone)
	}
	dead := deadAddr(t)
	_, deadPort, _ := net.SplitHostPort(dead)
	if _, err := runSub("status", []string{"--env-file", path}, map[string]string{"EP_HEALTH_PORT": deadPort}); exitCode(err) != statusUnknown {
		t.Errorf("status with EP_HEALTH_PORT over the file: got %v; want the dead port tried (exit %d)", err, statusUnknown)
	}
	if _, err := runSub("status", []string{"--env-file", path, "--health-address", dead}, nil); exitCode(err) != statusUnknown {
		t.Errorf("status --health-address over the file: got %v; want exit %d", err, statusUnknown)
	}
}

// TestRunUpstreamsEndpointAndStatusCommand: a running daemon's /upstreams
// lists every upstream in order with its state and the summary, and
// status renders it and exits 0.
func TestRunUpstreamsEndpointAndStatusCommand(t *testing.T) {
	a, b := startUpstream(t, echo), startUpstream(t, echo)
	d := startDaemon(t, nil, "--endpoints", a.addr+","+b.addr)
	d.echoThrough(t, "hold")
	var doc upstreamsDoc
	waitFor(t, "/upstreams to show both upstreams checked", func() bool {
		code, body := httpGet(d.healthBase + "/upstreams")
		if code != http.StatusOK {
			t.Fatalf("/upstreams: got %d; want 200", code)
		}
		if err := json.Unmarshal([]byte(body), &doc); err != nil {
			t.Fatalf("/upstreams is not the document: %v\n%s", err, body)
		}
		st := doc.Upstreams
		return len(st) == 2 && st[0].LastCheck != nil && st[1].LastCheck != nil
	})
	st := doc.Upstreams
	if doc.Version != versionLine() || doc.HealthCheck != checkTCP || doc.UpstreamSelection != selectRandom ||
		doc.Summary != (upstreamsSummary{Total: 2, Usable: 2, Healthy: 2}) {
		t.Errorf("/upstreams: got %+v; want the version, tcp, random, 2 of 2 usable", doc)
	}
	if st[0].Address > st[1].Address {
		t.Errorf("/upstreams: got %s before %s; want them ordered", st[0].Address, st[1].Address)
	}
	conns := 0
	for _, s := range st {
		if s.State != stateHealthy || s.StateSince == nil || !slices.Equal(s.Sources, []string{"static"}) {
			t.Errorf("upstream %s: got %+v; want healthy since its start, source static", s.Address, s)
		}
		conns += s.Connections
	}
	if conns != 1 {
		t.Errorf("connections across upstreams: got %d; want 1", conns)
	}
	out, err := runSub("status", []string{"--health-address", strings.TrimPrefix(d.healthBase, "http://")}, nil)
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	rows := tableCells(t, out)
	if len(rows) != 3 || !slices.Equal(rows[0], tableHeader) {
		t.Fatalf("status: got\n%s\nwant the summary, the header and two rows", out)
	}
	for i, s := range st {
		if row := rows[i+1]; row[0] != s.Address || row[1] != "static" || row[2] != "healthy" {
			t.Errorf("status row %d: got %q; want %s, static, healthy", i+1, row, s.Address)
		}
	}
}

// TestUpstreamsShowRecoveryTruthfully: an upstream that failed and came
// back shows healthy since its return and no longer its old error; while
// it is down it shows the error with its time.
func TestUpstreamsShowRecoveryTruthfully(t *testing.T) {
	var failing atomic.Bool
	check := func(context.Context, string) checkResult {
		if failing.Load() {
			return checkResult{err: errors.New("connect: connection refused")}
		}
		return checkResult{rtt: time.Millisecond}
	}
	pl := newPool(slog.New(slog.DiscardHandler), newMetrics(prometheus.NewRegistry()), poolConfig{interval: 5 * time.Millisecond, timeout: time.Second}, check, randomSelector{})
	defer pl.close()
	pl.update([]string{"192.0.2.1:6443"})
	waitFor(t, "a first check", func() bool { return pl.describe(nil)[0].LastCheck != nil })
	began := pl.describe(nil)[0].StateSince
	failing.Store(true)
	waitFor(t, "the upstream excluded", func() bool { return !pl.ready() })
	down := pl.describe(nil)[0]
	if down.State != stateUnhealthy || down.LastError == "" || down.LastErrorAt == nil || !down.StateSince.After(*began) {
		t.Errorf("while down: got %+v; want unhealthy since its exclusion, with the error and its time", down)
	}
	failing.Store(false)
	waitFor(t, "the upstream back", pl.ready)
	waitFor(t, "a passed check after the return", func() bool { return pl.describe(nil)[0].LastError == "" })
	back := pl.describe(nil)[0]
	if back.State != stateHealthy || !back.StateSince.After(*down.StateSince) || back.LastErrorAt != nil {
		t.Errorf("after the return: got %+v; want healthy since then, no error", back)
	}
}
