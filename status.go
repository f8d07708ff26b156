package main

// Beyond the spec: /upstreams, the state of every upstream as JSON, and
// "extractedprism status", which renders it as a table for an operator on
// the node.

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// upstreamsDoc is the /upstreams document. It is an object, so that it can
// grow without breaking the scripts that read it.
type upstreamsDoc struct {
	Version           string           `json:"version"`
	HealthCheck       string           `json:"health_check"`
	UpstreamSelection string           `json:"upstream_selection"`
	Summary           upstreamsSummary `json:"summary"`
	Upstreams         []upstreamStatus `json:"upstreams"`
}

// upstreamsSummary counts the upstreams. Usable ones (healthy, not
// draining) can take new connections; with readyz, ready ones are
// preferred among them.
type upstreamsSummary struct {
	Total   int  `json:"total"`
	Usable  int  `json:"usable"`
	Healthy int  `json:"healthy"`
	Ready   *int `json:"ready,omitempty"` // readyz only
}

// newUpstreamsDoc builds the document of the upstreams st for cfg.
func newUpstreamsDoc(cfg *config, st []upstreamStatus) upstreamsDoc {
	return upstreamsDoc{Version: versionLine(), HealthCheck: cfg.HealthCheck, UpstreamSelection: cfg.UpstreamSelection,
		Summary: summarize(st, cfg.HealthCheck == checkReadyz), Upstreams: st}
}

// summarize counts the upstreams st; ready ones only with readyz.
func summarize(st []upstreamStatus, readyz bool) upstreamsSummary {
	sum := upstreamsSummary{Total: len(st)}
	if readyz {
		sum.Ready = new(0)
	}
	for _, u := range st {
		if u.Healthy {
			sum.Healthy++
		}
		if u.Healthy && !u.Draining {
			sum.Usable++
		}
		if sum.Ready != nil && u.State == stateReady {
			*sum.Ready++
		}
	}
	return sum
}

// upstreamStatus is what /upstreams shows of one upstream.
type upstreamStatus struct {
	Address       string     `json:"address"`
	Sources       []string   `json:"sources"`
	State         string     `json:"state"` // see state.word
	StateSince    *time.Time `json:"state_since,omitempty"`
	Healthy       bool       `json:"healthy"`
	FailStreak    int        `json:"fail_streak"`
	Ready         *bool      `json:"ready,omitempty"` // readyz mode, after the first probe
	ReadyPending  bool       `json:"ready_pending,omitempty"`
	AwaitingProbe bool       `json:"awaiting_probe,omitempty"` // ready, but avoided after a failed probe or connect
	RTTSeconds    *float64   `json:"rtt_seconds,omitempty"`
	Tier          *int       `json:"tier,omitempty"` // latency mode
	Connections   int        `json:"connections"`
	// LongLived counts the connections pool.longLived counts, which
	// the rebalancer spreads (see rebalance.go).
	LongLived     int        `json:"long_lived_connections"`
	Draining      bool       `json:"draining"`
	DrainDeadline *time.Time `json:"drain_deadline,omitempty"`
	LastCheck     *time.Time `json:"last_check,omitempty"`
	// The last failed check, dial or probe, only while no check has
	// passed whole since: an error the upstream has recovered from is
	// history, which the log and the metrics keep.
	LastError   string     `json:"last_error,omitempty"`
	LastErrorAt *time.Time `json:"last_error_at,omitempty"`
}

// describe returns the state of every upstream, ordered by address; sources
// maps addresses to the discovery sources that list them.
func (p *pool) describe(sources map[string][]string) []upstreamStatus {
	p.mu.Lock()
	defer p.unlock()
	now := time.Now()
	out := make([]upstreamStatus, 0, len(p.upstreams))
	for _, u := range p.upstreams {
		st := upstreamStatus{
			Address: u.addr, Sources: append([]string{}, sources[u.addr]...),
			State: u.h.state.word(), StateSince: ptrIf(!u.shownSince.IsZero(), u.shownSince.UTC()),
			Healthy: u.h.healthy(), FailStreak: u.h.fails,
			RTTSeconds: ptrIf(u.hasRTT, u.rtt.Seconds()), Tier: ptrIf(u.hasTier, u.tier),
			Connections: len(u.conns), LongLived: len(p.longLived(u, now, lookAt)),
			Draining: u.h.state == upDraining, DrainDeadline: ptrIf(u.drain.pending(), u.shownSince.Add(p.cfg.drainTimeout).UTC()),
			LastCheck: ptrIf(!u.lastCheck.IsZero(), u.lastCheck.UTC()),
		}
		if b := u.h.base(); p.cfg.readyz && u.h.probed {
			st.Ready, st.ReadyPending, st.AwaitingProbe = new(u.h.ready()), b == upPending || b == upUnhealthy, b == upAwaitingProbe || u.h.slow
		}
		if u.lastErr != nil && !u.lastErrAt.Before(u.lastGood) {
			st.LastError, st.LastErrorAt = displayText(u.lastErr.Error()), new(u.lastErrAt.UTC())
		}
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b upstreamStatus) int { return cmp.Compare(a.Address, b.Address) })
	return out
}

