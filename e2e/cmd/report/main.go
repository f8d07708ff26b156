// Command report runs the end-to-end scenarios and prints the result table
// as Markdown, with the settings used. It needs root, network namespaces,
// nftables and the binaries from e2e/build-binaries.sh.
//
//	go run ./cmd/report                      # every row, table on stdout
//	go run ./cmd/report -o RESULTS.md        # also write the file
//	go run ./cmd/report -rows steady,kill    # some scenarios (or row names)
//
// The exit status is 1 if a row failed or could not run; rows whose mode the
// daemon refuses ("not built") do not count as failures.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/extractedprism/extractedprism/e2e/harness"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("report", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("o", "", "also write the Markdown table to this file")
	rows := fs.String("rows", "", "comma-separated scenarios or row names (default: all)")
	artifacts := fs.String("artifacts", "", "directory for logs (default: a new temporary directory)")
	binary := fs.String("extractedprism", "", "prebuilt daemon binary (default: build the module above the working directory)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := harness.Preflight(); err != nil {
		return err
	}
	dir := *artifacts
	if dir == "" {
		d, err := os.MkdirTemp("", "ep-e2e-report-")
		if err != nil {
			return err
		}
		dir = d
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	logger := log.New(stderr, "", log.Ltime)
	logger.Printf("logs in %s", dir)
	s, err := harness.NewSuite(ctx, harness.SuiteOptions{Dir: dir, Binary: *binary, Logf: logger.Printf})
	if err != nil {
		return err
	}
	defer s.Close()

	failed := 0
	for _, row := range harness.SelectRows(harness.DefaultRows(), *rows) {
		if ctx.Err() != nil {
			break
		}
		logger.Printf("row %s", row.Name())
		res := s.Run(ctx, row)
		logger.Printf("row %s: %s %s", row.Name(), res.Status, res.Err)
		if res.Status == harness.StatusFail || res.Status == harness.StatusError {
			failed++
		}
	}
	md := s.Report().Markdown()
	fmt.Fprint(stdout, md)
	if *out != "" {
		if err := os.WriteFile(*out, []byte(md), 0o644); err != nil {
			return err
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d rows failed or could not run; logs in %s", failed, dir)
	}
	return ctx.Err()
}
