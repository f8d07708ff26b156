package main

// Hostile answers to "extractedprism status": whatever listens on the
// health address, the daemon or not, writes what the operator's terminal
// shows and decides the exit code that scripts and exec probes act on.

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// TestHostileStatusFakeDaemon: a server that is not the daemon (answering
// {}, null, [], a summary that counts nothing, or a redirect to a server
// with a good document) must give exit 3, "could not be asked", never 2,
// "the node is cut off", nor 0; and a daemon's document with C0, C1 and
// bidirectional controls in an upstream's address and error must reach the
// terminal escaped, as the table and as --json that still parses.
func TestHostileStatusFakeDaemon(t *testing.T) {
	healthy := upstreamStatus{Address: "10.0.0.1:6443", Sources: []string{"static"}, State: stateHealthy, Healthy: true}
	good := serveUpstreams(t, http.StatusOK, docJSON(t, newUpstreamsDoc(&config{HealthCheck: checkTCP}, []upstreamStatus{healthy})))
	redirect := httptest.NewServer(http.RedirectHandler("http://"+good+"/upstreams", http.StatusFound))
	t.Cleanup(redirect.Close)
	lying := newUpstreamsDoc(&config{HealthCheck: checkTCP}, []upstreamStatus{healthy})
	lying.Summary = upstreamsSummary{}
	fakes := map[string]string{
		"{}":                            serveUpstreams(t, http.StatusOK, "{}"),
		"null":                          serveUpstreams(t, http.StatusOK, "null"),
		"[]":                            serveUpstreams(t, http.StatusOK, "[]"),
		"a summary that counts nothing": serveUpstreams(t, http.StatusOK, docJSON(t, lying)),
		"a redirect":                    strings.TrimPrefix(redirect.URL, "http://"),
	}
	refused, exits := 0, map[string][]int{}
	for name, addr := range fakes {
		for _, extra := range [][]string{nil, {"--json"}} {
			out, err := runSub("status", append([]string{"--health-address", addr, "--env-file", ""}, extra...), nil)
			code := exitCode(err)
			exits[name] = append(exits[name], code)
			if code == statusUnknown && out == "" {
				refused++
				continue
			}
			t.Errorf("%s %v: exit %d (%v), output %q; want exit %d and no output", name, extra, code, err, out, statusUnknown)
		}
	}
	if _, err := runSub("status", []string{"--health-address", fakes["a redirect"]}, nil); err == nil ||
		!strings.Contains(err.Error(), "redirected to \"http://"+good+"/upstreams\"") {
		t.Errorf("redirect: got %v; want an error that says where it was redirected", err)
	}
	passed := statusControls(t)
	t.Logf("figures: %d of %d fake answers refused with exit 3 (exits table, --json: %v); unprintable characters reaching the terminal: table %d, --json %d",
		refused, 2*len(fakes), exits, passed[0], passed[1])
	if passed[0]+passed[1] != 0 {
		t.Errorf("unprintable characters in the output: table %d, --json %d; want none", passed[0], passed[1])
	}
}

// statusControls serves a daemon's document with controls in an upstream's
// address and error, runs status on it as a table and with --json, and
// returns how many unprintable characters each output held. The --json
// output must parse to the same document.
func statusControls(t *testing.T) [2]int {
	hostile := upstreamStatus{Address: "10.0.0.1:6443\u009b2J\x1b[31m", Sources: []string{"static"}, State: stateHealthy, Healthy: true,
		LastError: "refused\u009b31m\x1b]0;owned\x07\u202edeifsar\x7f"}
	doc := newUpstreamsDoc(&config{HealthCheck: checkTCP}, []upstreamStatus{hostile})
	addr := serveUpstreams(t, http.StatusOK, docJSON(t, doc))
	var passed [2]int
	for i, extra := range [][]string{nil, {"--json"}} {
		out, err := runSub("status", append([]string{"--health-address", addr, "--env-file", ""}, extra...), nil)
		if err != nil {
			t.Errorf("controls %v: got %v; want exit 0, the document is the daemon's", extra, err)
		}
		if !utf8.ValidString(out) {
			passed[i]++ // bytes a terminal may read as a C1 control
		}
		for _, r := range out {
			if !unicode.IsPrint(r) && r != '\n' && r != '\t' {
				passed[i]++
			}
		}
		if i == 1 {
			var got upstreamsDoc
			if err := json.Unmarshal([]byte(out), &got); err != nil || len(got.Upstreams) != 1 ||
				got.Upstreams[0].Address != hostile.Address || got.Upstreams[0].LastError != hostile.LastError {
				t.Errorf("--json: got %q (%v); want the document, escaped", out, err)
			}
		}
		t.Logf("%v: %q", extra, out)
	}
	return passed
}