// ptrIf returns a pointer to v if set, else nil: a field the JSON leaves out.
func ptrIf[T any](set bool, v T) *T {
	if !set {
		return nil
	}
	return &v
}

// maxErrorText bounds the error text /upstreams shows for an upstream.
const maxErrorText = 512

// displayText returns s fit for a terminal: cut to maxErrorText bytes, and
// every character that is not printable, such as a newline or a terminal's
// escape, replaced by U+FFFD. An error's text can carry what a peer chose,
// such as the names in its certificate.
func displayText(s string) string {
	cut := cutText(s, maxErrorText)
	out := strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return utf8.RuneError
	}, cut)
	if len(cut) < len(s) {
		out += "..."
	}
	return out
}

// upstreamsHandler serves /upstreams as JSON.
func upstreamsHandler(describe func() upstreamsDoc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(describe()) // a failed write means the client went away
	})
}

// The exit codes of status, for scripts and exec probes.
const (
	statusGood     = 0 // every upstream healthy and, with readyz, ready
	statusDegraded = 1 // some upstream is not, or drains, but one is usable
	statusNone     = 2 // no upstream usable: the node is cut off from the API
	statusUnknown  = 3 // the daemon could not be asked
)

// defaultEnvFile is the systemd example's EnvironmentFile, where status
// finds the health server's address when the environment does not say.
const defaultEnvFile = "/etc/extractedprism/extractedprism.env"

// exitError is an error with the exit code the process ends with.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// exitCode returns the exit code for err: 0 for nil, an exitError's, else 1.
func exitCode(err error) int {
	if err == nil {
		return 0
	}
	if e, ok := errors.AsType[*exitError](err); ok {
		return e.code
	}
	return 1
}

// status is the "extractedprism status" command: it asks the daemon's
// health server for /upstreams, prints the summary and the table (or the
// JSON with --json) and exits with one of the status codes.
func status(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	addr, asJSON, err := parseStatusFlags(args, getenv, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return &exitError{statusUnknown, fmt.Errorf("status: %w", err)}
	}
	body, err := fetchUpstreams(ctx, addr)
	if err != nil {
		return &exitError{statusUnknown, fmt.Errorf("status: %w", err)}
	}
	var doc upstreamsDoc
	if err := json.Unmarshal(body, &doc); err != nil {
		return &exitError{statusUnknown, fmt.Errorf("status: %s/upstreams: %w", addr, err)}
	}
	if err := checkDoc(doc); err != nil {
		return &exitError{statusUnknown, fmt.Errorf("status: %s/upstreams is not the daemon's document: %w", addr, err)}
	}
	if asJSON {
		_, err = stdout.Write(escapeJSON(body))
	} else {
		err = writeStatus(stdout, doc, time.Now())
	}
	if err != nil {
		return &exitError{statusUnknown, fmt.Errorf("status: %w", err)}
	}
	return verdict(doc)
}

