package main

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"
)

// tableCells splits a table writeUpstreamTable wrote into rows of cells:
// tabwriter puts at least two spaces between columns, and no cell here
// holds two spaces in a row.
func tableCells(t *testing.T, table string) [][]string {
	t.Helper()
	var rows [][]string
	for line := range strings.Lines(table) {
		rows = append(rows, regexp.MustCompile(` {2,}`).Split(strings.TrimSuffix(line, "\n"), -1))
	}
	return rows
}

var tableHeader = []string{"UPSTREAM", "SOURCES", "HEALTH", "STREAK", "READY", "RTT", "TIER", "CONNS", "DRAIN", "LAST CHECK", "LAST ERROR"}

func TestWriteUpstreamTable(t *testing.T) {
	checked := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	until := checked.Add(30 * time.Second)
	st := []upstreamStatus{
		{Address: "10.0.0.1:6443", Sources: []string{"static", "kubernetes"}, Healthy: true, Ready: new(true),
			RTTSeconds: new(0.0012345), Tier: new(0), Connections: 3, LastCheck: &checked},
		{Address: "10.0.0.2:6443", Sources: []string{"kubernetes"}, FailStreak: 2, Ready: new(false), ReadyPending: true,
			Connections: 1, Draining: true, DrainDeadline: &until, LastCheck: &checked,
			LastError: "dial tcp 10.0.0.2:6443: connect: connection refused"},
		{Address: "[fd00::3]:6443", Ready: new(true), AwaitingProbe: true, Tier: new(1), Draining: true},
		{Address: "10.0.0.4:6443", Ready: new(false)},
		{Address: "10.0.0.5:6443"}, // tcp mode, never checked: a dash for every empty cell
	}
	want := [][]string{
		tableHeader,
		{"10.0.0.1:6443", "static,kubernetes", "healthy", "0", "ready", "1.23ms", "0", "3", "-", "2026-03-01T12:00:00Z", "-"},
		{"10.0.0.2:6443", "kubernetes", "unhealthy", "2", "pending", "-", "-", "1", "until 2026-03-01T12:00:30Z",
			"2026-03-01T12:00:00Z", "dial tcp 10.0.0.2:6443: connect: connection refused"},
		{"[fd00::3]:6443", "-", "unhealthy", "0", "ready-awaiting-probe", "-", "1", "0", "draining", "-", "-"},
		{"10.0.0.4:6443", "-", "unhealthy", "0", "not-ready", "-", "-", "0", "-", "-", "-"},
		{"10.0.0.5:6443", "-", "unhealthy", "0", "-", "-", "-", "0", "-", "-", "-"},
	}
	var out bytes.Buffer
	if err := writeUpstreamTable(&out, st); err != nil {
		t.Fatal(err)
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
	lines := strings.Split(out.String(), "\n")
	for _, col := range []string{"HEALTH", "DRAIN", "LAST ERROR"} {
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

// The document comes over the network, from whatever answers on the
// address: its text is cleaned before it reaches a terminal, so it can
// neither send escapes nor forge rows.
func TestStatusCleansHostileDocument(t *testing.T) {
	longError := "boom\r\nfake row\tinjected" + strings.Repeat("x", 2*maxErrorText)
	doc, err := json.Marshal([]upstreamStatus{{
		Address:   "10.0.0.1:6443\x1b]0;owned\x07",
		Sources:   []string{"static\n10.6.6.6:6443", "kube\u202ernetes"},
		Healthy:   true,
		LastError: longError,
	}})
	if err != nil {
		t.Fatal(err)
	}
	out, err := runSub("status", []string{"--health-address", serveUpstreams(t, http.StatusOK, string(doc))}, nil)
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
		"0", "-", "-", "-", "0", "-", "-", cut}
	if !slices.Equal(rows[1], want) {
		t.Errorf("row: got %q; want %q", rows[1], want)
	}
}

// --json prints the daemon's document as it came, for a script to read.
func TestStatusJSONPassesDocumentThrough(t *testing.T) {
	doc := `[{"address":"10.0.0.1:6443","healthy":true,"added_in_a_later_version":{"x":1}}]` + "\n"
	out, err := runSub("status", []string{"--json", "--health-address", serveUpstreams(t, http.StatusOK, doc)}, nil)
	if err != nil || out != doc {
		t.Errorf("status --json: got %q, %v; want %q, nil", out, err, doc)
	}
}

func TestStatusFailures(t *testing.T) {
	for _, tt := range []struct {
		name, addr string
		want       string // in the error
	}{
		{"nothing listens", deadAddr(t), "connection refused"},
		{"not the daemon", serveUpstreams(t, http.StatusNotFound, "no"), "404 Not Found"},
		{"not JSON", serveUpstreams(t, http.StatusOK, "<html>"), "/upstreams: invalid character"},
	} {
		out, err := runSub("status", []string{"--health-address", tt.addr}, nil)
		if err == nil || !strings.HasPrefix(err.Error(), "status: ") || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: got %v; want a status error with %q", tt.name, err, tt.want)
		}
		if out != "" {
			t.Errorf("%s: output %q; want none", tt.name, out)
		}
	}
	if _, err := runSub("status", []string{"--no-such-flag"}, nil); err == nil {
		t.Error("status --no-such-flag: got nil error")
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
		if got := defaultHealthAddress(envOf(tt.env)); got != tt.want {
			t.Errorf("%v: got %s; want %s", tt.env, got, tt.want)
		}
	}
	// And status uses it.
	host, port, _ := net.SplitHostPort(serveUpstreams(t, http.StatusOK, "[]"))
	out, err := runSub("status", nil, map[string]string{"EP_BIND_ADDRESS": host, "EP_HEALTH_PORT": port})
	if err != nil || !reflect.DeepEqual(tableCells(t, out), [][]string{tableHeader}) {
		t.Errorf("status with the address from the environment: got %q, %v; want the header alone", out, err)
	}
}

// TestRunUpstreamsEndpointAndStatusCommand: a running daemon's /upstreams
// lists every upstream in order, and status renders it.
func TestRunUpstreamsEndpointAndStatusCommand(t *testing.T) {
	a, b := startUpstream(t, echo), startUpstream(t, echo)
	d := startDaemon(t, nil, "--endpoints", a.addr+","+b.addr)
	d.echoThrough(t, "hold")
	var st []upstreamStatus
	waitFor(t, "/upstreams to show both upstreams checked", func() bool {
		code, body := httpGet(d.healthBase + "/upstreams")
		if code != http.StatusOK {
			t.Fatalf("/upstreams: got %d; want 200", code)
		}
		if err := json.Unmarshal([]byte(body), &st); err != nil {
			t.Fatalf("/upstreams is not JSON: %v\n%s", err, body)
		}
		return len(st) == 2 && st[0].LastCheck != nil && st[1].LastCheck != nil
	})
	if st[0].Address > st[1].Address {
		t.Errorf("/upstreams: got %s before %s; want them ordered", st[0].Address, st[1].Address)
	}
	conns := 0
	for _, s := range st {
		if !s.Healthy || !slices.Equal(s.Sources, []string{"static"}) {
			t.Errorf("upstream %s: got %+v; want healthy, source static", s.Address, s)
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
		t.Fatalf("status: got\n%s\nwant the header and two rows", out)
	}
	for i, s := range st {
		if row := rows[i+1]; row[0] != s.Address || row[1] != "static" || row[2] != "healthy" {
			t.Errorf("status row %d: got %q; want %s, static, healthy", i+1, row, s.Address)
		}
	}
}
