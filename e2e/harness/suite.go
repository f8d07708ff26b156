package harness

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/extractedprism/extractedprism/e2e/controlplane"
	"github.com/extractedprism/extractedprism/e2e/netns"
)

// SuiteOptions configure a Suite.
type SuiteOptions struct {
	Dir      string   // logs and scratch files; must exist
	Settings Settings // zero means DefaultSettings
	// Binary is a prebuilt extractedprism; empty builds it from Source.
	Binary string
	// Source is the extractedprism module; empty finds it above the
	// working directory.
	Source string
	Logf   func(format string, args ...any)
}

// Suite is a cluster plus a runner: what both the tests and cmd/report use.
type Suite struct {
	Runner  *Runner
	started time.Time
	daemon  string

	mu      sync.Mutex // guards results
	results []Result
}

// Preflight reports why the suite cannot run on this machine.
func Preflight() error {
	if err := netns.Available(); err != nil {
		return err
	}
	for _, tool := range []string{"nft", "ss", "systemd-socket-activate"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s is missing (apt-get install nftables iproute2 systemd)", tool)
		}
	}
	_, err := controlplane.DefaultBinaries()
	return err
}

// NewSuite builds the daemon (unless given) and starts the cluster.
func NewSuite(ctx context.Context, o SuiteOptions) (*Suite, error) {
	if o.Settings == (Settings{}) {
		o.Settings = DefaultSettings
	}
	logf := o.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	bins, err := controlplane.DefaultBinaries()
	if err != nil {
		return nil, err
	}
	// client-go logs every watch it cancels ("context canceled") through
	// klog on stderr; the harness reports what it needs itself.
	klog.SetOutput(io.Discard)
	klog.LogToStderr(false)
	s := &Suite{started: time.Now()}
	binary := o.Binary
	if binary == "" {
		src := o.Source
		if src == "" {
			wd, err := os.Getwd()
			if err != nil {
				return nil, err
			}
			if src, err = FindSource(wd); err != nil {
				return nil, err
			}
		}
		logf("building extractedprism from %s", src)
		if binary, err = BuildDaemon(ctx, src, o.Dir); err != nil {
			return nil, err
		}
		s.daemon = "built from " + sourceRevision(src)
	} else {
		s.daemon = binary
	}
	logf("starting the cluster in %s", o.Dir)
	t0 := time.Now()
	c, err := StartCluster(ctx, ClusterOptions{Dir: o.Dir, Binaries: bins, Logf: logf})
	if err != nil {
		return nil, err
	}
	logf("cluster up in %s", time.Since(t0).Round(100*time.Millisecond))
	s.Runner = &Runner{C: c, Binary: binary, Settings: o.Settings, Dir: o.Dir, Logf: logf}
	return s, nil
}

// sourceRevision describes the source tree: its git commit, and whether it
// has uncommitted changes.
func sourceRevision(src string) string {
	out, err := exec.Command("git", "-C", src, "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "source without git metadata"
	}
	rev := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "-C", src, "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(strings.TrimSpace(string(st))) > 0 {
		rev += " with uncommitted changes"
	}
	return "commit " + rev
}

// Run runs one row and keeps its result for the report.
func (s *Suite) Run(ctx context.Context, row Row) Result {
	res := s.Runner.Run(ctx, row)
	s.mu.Lock()
	s.results = append(s.results, res)
	s.mu.Unlock()
	return res
}

// Report returns the results so far.
func (s *Suite) Report() Report {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Report{
		Settings: s.Runner.Settings,
		Started:  s.started,
		Elapsed:  time.Since(s.started),
		Daemon:   s.daemon,
		Results:  append([]Result(nil), s.results...),
	}
}

// Close stops everything and removes the namespaces.
func (s *Suite) Close() {
	if s.Runner != nil {
		s.Runner.C.Close()
	}
}

// SelectRows filters rows by a comma-separated list of scenario names or
// row names ("kill", "kill/readyz-random"); empty keeps all.
func SelectRows(rows []Row, filter string) []Row {
	if strings.TrimSpace(filter) == "" {
		return rows
	}
	want := map[string]bool{}
	for _, f := range strings.Split(filter, ",") {
		want[strings.TrimSpace(f)] = true
	}
	var out []Row
	for _, r := range rows {
		if want[r.Scenario] || want[r.Name()] {
			out = append(out, r)
		}
	}
	return out
}
