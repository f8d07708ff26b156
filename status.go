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
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"
)

// upstreamStatus is what /upstreams shows of one upstream.
type upstreamStatus struct {
	Address       string     `json:"address"`
	Sources       []string   `json:"sources"`
	Healthy       bool       `json:"healthy"`
	FailStreak    int        `json:"fail_streak"`
	Ready         *bool      `json:"ready,omitempty"` // readyz mode, after the first probe
	ReadyPending  bool       `json:"ready_pending,omitempty"`
	AwaitingProbe bool       `json:"awaiting_probe,omitempty"` // ready, but avoided after a failed connect
	RTTSeconds    *float64   `json:"rtt_seconds,omitempty"`
	Tier          *int       `json:"tier,omitempty"` // latency mode
	Connections   int        `json:"connections"`
	Draining      bool       `json:"draining"`
	DrainDeadline *time.Time `json:"drain_deadline,omitempty"`
	LastCheck     *time.Time `json:"last_check,omitempty"`
	LastError     string     `json:"last_error,omitempty"`
	LastErrorAt   *time.Time `json:"last_error_at,omitempty"`
}

// describe returns the state of every upstream, ordered by address; sources
// maps addresses to the discovery sources that list them.
func (p *pool) describe(sources map[string][]string) []upstreamStatus {
	p.mu.Lock()
	defer p.unlock()
	out := make([]upstreamStatus, 0, len(p.upstreams))
	for _, u := range p.upstreams {
		st := upstreamStatus{
			Address: u.addr, Sources: append([]string{}, sources[u.addr]...), Healthy: u.healthy, FailStreak: u.failStreak,
			Connections: len(u.conns), Draining: u.draining,
			DrainDeadline: timePtr(u.drain.pending(), u.drainDeadline),
			LastCheck:     timePtr(!u.lastCheck.IsZero(), u.lastCheck),
		}
		if p.cfg.readyz && u.rd.known {
			st.Ready, st.ReadyPending, st.AwaitingProbe = new(u.rd.ready), u.rd.pending, u.rd.ready && u.rd.reprobe
		}
		if u.hasRTT {
			st.RTTSeconds = new(u.rtt.Seconds())
		}
		if u.hasTier {
			st.Tier = new(u.tier)
		}
		if u.lastErr != nil {
			st.LastError, st.LastErrorAt = displayText(u.lastErr.Error()), timePtr(true, u.lastErrAt)
		}
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b upstreamStatus) int { return cmp.Compare(a.Address, b.Address) })
	return out
}

func timePtr(set bool, t time.Time) *time.Time {
	if !set {
		return nil
	}
	return new(t.UTC())
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
func upstreamsHandler(describe func() []upstreamStatus) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(describe()) // a failed write means the client went away
	})
}

// status is the "extractedprism status" command: it asks the daemon's
// health server for /upstreams and prints the table, or the JSON with
// --json. The address comes from --health-address, else from
// EP_HEALTH_BIND_ADDRESS (or EP_BIND_ADDRESS) and EP_HEALTH_PORT, else
// 127.0.0.1:7446.
func status(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := flag.NewFlagSet("extractedprism status", flag.ContinueOnError)
	fs.SetOutput(stdout)
	addr := fs.String("health-address", defaultHealthAddress(getenv), "host:port of the daemon's health server")
	asJSON := fs.Bool("json", false, "print the JSON document instead of the table")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+*addr+"/upstreams", nil)
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status: %s answered %s", *addr, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	if *asJSON {
		_, err := stdout.Write(body)
		return err
	}
	var st []upstreamStatus
	if err := json.Unmarshal(body, &st); err != nil {
		return fmt.Errorf("status: %s/upstreams: %w", *addr, err)
	}
	return writeUpstreamTable(stdout, st)
}

func defaultHealthAddress(getenv func(string) string) string {
	host := cmp.Or(getenv("EP_HEALTH_BIND_ADDRESS"), getenv("EP_BIND_ADDRESS"), "127.0.0.1")
	return net.JoinHostPort(dialableHost(host), cmp.Or(getenv("EP_HEALTH_PORT"), "7446"))
}

// writeUpstreamTable renders st as an aligned table. The daemon has made
// the error text safe for a terminal (displayText); every cell is cleaned
// again here, as the document came over the network.
func writeUpstreamTable(w io.Writer, st []upstreamStatus) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "UPSTREAM\tSOURCES\tHEALTH\tSTREAK\tREADY\tRTT\tTIER\tCONNS\tDRAIN\tLAST CHECK\tLAST ERROR")
	for _, s := range st {
		row := []string{s.Address, strings.Join(s.Sources, ","), "unhealthy", strconv.Itoa(s.FailStreak), readyWord(s),
			"", "", strconv.Itoa(s.Connections), "", "", s.LastError}
		if s.Healthy {
			row[2] = "healthy"
		}
		if s.RTTSeconds != nil {
			row[5] = time.Duration(*s.RTTSeconds * float64(time.Second)).Round(10 * time.Microsecond).String()
		}
		if s.Tier != nil {
			row[6] = strconv.Itoa(*s.Tier)
		}
		switch {
		case s.Draining && s.DrainDeadline != nil:
			row[8] = "until " + s.DrainDeadline.Format(time.RFC3339)
		case s.Draining:
			row[8] = "draining"
		}
		if s.LastCheck != nil {
			row[9] = s.LastCheck.Format(time.RFC3339)
		}
		for i, cell := range row {
			row[i] = cmp.Or(displayText(cell), "-")
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	return tw.Flush()
}

func readyWord(s upstreamStatus) string {
	switch {
	case s.Ready == nil:
		return ""
	case s.ReadyPending:
		return "pending"
	case *s.Ready && s.AwaitingProbe:
		return "ready-awaiting-probe"
	case *s.Ready:
		return "ready"
	}
	return "not-ready"
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
