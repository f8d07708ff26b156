// Package e2e holds the end-to-end tests of extractedprism: a real
// three-node control plane in network namespaces, the daemon in front of
// it, a client workload and injected faults. See README.md.
package e2e

import (
	"context"
	"os"
	"testing"

	"github.com/extractedprism/extractedprism/e2e/harness"
)

// TestScenarios runs every row of harness.DefaultRows (filter with
// EP_E2E_ROWS, for example "steady,kill" or "kill/readyz-random"). A row
// whose mode the daemon refuses at start-up is skipped as "not built".
//
// Environment:
//
//	EP_E2E_REQUIRE=1      fail instead of skipping when the machine cannot run it
//	EP_E2E_ARTIFACTS=dir  keep logs there (default: the test's temp dir)
//	EP_E2E_REPORT=file    write the Markdown result table there
//	EP_E2E_EXTRACTEDPRISM use this daemon binary instead of building ../
func TestScenarios(t *testing.T) {
	if err := harness.Preflight(); err != nil {
		if os.Getenv("EP_E2E_REQUIRE") == "1" {
			t.Fatalf("end-to-end tests cannot run: %v", err)
		}
		t.Skipf("end-to-end tests skipped: %v", err)
	}
	dir := os.Getenv("EP_E2E_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := harness.NewSuite(ctx, harness.SuiteOptions{
		Dir:    dir,
		Binary: os.Getenv("EP_E2E_EXTRACTEDPRISM"),
		Logf:   t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)

	for _, row := range harness.SelectRows(harness.DefaultRows(), os.Getenv("EP_E2E_ROWS")) {
		t.Run(row.Name(), func(t *testing.T) {
			res := s.Run(ctx, row)
			for _, n := range res.Notes {
				t.Log(n)
			}
			switch res.Status {
			case harness.StatusNotBuilt:
				t.Skipf("not built: %s", res.Err)
			case harness.StatusError:
				t.Fatalf("could not run: %s", res.Err)
			}
			for _, f := range res.Failures {
				t.Error(f)
			}
		})
	}

	md := s.Report().Markdown()
	t.Log("\n" + md)
	if path := os.Getenv("EP_E2E_REPORT"); path != "" {
		if err := os.WriteFile(path, []byte(md), 0o644); err != nil {
			t.Error(err)
		}
	}
}