// parseStatusFlags returns the health server's address and --json. The
// address comes from --health-address, else from EP_HEALTH_BIND_ADDRESS
// (or EP_BIND_ADDRESS) and EP_HEALTH_PORT in the environment, else in the
// --env-file, else 127.0.0.1:7446: wherever the daemon was configured,
// with a wildcard address dialled on loopback.
func parseStatusFlags(args []string, getenv func(string) string, out io.Writer) (string, bool, error) {
	set := flag.NewFlagSet("extractedprism status", flag.ContinueOnError)
	set.SetOutput(io.Discard)
	addr := set.String("health-address", "", "`host:port` of the daemon's health server (default: from EP_HEALTH_BIND_ADDRESS or EP_BIND_ADDRESS and EP_HEALTH_PORT, in the environment or else the --env-file; else 127.0.0.1:7446)")
	envFile := set.String("env-file", defaultEnvFile, "systemd EnvironmentFile of the daemon, read for its EP_ variables if it exists; empty for none")
	asJSON := set.Bool("json", false, "Print the /upstreams JSON document instead of the table")
	if err := set.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(out, "Usage: extractedprism status [flags]\n\nPrints the upstreams of a running daemon, from its /upstreams endpoint.\n"+
				"Exit status: 0 every upstream usable (and ready, with readyz), 1 degraded,\n"+
				"2 no upstream usable, 3 the daemon could not be asked.\n\n")
			set.VisitAll(func(f *flag.Flag) { fmt.Fprintln(out, usageText(f, "")) })
		}
		return "", false, err
	}
	if set.NArg() > 0 {
		return "", false, fmt.Errorf("unexpected argument %q", set.Arg(0))
	}
	if *addr != "" {
		return *addr, *asJSON, nil
	}
	// No file, or the default one missing, is no variables.
	file, err := readEnvFile(*envFile)
	if err != nil && *envFile != "" && (*envFile != defaultEnvFile || !errors.Is(err, fs.ErrNotExist)) {
		return "", false, fmt.Errorf("--env-file: %w", err)
	}
	lookup := func(k string) string { return cmp.Or(getenv(k), file[k]) }
	host := cmp.Or(lookup("EP_HEALTH_BIND_ADDRESS"), lookup("EP_BIND_ADDRESS"), "127.0.0.1")
	return net.JoinHostPort(dialableHost(host), cmp.Or(lookup("EP_HEALTH_PORT"), "7446")), *asJSON, nil
}

// readEnvFile returns the EP_ variables of a systemd EnvironmentFile:
// KEY=VALUE lines, with # or ; comments and optional quotes. A missing
// file has none; with any other error they are not to be used.
func readEnvFile(path string) (map[string]string, error) {
	data, err := readFileAtMost(path, 1<<20)
	vars := map[string]string{}
	for line := range strings.Lines(string(data)) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] {
			v = v[1 : len(v)-1]
		}
		if ok && strings.HasPrefix(k, "EP_") {
			vars[k] = v
		}
	}
	return vars, err
}

// fetchUpstreams returns the body of GET /upstreams from addr.
func fetchUpstreams(ctx context.Context, addr string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// The address is the operator's: a flag, the daemon's variables or its
	// EnvironmentFile, which only root writes.
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/upstreams", nil) //nolint:gosec // see above
	if err != nil {
		return nil, err
	}
	// The daemon's own server, asked directly: no proxy from the
	// environment, and no redirect followed, as the daemon sends none. A
	// server that redirects is not it, and what answers elsewhere says
	// nothing of this node.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req) //nolint:gosec // see above
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 == 3 {
		return nil, fmt.Errorf("%s answered %s, redirected to %q; the daemon redirects nowhere, so this is not it",
			addr, displayText(resp.Status), displayText(resp.Header.Get("Location")))
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s answered %s", addr, displayText(resp.Status))
	}
	return io.ReadAll(io.LimitReader(resp.Body, 1<<20))
}

// checkDoc returns what is wrong with doc as a daemon's /upstreams: a
// version, a health check the daemon knows, the list of upstreams, each in
// a state it knows, and the summary that counts them. Without it, a
// server that answers {} or null, not the daemon, read as a node cut off
// from the API (exit 2) instead of a daemon that could not be asked (3).
func checkDoc(doc upstreamsDoc) error {
	switch {
	case doc.Version == "":
		return errors.New("no version")
	case doc.HealthCheck != checkTCP && doc.HealthCheck != checkReadyz:
		return fmt.Errorf("health_check %q; want %s or %s", displayText(doc.HealthCheck), checkTCP, checkReadyz)
	case doc.Upstreams == nil:
		return errors.New("no upstreams list")
	}
	for _, u := range doc.Upstreams {
		if !slices.Contains([]string{stateDraining, stateUnhealthy, statePending, stateNotReady, stateReady, stateHealthy}, u.State) {
			return fmt.Errorf("upstream %q in the unknown state %q", displayText(u.Address), displayText(u.State))
		}
	}
	if want := summarize(doc.Upstreams, doc.HealthCheck == checkReadyz); !reflect.DeepEqual(doc.Summary, want) {
		return fmt.Errorf("the summary does not count the %d upstreams listed", len(doc.Upstreams))
	}
	return nil
}

// escapeJSON returns body, a valid JSON document, with every character a
// terminal could act on written as a \u escape: a document the same to a
// JSON reader, safe to print. encoding/json escapes C0 controls but passes
// C1 ones (U+009B, a terminal's CSI), bidirectional overrides and invalid
// UTF-8 through. Valid JSON holds these only inside strings, but for the
// whitespace \r, which becomes a space.
func escapeJSON(body []byte) []byte {
	out := make([]byte, 0, len(body))
	for len(body) > 0 {
		r, n := utf8.DecodeRune(body)
		switch {
		case r == '\r':
			out = append(out, ' ')
		// An invalid byte decodes as U+FFFD, printable, of width 1: it is
		// escaped as that character.
		case r == '\n' || r == '\t' || unicode.IsPrint(r) && (r != utf8.RuneError || n > 1):
			out = append(out, body[:n]...)
		default:
			for _, u := range utf16.Encode([]rune{r}) {
				out = fmt.Appendf(out, `\u%04x`, u)
			}
		}
		body = body[n:]
	}
	return out
}

// verdict returns nil when every upstream is in its good state, else the
// exitError of a degraded node or of one with no usable upstream.
func verdict(doc upstreamsDoc) error {
	if doc.Summary.Usable == 0 {
		return &exitError{statusNone, fmt.Errorf("status: no upstream usable of %d", doc.Summary.Total)}
	}
	for _, u := range doc.Upstreams {
		if u.State != stateHealthy && u.State != stateReady {
			return &exitError{statusDegraded, fmt.Errorf("status: degraded: %s is %s", displayText(u.Address), displayText(u.State))}
		}
	}
	return nil
}

// writeStatus renders doc: a summary line, then a table of the upstreams
// with their ages from now. The daemon has made the error text safe for a
// terminal (displayText); every cell is cleaned again here, as the
// document came over the network.
func writeStatus(w io.Writer, doc upstreamsDoc, now time.Time) error {
	sum := doc.Summary
	counts := fmt.Sprintf("%d healthy", sum.Healthy)
	if sum.Ready != nil {
		counts += fmt.Sprintf(", %d ready", *sum.Ready)
	}
	fmt.Fprintln(w, displayText(fmt.Sprintf("%s: %d of %d upstreams usable (%s); health check %s, selection %s",
		doc.Version, sum.Usable, sum.Total, counts, doc.HealthCheck, doc.UpstreamSelection)))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "UPSTREAM\tSOURCES\tSTATE\tFOR\tSTREAK\tRTT\tTIER\tCONNS\tLONG\tDRAIN\tLAST CHECK\tLAST ERROR")
	for _, s := range doc.Upstreams {
		fmt.Fprintln(tw, strings.Join(tableRow(s, now), "\t"))
	}
	return tw.Flush()
}

// tableRow returns the cells of s's row, a dash for each empty one.
func tableRow(s upstreamStatus, now time.Time) []string {
	row := []string{s.Address, strings.Join(s.Sources, ","), s.State, age(now, s.StateSince, ""), strconv.Itoa(s.FailStreak),
		"", "", strconv.Itoa(s.Connections), strconv.Itoa(s.LongLived), "", age(now, s.LastCheck, " ago"), s.LastError}
	if s.State == stateReady && s.AwaitingProbe { // avoided after a failed probe or connect
		row[2] = "ready-awaiting-probe"
	}
	if s.RTTSeconds != nil {
		row[5] = time.Duration(*s.RTTSeconds * float64(time.Second)).Round(10 * time.Microsecond).String()
	}
	if s.Tier != nil {
		row[6] = strconv.Itoa(*s.Tier)
	}
	switch {
	case s.Draining && s.DrainDeadline != nil:
		row[9] = "ends in " + max(s.DrainDeadline.Sub(now), 0).Round(time.Second).String()
	case s.Draining:
		row[9] = "draining"
	}
	if s.LastError != "" && s.LastErrorAt != nil {
		row[11] += " (" + age(now, s.LastErrorAt, " ago") + ")"
	}
	for i, cell := range row {
		row[i] = cmp.Or(displayText(cell), "-")
	}
	return row
}

// age returns how long before now t was, to the second, then suffix; ""
// without t.
func age(now time.Time, t *time.Time, suffix string) string {
	if t == nil {
		return ""
	}
	return max(now.Sub(*t), 0).Round(time.Second).String() + suffix
}

// dialableHost maps a wildcard address to the loopback of its family.
func dialableHost(host string) string {
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		if ip.To4() != nil {
			return "127.0.0.1"
		}
		return "::1"
	}
	return host
}

// The states /upstreams shows, worst first: an upstream is draining,
// unhealthy (its TCP checks fail), with readyz pending (no probe has
// passed since it was added or came back) or not-ready, else ready, or
// healthy without readyz.
const (
	stateDraining  = "draining"
	stateUnhealthy = "unhealthy"
	statePending   = "pending"
	stateNotReady  = "not-ready"
	stateReady     = "ready"
	stateHealthy   = "healthy"
)
